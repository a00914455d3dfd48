package mirror

import (
	"encoding/json"
	"net/http"
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

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func (e *apiError) write(w http.ResponseWriter) {
	body, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"code": e.Code, "message": e.Message}}})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(body, '\n'))
}
