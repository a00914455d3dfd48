package mirror

import (
	"encoding/json"
	"net/http"

	"github.com/nodecache/nodecache/pkg/mirrorapi"
)

// apiError is an error answer in the OCI distribution-spec error format
// ({"errors":[{"code","message"}]}, spec section "Error Codes").
type apiError struct {
	Status  int
	Code    string
	Message string
}

func errNotFound(code, msg string) *apiError {
	return &apiError{Status: http.StatusNotFound, Code: code, Message: msg}
}

// errNoRoute is the answer for a path outside the grammar of distribution's routes (a
// repository name, tag or digest its router does not match): distribution's router answers it
// before any handler, with net/http's plain "404 page not found" and no OCI error code, and so
// does nodecache. why is for the logs only.
func errNoRoute(why string) *apiError {
	return &apiError{Status: http.StatusNotFound, Message: why}
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func (e *apiError) write(w http.ResponseWriter) {
	if e.Code == "" {
		http.NotFound(w, nil)
		return
	}
	body, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"code": e.Code, "message": e.Message}}})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	w.Header().Set(mirrorapi.HeaderErrorCode, e.Code)
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(body, '\n'))
}
