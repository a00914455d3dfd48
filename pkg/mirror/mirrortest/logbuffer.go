package mirrortest

import (
	"bytes"
	"sync"
)

// LogBuffer is a log sink that concurrent writers (a server's goroutines, a child process's
// stdout and stderr) may write while the test reads it. The zero value is ready to use.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Bytes returns a copy of everything written so far.
func (l *LogBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}
