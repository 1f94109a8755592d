package tasks_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/tasks"
)

// One lock duration default: the daemon's EXTWORKER_LOCK_DURATION, whose default its
// envconfig tag must spell out, is tasks.DefaultLockDuration, what a Registry uses.
func TestOneDefaultLockDuration(t *testing.T) {
	f, ok := reflect.TypeFor[daemon.Config]().FieldByName("LockDuration")
	require.True(t, ok)
	require.Equal(t, "LOCK_DURATION", f.Tag.Get("envconfig"))
	d, err := time.ParseDuration(f.Tag.Get("default"))
	require.NoError(t, err)
	assert.Equal(t, tasks.DefaultLockDuration, d)
	assert.Equal(t, tasks.DefaultLockDuration, tasks.TopicOptions{}.WithDefaults().LockDuration)
}
