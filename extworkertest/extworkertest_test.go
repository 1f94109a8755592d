package extworkertest_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/extworkertest"
	"github.com/extworker/extworker/tasks"
)

// captureTB is the test, with what Start writes to its log kept too.
type captureTB struct {
	testing.TB
	mu    sync.Mutex
	lines []string
}

func (c *captureTB) Log(args ...any) {
	c.mu.Lock()
	for _, a := range args {
		if s, ok := a.(string); ok {
			c.lines = append(c.lines, s)
		}
	}
	c.mu.Unlock()
	c.TB.Log(args...)
}

func (c *captureTB) has(s string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// Start's default logger writes info records to the test's log ("worker started"), and
// honours EXTWORKER_LOG_LEVEL: it wrote only warnings and errors, whatever the variable.
func TestStartLogsAtInfoAndHonoursTheLogLevel(t *testing.T) {
	for _, tc := range []struct {
		level string
		debug bool
	}{{"", false}, {"debug", true}} {
		t.Run("EXTWORKER_LOG_LEVEL="+tc.level, func(t *testing.T) {
			t.Setenv("EXTWORKER_LOG_LEVEL", tc.level)
			if tc.level == "" {
				os.Unsetenv("EXTWORKER_LOG_LEVEL") // restored by Setenv's cleanup
			}
			c := &captureTB{TB: t}
			app := extworkertest.Start(c, extworker.Options{}, func(app *extworker.App) error {
				return app.Handle(extworkertest.Unique("log-level"), func(ctx context.Context, tk *tasks.Task) (camunda7.Variables, error) {
					return nil, nil
				}, tasks.TopicOptions{})
			})
			if got := app.Logger().Enabled(context.Background(), slog.LevelDebug); got != tc.debug {
				t.Errorf("debug records enabled: %v, want %v", got, tc.debug)
			}
			deadline := time.Now().Add(30 * time.Second)
			for !c.has(`msg="worker started"`) {
				if time.Now().After(deadline) {
					t.Fatalf("no \"worker started\" in the test's log within 30s; it has %q", c.lines)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
