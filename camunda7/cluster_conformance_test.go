package camunda7_test

// Engine clusters: what an engine node's death does to the requests extworker sends
// through the load balancer in front of the cluster (docs/engine-facts.md, "An engine
// cluster"). The cluster is the test's own (testenv.StartCluster: two nodes on one
// database behind HAProxy, configured as services/haproxy-cluster.cfg), so nothing else
// talks to it: HAProxy's round robin sends two requests in a row to the two nodes.

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/testenv"
)

// polled is what a long poll came back with, and when.
type polled struct {
	worker string
	tasks  []camunda7.LockedExternalTask
	err    error
	at     time.Time
}

// lostAnswer asserts err is an unknown outcome as a node's death through HAProxy makes
// one, and says which: HAProxy's 502 Bad Gateway (a *ResponseError), or the client's
// connection closed with no answer (a *TransportError for a request sent in full; what
// the client saw here, on its kept-alive connection to HAProxy: Go's client does not
// resend a POST then). Both are ErrUnknownOutcome.
func lostAnswer(t *testing.T, err error) string {
	t.Helper()
	assert.ErrorIs(t, err, camunda7.ErrUnknownOutcome)
	var re *camunda7.ResponseError
	var te *camunda7.TransportError
	switch {
	case errors.As(err, &re):
		assert.Equal(t, 502, re.StatusCode, "HAProxy's Bad Gateway")
		return "HAProxy's 502"
	case errors.As(err, &te):
		assert.True(t, te.Sent, "sent in full")
		return "the connection closed with no answer"
	}
	t.Errorf("neither a 502 nor a lost answer: %T %v", err, err)
	return ""
}

