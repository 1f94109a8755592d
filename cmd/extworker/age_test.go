package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The command prints an age short, as the console does: "26m ago", not "26m0s ago".
func TestAges(t *testing.T) {
	now := time.Now()
	for d, want := range map[time.Duration]string{
		12*time.Second + 300*time.Millisecond: "12s ago", 26 * time.Minute: "26m ago", 90 * time.Second: "1m30s ago",
		2*time.Hour + 5*time.Minute: "2h5m ago", 5 * time.Hour: "5h ago", 3 * 24 * time.Hour: "3d ago", 74 * time.Hour: "3d2h ago",
		0: "just now",
	} {
		assert.Equal(t, want, ageOf(now, now.Add(-d)), d.String())
	}
}
