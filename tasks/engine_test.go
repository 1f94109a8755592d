package tasks_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/lockext"
	"github.com/extworker/extworker/tasks"
	"github.com/extworker/extworker/tasks/taskstest"
)

// The engine a worker talks to is an interface: the production client and the
// in-memory engine of taskstest both satisfy it, and the lock extension's Locker is part
// of it rather than a second definition.
var (
	_ tasks.Engine   = (*camunda7.Client)(nil)
	_ tasks.Engine   = (*taskstest.Engine)(nil)
	_ lockext.Locker = tasks.Engine(nil)
)

// New takes any Engine, and refuses a nil one, a nil *camunda7.Client included.
func TestNewTakesAnEngine(t *testing.T) {
	reg := tasks.NewRegistry()
	require.NoError(t, reg.Register("t", func(_ context.Context, _ *tasks.Task) (camunda7.Variables, error) { return nil, nil }, tasks.TopicOptions{}))
	c, err := camunda7.New(camunda7.Config{})
	require.NoError(t, err)
	_, err = tasks.New(c, reg, tasks.Config{})
	assert.NoError(t, err)
	_, err = tasks.New(taskstest.NewEngine(), reg, tasks.Config{})
	assert.NoError(t, err)
	_, err = tasks.New(nil, reg, tasks.Config{})
	assert.ErrorContains(t, err, "engine client")
	var nilClient *camunda7.Client
	_, err = tasks.New(nilClient, reg, tasks.Config{})
	assert.ErrorContains(t, err, "engine client")
}
