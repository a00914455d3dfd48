package peer

import (
	"encoding/json"
	"net/http"
	"time"
)

// IDPath is the path of the peer port that announces the instance id: GET, signed (Keys.Sign);
// answered 200 {"id": "<id>"} with Content-Type application/json.
const IDPath = "/nodecache/v1/peer"

// idAnswer is the body of IDPath's answer.
type idAnswer struct {
	ID string `json:"id"`
}

// IDHandler answers IDPath for the instance self: the request's proof is verified with keys
// (against now()) first, and a failure answers 401 with an OCI-style error body
// ({"errors":[{"code":"UNAUTHORIZED","message":...}]}, the distribution spec's "Error Codes"),
// its message saying which part of the proof failed. A method other than GET is 405 (Allow: GET),
// any other path 404, both after the proof.
func IDHandler(self string, keys *Keys, now func() time.Time) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := keys.Verify(r, now()); err != nil {
			writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", err.Error())
			return
		}
		if r.URL.Path != IDPath {
			writeError(w, http.StatusNotFound, "NOT_FOUND", "no such peer path: "+r.URL.Path)
			return
		}
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", r.Method+" is not supported; want GET")
			return
		}
		body, _ := json.Marshal(idAnswer{ID: self})
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(body, '\n'))
	})
}

// writeError writes an error answer in the OCI distribution-spec error format.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	body, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