// A node's death, through the balancer, for a pending long poll, for an extendLock sent
// after it, and for a complete in flight at the node when it dies.
func TestConformanceClusterNodeDeath(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, 2)
	c := cl.Client(t)
	e := &env{t: t, c: c, m: testenv.Deploy(t, c, testenv.ModelOptions{NoMessageWait: true}), worker: testenv.Unique("worker"),
		ctx: testenv.Context(t, 8*time.Minute), url: cl.URL()}

	// in waits until HAProxy has n requests open to node i.
	in := func(t *testing.T, i, n int, what string) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, what, func() (bool, error) {
			got, err := cl.InFlight(i)
			return err == nil && got == n, err
		})
	}

	// (a) and (c). A pending long poll whose node is SIGKILLed gets HAProxy's 502 at once:
	// an unknown outcome. It locked nothing: the next task goes to the poll pending on the
	// surviving node. Locks live in the shared database: a lock taken before the death is
	// extended through the balancer by the surviving node.
	if !t.Run("pending long poll and extendLock", func(t *testing.T) {
		e := e.in(t)
		_, held := e.startAndLock(time.Minute)

		const asyncTimeout = 30 * time.Second
		results := make(chan polled, 2)
		workers := []string{testenv.Unique("pollA"), testenv.Unique("pollB")}
		for _, w := range workers {
			go func() {
				tasks, err := e.c.FetchAndLock(e.ctx, camunda7.FetchAndLockRequest{WorkerID: w, MaxTasks: 1,
					AsyncResponseTimeout: asyncTimeout, Topics: []camunda7.FetchTopic{e.topic(time.Minute)}})
				results <- polled{worker: w, tasks: tasks, err: err, at: time.Now()}
			}()
		}
		in(t, 0, 1, "one long poll pending on node 0")
		in(t, 1, 1, "one long poll pending on node 1")

		k := cl.Kill(t, 0)

		// (c) at once, before HAProxy's health check has noticed: a request sent to the dead
		// node's closed port is redispatched to the other one.
		before, err := e.c.ExternalTask(e.ctx, held.ID)
		require.NoError(t, err)
		require.NoError(t, e.c.ExtendLock(e.ctx, held.ID, e.worker, 2*time.Minute), "extendLock through the balancer after node 0 died")
		after, err := e.c.ExternalTask(e.ctx, held.ID)
		require.NoError(t, err)
		assert.Equal(t, e.worker, after.WorkerID)
		assert.True(t, after.LockExpirationTime.After(before.LockExpirationTime.Add(30*time.Second)),
			"the surviving node extended the lock: %v, was %v", after.LockExpirationTime, before.LockExpirationTime)

		// (a) the poll on the dead node.
		var dead polled
		select {
		case dead = <-results:
		case <-time.After(asyncTimeout):
			t.Fatalf("neither long poll came back within %v of node 0's death", asyncTimeout)
		}
		took := dead.at.Sub(k.At)
		t.Logf("the long poll pending on the killed node came back %v after the SIGKILL: %v", took.Round(time.Millisecond), dead.err)
		require.Error(t, dead.err, "the long poll on the killed node")
		t.Logf("the client saw %s", lostAnswer(t, dead.err))
		assert.Less(t, took, 5*time.Second, "the dead node's poll fails at once, not at its timeout")

		testenv.Eventually(t, 10*time.Second, "HAProxy to count node 0 down", func() (bool, error) {
			up, _, err := cl.Balanced(0)
			return err == nil && !up, err
		})
		t.Logf("HAProxy counted node 0 down within %v of the SIGKILL", time.Since(k.At).Round(time.Millisecond))

		// The next task: fetchable, handed at once to the poll still pending on node 1.
		pi := e.start("", nil)
		started := time.Now()
		var alive polled
		select {
		case alive = <-results:
		case <-time.After(asyncTimeout):
			t.Fatalf("the long poll on the surviving node did not come back within %v", asyncTimeout)
		}
		require.NoError(t, alive.err)
		require.Len(t, alive.tasks, 1, "the surviving node's poll got the new task")
		assert.Equal(t, pi.ID, alive.tasks[0].ProcessInstanceID)
		assert.NotEqual(t, dead.worker, alive.worker)
		t.Logf("the poll on the surviving node got the new task %v after the start call returned", alive.at.Sub(started).Round(time.Millisecond))
		lockedByDead, err := e.c.ExternalTasks(e.ctx, camunda7.ExternalTaskQuery{WorkerID: dead.worker})
		require.NoError(t, err)
		assert.Empty(t, lockedByDead, "nothing is locked for the worker whose poll died with its node")
	}) {
		return
	}

	restart := cl.Restart(t, 0)
	t.Logf("node 0 back in %v", restart.Round(time.Millisecond))

	// (b) A complete in flight at a node when it dies (here: received, not yet processed: the
	// node is frozen, then SIGKILLed) gets HAProxy's 502, an unknown outcome. The engine's
	// history shows the task not completed, still locked by its worker, who completes it
	// once more through the balancer. Had the node committed before it died, the client would
	// have seen the same 502, and the second complete would meet the engine's "does not
	// exist" (ErrTaskGone): the report took effect.
	t.Run("in-flight complete", func(t *testing.T) {
		e := e.in(t)
		for range 2 {
			e.start("", nil)
		}
		locked := e.fetch(e.worker, 2)
		require.Len(t, locked, 2)

		cl.Freeze(t, 1)
		type completed struct {
			task string
			err  error
			at   time.Time
		}
		done := make(chan completed, 2)
		complete := func(task string) {
			go func() {
				err := e.c.Complete(e.ctx, task, camunda7.CompleteRequest{WorkerID: e.worker})
				done <- completed{task: task, err: err, at: time.Now()}
			}()
		}
		// Round robin: of two completes in a row, one goes to the frozen node.
		complete(locked[0].ID)
		var first completed
		stuck := ""
		testenv.Eventually(t, 5*time.Second, "the first complete to be answered by node 0 or held by the frozen node 1", func() (bool, error) {
			select {
			case first = <-done:
				return true, nil
			default:
			}
			n, err := cl.InFlight(1)
			if n == 1 {
				stuck = locked[0].ID
			}
			return n == 1, err
		})
		if stuck == "" {
			require.NoError(t, first.err, "the complete answered by node 0")
			complete(locked[1].ID)
			in(t, 1, 1, "the second complete held by the frozen node 1")
			stuck = locked[1].ID
		}

		k := cl.Kill(t, 1)
		var lost completed
		for lost.task != stuck {
			select {
			case lost = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("the complete held by node 1 did not come back within 30s of its death")
			}
			if lost.task != stuck {
				require.NoError(t, lost.err, "the complete answered by node 0")
			}
		}
		took := lost.at.Sub(k.At)
		t.Logf("the complete in flight at the killed node came back %v after the SIGKILL: %v", took.Round(time.Millisecond), lost.err)
		require.Error(t, lost.err)
		t.Logf("the client saw %s", lostAnswer(t, lost.err))
		assert.Less(t, took, 5*time.Second)

		// What the engine's history shows: not completed, still locked by the worker.
		task, err := e.c.ExternalTask(e.ctx, stuck)
		require.NoError(t, err, "the task still exists")
		assert.Equal(t, e.worker, task.WorkerID)
		logs, err := e.c.ExternalTaskLog(e.ctx, url.Values{"externalTaskId": {stuck}, "successLog": {"true"}})
		require.NoError(t, err)
		assert.Empty(t, logs, "no success in the external task log")
		var pi string
		for _, l := range locked {
			if l.ID == stuck {
				pi = l.ProcessInstanceID
			}
		}
		acts, err := e.c.HistoricActivityInstances(e.ctx, url.Values{"processInstanceId": {pi}, "activityId": {e.m.ActivityID}})
		require.NoError(t, err)
		require.Len(t, acts, 1)
		assert.True(t, acts[0].EndTime.IsZero(), "the task's activity has not ended")

		// The worker's resend, through the balancer to the surviving node.
		err = e.c.Complete(e.ctx, stuck, camunda7.CompleteRequest{WorkerID: e.worker})
		require.NoError(t, err, "the same complete sent again")
		logs, err = e.c.ExternalTaskLog(e.ctx, url.Values{"externalTaskId": {stuck}, "successLog": {"true"}})
		require.NoError(t, err)
		assert.Len(t, logs, 1, "completed once")
		err = e.c.Complete(e.ctx, stuck, camunda7.CompleteRequest{WorkerID: e.worker})
		assert.True(t, errors.Is(err, camunda7.ErrTaskGone), "a complete after the task completed: %v", err)
	})
}
