package nodecachetest

import (
	"net"
	"testing"
	"time"
)

// FreeAddr returns a loopback address ("127.0.0.1:<port>") whose port was free a moment ago:
// for a process the test starts, or as an address where nothing listens.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Within runs f and returns what it returns, failing t when f has not returned after d: what
// says what was awaited ("serve after SIGTERM"). For what must never block (a FIFO, a process
// told to stop); f is left running when t fails.
func Within[T any](t testing.TB, d time.Duration, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(d):
		t.Fatalf("%s: still running after %s", what, d)
		panic("unreachable")
	}
}
