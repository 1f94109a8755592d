package lockext_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/lockext"
)

// goneLocker stands in for *camunda7.Client with an engine on which the task has been
// cancelled (its process instance deleted).
type goneLocker struct{}

func (goneLocker) ExtendLock(_ context.Context, taskID, _ string, _ time.Duration) error {
	return fmt.Errorf("extend lock of external task %s: %w", taskID, camunda7.ErrTaskGone)
}

func (goneLocker) Lock(_ context.Context, taskID, _ string, _ time.Duration) error {
	return fmt.Errorf("lock external task %s: %w", taskID, camunda7.ErrTaskGone)
}

// A handler runs with the extender's context and learns through it, with a cause, that
// its task is gone.
func Example() {
	grantedAt := time.Now() // when the fetchAndLock request was sent
	ext, err := lockext.Start(context.Background(), goneLocker{},
		lockext.Task{ID: "task-1", WorkerID: "worker-1", GrantedAt: grantedAt},
		lockext.Config{LockDuration: 3 * time.Second, Interval: 10 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	defer ext.Stop()

	handler := func(ctx context.Context) error {
		<-ctx.Done() // a long computation, checking ctx
		return context.Cause(ctx)
	}
	err = handler(ext.Context())

	var lost *lockext.LockLostError
	fmt.Println("lock lost:", errors.Is(err, camunda7.ErrLockLost))
	fmt.Println("task gone:", errors.Is(err, camunda7.ErrTaskGone))
	fmt.Println("engine said so:", errors.As(err, &lost) && lost.Err != nil)
	// Output:
	// lock lost: true
	// task gone: true
	// engine said so: true
}
