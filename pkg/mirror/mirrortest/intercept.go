package mirrortest

import (
	"net/http"
	"strings"
	"time"
)

// Intercept sends the requests whose method is method ("": any) and whose path contains part
// ("": any) to fn instead of the registry; fn may hand one on to the registry, next. Other
// requests reach the registry. It replaces what Wrap installed.
func (r *Registry) Intercept(method, part string, fn func(next http.Handler, w http.ResponseWriter, req *http.Request)) {
	r.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if (method == "" || req.Method == method) && strings.Contains(req.URL.Path, part) {
				fn(next, w, req)
				return
			}
			next.ServeHTTP(w, req)
		})
	})
}

// SlowWriter delays every Write by Delay, so a response takes a while to stream.
type SlowWriter struct {
	http.ResponseWriter
	Delay time.Duration
}

// Write sleeps Delay, then writes p.
func (s SlowWriter) Write(p []byte) (int, error) {
	time.Sleep(s.Delay)
	return s.ResponseWriter.Write(p)
}

// SlowBlobs makes r stream the body of every blob GET through a SlowWriter of delay (other
// requests are answered as usual). It replaces what Wrap installed.
func (r *Registry) SlowBlobs(delay time.Duration) {
	r.Intercept(http.MethodGet, "/blobs/sha256:", func(next http.Handler, w http.ResponseWriter, req *http.Request) {
		next.ServeHTTP(SlowWriter{w, delay}, req)
	})
}
