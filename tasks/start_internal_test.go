package tasks

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/lockext"
)

func TestStartFailureLevel(t *testing.T) {
	cases := []struct {
		err  error
		want slog.Level
	}{
		{lockext.ErrClosed, slog.LevelInfo},
		{fmt.Errorf("start: %w", lockext.ErrClosed), slog.LevelInfo},
		{errors.New("lockext config: LockDuration 0s: must be at least 1ms"), slog.LevelError},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, startFailureLevel(tc.err), "%v", tc.err)
	}
}
