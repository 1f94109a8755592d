package testenv

import (
	"bytes"
	"os/exec"
	"sync"
	"testing"
)

// Buffer is a bytes.Buffer safe for concurrent writers (loggers, child processes) and a
// reading test.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Bytes returns a copy of what was written so far.
func (s *Buffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// Promtool returns the path of promtool (installed by `make up` through
// services/tools-up.sh): missing, it fails the test in CI and skips it elsewhere.
func Promtool(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		unavailable(t, "promtool (services/tools-up.sh installs it)", err)
	}
	return p
}
