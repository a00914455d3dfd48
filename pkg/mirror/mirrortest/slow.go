package mirrortest

import (
	"net/http"
	"strings"
	"time"
)

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
	r.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
				w = SlowWriter{w, delay}
			}
			next.ServeHTTP(w, req)
		})
	})
}
