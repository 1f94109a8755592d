package lockext_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/lockext"
)

// tomcat404 is the page Tomcat serves for /engine-rest/... while the REST web app is
// being redeployed: a 404 that is not the engine's answer about any task.
const tomcat404 = `<!doctype html><html lang="en"><head><title>HTTP Status 404 – Not Found</title></head><body>` +
	`<h1>HTTP Status 404 – Not Found</h1><hr class="line" /><p><b>Type</b> Status Report</p><p><b>Description</b> The origin ` +
	`server did not find a current representation for the target resource or is not willing to disclose that one exists.</p>` +
	`<hr class="line" /><h3>Apache Tomcat/9.0.83</h3></body></html>`

// An HTML 404 answered to extendLock while the engine's web app is being redeployed
// used to count as "task gone": the handler's context was cancelled and its result
// thrown away. It is a transient failure now: the extension is sent again, the
// handler's context lives on, and the lock is kept. Only the engine's own answer that
// the task does not exist (here: its instance deleted) ends it.
func TestForeign404ToExtendLockIsRetried(t *testing.T) {
	e := newEngineEnv(t)
	p, root := testenv.NewRedeployProxy(t, "/extendLock", tomcat404, 3)
	c, err := camunda7.New(camunda7.Config{BaseURL: root})
	require.NoError(t, err)
	pi, _, ext := e.startAndExtend(c, lockext.Config{LockDuration: 1500 * time.Millisecond, Interval: 300 * time.Millisecond,
		RetryInitial: 50 * time.Millisecond})

	testenv.Eventually(t, 20*time.Second, "three 404s, then an extension granted by the engine", func() (bool, error) {
		return ext.Context().Err() != nil || (p.Injected.Load() == 3 && p.Passed.Load() >= 1 && ext.Extensions() >= 1), nil
	})
	require.NoError(t, ext.Context().Err(), "the handler's context lives on: %v", context.Cause(ext.Context()))
	require.NoError(t, ext.Lost())

	require.NoError(t, e.c.DeleteProcessInstance(e.ctx, pi.ID))
	cause, _ := waitCause(t, ext, time.Now(), 10*time.Second)
	assert.ErrorIs(t, cause, camunda7.ErrLockLost)
	assert.ErrorIs(t, cause, camunda7.ErrTaskGone, "the engine's own 404 through the same proxy")
}
