package daemon_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
)

// JSON logs write durations as Go writes them ("20s"), not in nanoseconds, also inside
// groups and in attributes a logger was made With.
func TestJSONLogDurations(t *testing.T) {
	var buf bytes.Buffer
	logger := daemon.NewLogger(daemon.Config{LogFormat: "json", LogLevel: "info"}, &buf).With("lock", 90*time.Second)
	logger.Info("started", "long_poll", 20*time.Second, slog.Group("retry", "backoff", 1500*time.Millisecond), "count", 3)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &rec), buf.String())
	assert.Equal(t, "20s", rec["long_poll"])
	assert.Equal(t, "1m30s", rec["lock"])
	assert.Equal(t, map[string]any{"backoff": "1.5s"}, rec["retry"])
	assert.Equal(t, 3.0, rec["count"], "other numbers stay numbers")
}

// EXTWORKER_LOG_FORMAT=text writes no ANSI colours into what is not a terminal: a file
// or a pipe's buffer.
func TestTextLogNoColoursOffTerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "worker.log"))
	require.NoError(t, err)
	defer f.Close()
	var buf bytes.Buffer
	for _, w := range []interface{ Write([]byte) (int, error) }{f, &buf} {
		logger := daemon.NewLogger(daemon.Config{LogFormat: "text", LogLevel: "info"}, w)
		logger.Warn("engine slow", "long_poll", 20*time.Second)
		logger.Error("engine gone", "error", "connection refused")
	}
	written, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	for name, out := range map[string]string{"file": string(written), "buffer": buf.String()} {
		assert.Contains(t, out, "engine gone", name)
		assert.Contains(t, out, "long_poll=20s", name)
		assert.NotContains(t, out, "\x1b[", "%s: no escape sequences", name)
	}
}

// Text logs escape control characters in process data (a business key, an error's
// text, a value a logger was made With): none reaches the terminal raw.
func TestTextLogEscapesControlCharacters(t *testing.T) {
	var buf bytes.Buffer
	logger := daemon.NewLogger(daemon.Config{LogFormat: "text", LogLevel: "info"}, &buf).With("worker", "w\x1b]0;title\a")
	logger.Info("task\x1b[2J done", "business_key", "bk\x1b[31mRED", slog.Group("effect", "idempotency_key", "k\x1b[0m\nforged line"),
		"error", errors.New("engine said \x1b[1mno"), "n", 3)
	out := buf.String()
	assert.NotContains(t, out, "\x1b")
	assert.NotContains(t, out, "\a")
	assert.Equal(t, 1, strings.Count(out, "\n"), "one record, one line: %s", out)
	// (tint quotes a value with a space as Go does, doubling the escapes' backslashes.)
	for _, want := range []string{`bk\x1b[31mRED`, `x1b[0m`, `nforged line`, `engine said `, `x1b[1mno`, `w\x1b]0;title\a`, `task\x1b[2J done`} {
		assert.Contains(t, out, want)
	}
}
