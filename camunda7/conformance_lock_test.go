package camunda7_test

// Conformance tests of lock timing: when the engine hands an expired task to a pending
// long poll and for how long it locks it, what extendLock and lock answer after a lock
// ran out, what an abandoned long poll leaves behind, and how a complete with a bad
// variable is refused. Locks here are 1-3 s: these pin engine facts, not worker
// defaults. docs/engine-facts.md lists the facts with the tests that pin them.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/internal/testenv"
)

// Timings of the hand-over tests. The task becomes fetchable about unfetchableFor after
// the poll was sent; a shorter poll in the timeout variant leaves other clients of the
// engine less time to disturb the measurement (see untilUndisturbed).
const (
	notifiedPoll      = 6 * time.Second // the pending poll's asyncResponseTimeout, notification variant
	timedOutPoll      = 4 * time.Second // the same, timeout variant
	handoverLock      = 2 * time.Second // the lock the poll asks for
	unfetchableFor    = 2 * time.Second // the first lock, or the retry timeout
	quietBeforeNotify = 1 * time.Second // how long the fetchable task is left to the poll before the notification
	nearExpiry        = 150 * time.Millisecond
)

// serialEnv is newEnv on the quiet engine (testenv.QuietEngine), without t.Parallel. An
// engine has one long-poll handler for all its clients, and whatever wakes it (a new
// task, a new long poll, an unlock, another poll's timeout) makes it fetch for every
// pending poll, ours included: tests that time a hand-over run on an engine no other
// package's tests use, one at a time.
func serialEnv(t *testing.T) *env {
	t.Helper()
	c := testenv.QuietEngine(t)
	return &env{t: t, c: c, m: testenv.Deploy(t, c, testenv.ModelOptions{}), worker: testenv.Unique("worker"), ctx: testenv.Context(t, 2*time.Minute),
		url: testenv.QuietEngineURL()}
}

// pendingPoll sends a long poll for worker on e's topic from a client of its own and
// returns once the request has been written and a probe fetch sent after it found the
// topic empty (the poll's first attempt found nothing either, and it waits), with a
// channel for its result and the time the request was written.
func (e *env) pendingPoll(ctx context.Context, worker string, lock, timeout time.Duration) (<-chan pollResult, time.Time) {
	e.t.Helper()
	written := make(chan struct{}, 1)
	c, err := camunda7.New(camunda7.Config{BaseURL: e.url, HTTPClient: &http.Client{Transport: wroteSignal{written}}})
	require.NoError(e.t, err)
	ch := make(chan pollResult, 1)
	go func() {
		tasks, err := c.FetchAndLock(ctx, camunda7.FetchAndLockRequest{WorkerID: worker, MaxTasks: 1, AsyncResponseTimeout: timeout,
			Topics: []camunda7.FetchTopic{e.topic(lock)}})
		ch <- pollResult{tasks, err, time.Now()}
	}()
	var sent time.Time
	select {
	case <-written:
		sent = time.Now()
	case <-time.After(10 * time.Second):
		e.t.Fatal("long poll request was not written within 10s")
	}
	require.Empty(e.t, e.fetch(worker+"-probe", 1), "probe: nothing is fetchable yet")
	select {
	case r := <-ch:
		e.t.Fatalf("long poll answered at once: %+v", r)
	default:
	}
	return ch, sent
}

// in returns a copy of e that fails t, for use in t's subtests.
func (e *env) in(t *testing.T) *env {
	c := *e
	c.t = t
	return &c
}

// unlockedAt polls the engine every 20 ms until it reports the task unlocked (its
// lockExpirationTime passed on the engine's clock) and returns when it first did. It
// fails the test after 15 s.
func (e *env) unlockedAt(taskID string) time.Time {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got, err := e.c.ExternalTasks(e.ctx, camunda7.ExternalTaskQuery{ExternalTaskID: taskID, NotLocked: true})
		require.NoError(e.t, err)
		if len(got) == 1 {
			return time.Now()
		}
		require.True(e.t, time.Now().Before(deadline), "task %s still locked after 15s", taskID)
		<-tick.C
	}
}

// disturbance is why an attempt could not time a hand-over.
type disturbance struct {
	why string
	// atExpiry: the poll got the task within nearExpiry of the engine reporting it
	// unlocked, as it would every time if a lock running out woke pending polls.
	atExpiry bool
}

// untilUndisturbed runs attempt up to six times, until one is not disturbed. Another
// client of the engine (another package's tests, a worker) can wake its long-poll
// handler at any moment, which hands our task over before the moment an attempt times:
// attempt then says so, after asserting what holds anyway. When every attempt is
// disturbed the test fails if each got the task right as it became fetchable (the fact
// pinned here would have changed). Otherwise the engine was too busy to tell: on the quiet
// engine that should not happen, so in CI it fails too; elsewhere (a developer's engine
// shared with a running worker, say) it is skipped.
func untilUndisturbed(t *testing.T, attempt func(t *testing.T) *disturbance) {
	t.Helper()
	const attempts = 6
	atExpiry := 0
	for i := 1; i <= attempts; i++ {
		d := attempt(t)
		if d == nil {
			return
		}
		if d.atExpiry {
			atExpiry++
		}
		t.Logf("attempt %d disturbed: %s", i, d.why)
	}
	if atExpiry == attempts {
		t.Fatalf("in all %d attempts the pending poll got the task within %v of it becoming fetchable: does the engine now wake pending polls when a lock runs out?", attempts, nearExpiry)
	}
	msg := "every attempt was disturbed: other clients woke the engine's long-poll handler (see the log); is something else using " + testenv.QuietEngineURL() + "?"
	if testenv.InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// handover is one expired-task-meets-pending-poll scenario.
type handover struct {
	// fetchLock is the lock e.worker fetches the task with.
	fetchLock time.Duration
	// block, when set, then keeps the task unfetchable for unfetchableFor.
	block func(e *env, task camunda7.LockedExternalTask)
	// notify, when set, wakes the engine's long-poll handler (a task created elsewhere)
	// quietBeforeNotify after the task became fetchable; otherwise nothing does until the
	// poll's timeout.
	notify bool
	// wake makes the notification a wake (Client.WakeLongPolls) from yet another worker
	// instead of a new task.
	wake bool
}

// run runs one attempt: a task becomes fetchable while another worker's long poll is
// pending, and the test measures when the poll gets it and how long it is locked for.
func (h handover) run(t *testing.T) *disturbance {
	e := serialEnv(t)
	notifier := testenv.Deploy(t, e.c, testenv.ModelOptions{})
	e.start("", nil)
	tasks := e.fetch(e.worker, 1, e.topic(h.fetchLock))
	require.Len(t, tasks, 1)
	task := tasks[0]
	if h.block != nil {
		h.block(e, task)
	}
	blocked, err := e.c.ExternalTask(e.ctx, task.ID)
	require.NoError(t, err)

	poller := e.worker + "-poller"
	pollTimeout := timedOutPoll
	if h.notify {
		pollTimeout = notifiedPoll
	}
	ch, sent := e.pendingPoll(e.ctx, poller, handoverLock, pollTimeout)

	// The engine reports the task unlocked: nothing has handed it to the pending poll.
	fetchable := e.unlockedAt(task.ID)
	select {
	case r := <-ch:
		return &disturbance{why: fmt.Sprintf("the poll answered (%d tasks) %v after the send, before the engine reported the task unlocked",
			len(r.tasks), r.at.Sub(sent)), atExpiry: true}
	default:
	}
	t.Logf("%s's lock ran out on the engine at %s; the engine reported the task unlocked %v after the poll was sent; the poll is still pending",
		e.worker, blocked.LockExpirationTime.Format("15:04:05.000"), fetchable.Sub(sent))

	var nudged, nudgedAfter time.Time
	if h.notify {
		select {
		case r := <-ch:
			return &disturbance{why: fmt.Sprintf("the poll got the task %v after it became fetchable, before the notification", r.at.Sub(fetchable)),
				atExpiry: r.at.Sub(fetchable) < nearExpiry}
		case <-time.After(quietBeforeNotify):
		}
		nudged = time.Now()
		if h.wake {
			require.NoError(t, e.c.WakeLongPolls(e.ctx, e.worker+"-waker"))
		} else {
			_, err := e.c.StartProcess(e.ctx, notifier.Key, admin.StartProcessRequest{})
			require.NoError(t, err)
		}
		nudgedAfter = time.Now()
	}

	var r pollResult
	select {
	case r = <-ch:
	case <-time.After(pollTimeout + 10*time.Second):
		t.Fatal("the long poll did not answer")
	}
	require.NoError(t, r.err)
	require.Len(t, r.tasks, 1, "the poll gets the task, not an empty list")
	got := r.tasks[0]
	require.Equal(t, task.ID, got.ID)
	assert.Equal(t, poller, got.WorkerID)
	assert.Equal(t, blocked.Retries, got.Retries, "a failure's retries and message travel with the task")
	assert.Equal(t, blocked.ErrorMessage, got.ErrorMessage)

	// The lock runs from the hand-over (the engine's now when it fetched for the poll),
	// not from when the poll was sent.
	handedAt := got.LockExpirationTime.Add(-handoverLock)
	assert.WithinDuration(t, r.at, handedAt, 500*time.Millisecond, "lockExpirationTime = hand-over + lockDuration")
	assert.True(t, handedAt.After(fetchable.Add(-200*time.Millisecond)), "hand-over %v after the poll was sent, the task was fetchable %v after",
		handedAt.Sub(sent), fetchable.Sub(sent))
	now, err := e.c.ExternalTask(e.ctx, task.ID)
	require.NoError(t, err)
	assert.Equal(t, poller, now.WorkerID)
	assert.True(t, now.LockExpirationTime.Equal(got.LockExpirationTime.Time))
	t.Logf("the poll got the task %v after the send (%v after it became fetchable); lockExpirationTime = hand-over + %v, hand-over %v before the answer arrived (a lock counted from the send would have ended %v after it)",
		r.at.Sub(sent), r.at.Sub(fetchable), got.LockExpirationTime.Sub(handedAt), r.at.Sub(handedAt), handoverLock)

	if h.notify {
		if r.at.Before(nudged) {
			return &disturbance{why: fmt.Sprintf("the poll answered %v before the notification", nudged.Sub(r.at))}
		}
		assert.Less(t, r.at.Sub(nudgedAfter), time.Second, "the notification wakes the poll at once")
		t.Logf("%s woke the poll: it answered %v after the call returned", map[bool]string{false: "a task created elsewhere", true: "a wake"}[h.wake], r.at.Sub(nudgedAfter))
		return nil
	}
	if took := r.at.Sub(sent); took < pollTimeout-100*time.Millisecond {
		return &disturbance{why: fmt.Sprintf("the poll answered %v after the send (%v after the task became fetchable), before its %v timeout",
			took, r.at.Sub(fetchable), pollTimeout), atExpiry: r.at.Sub(fetchable) < nearExpiry}
	}
	assert.Less(t, r.at.Sub(sent), pollTimeout+2*time.Second, "answered at the poll's timeout")
	t.Logf("nothing woke the poll: at its %v timeout the engine fetched once more and handed the task over", pollTimeout)
	return nil
}

// failWithRetryTimeout: a failure with retries left and a retry timeout of unfetchableFor.
// The engine keeps the task locked for the failing worker until the timeout ends.
func failWithRetryTimeout(e *env, task camunda7.LockedExternalTask) {
	e.t.Helper()
	before := time.Now()
	require.NoError(e.t, e.c.Failure(e.ctx, task.ID, camunda7.FailureRequest{WorkerID: e.worker, ErrorMessage: "try later", Retries: 2, RetryTimeout: unfetchableFor}))
	got, err := e.c.ExternalTask(e.ctx, task.ID)
	require.NoError(e.t, err)
	require.NotNil(e.t, got.Retries)
	assert.Equal(e.t, 2, *got.Retries)
	assert.Equal(e.t, e.worker, got.WorkerID, "the retry timeout is a lock held by the failing worker")
	assert.WithinDuration(e.t, before.Add(unfetchableFor), got.LockExpirationTime.Time, time.Second, "lockExpirationTime = failure + retryTimeout")
}

// A lock running out does not wake a pending long poll: the task is handed over at the
// next notification (here a task created on another topic), or else when the poll times
// out (the engine fetches once more then, and answers with the task, not []). Its lock
// runs from the hand-over.
func TestConformanceExpiredLockHandedToPendingPoll(t *testing.T) {
	t.Run("at the next notification", func(t *testing.T) {
		untilUndisturbed(t, handover{fetchLock: unfetchableFor, notify: true}.run)
	})
	t.Run("at the poll's timeout", func(t *testing.T) {
		untilUndisturbed(t, handover{fetchLock: unfetchableFor}.run)
	})
}

// The end of a failure's retry timeout does not wake a pending long poll either.
func TestConformanceRetryTimeoutEndHandedToPendingPoll(t *testing.T) {
	t.Run("at the next notification", func(t *testing.T) {
		untilUndisturbed(t, handover{fetchLock: time.Minute, block: failWithRetryTimeout, notify: true}.run)
	})
	t.Run("at the poll's timeout", func(t *testing.T) {
		untilUndisturbed(t, handover{fetchLock: time.Minute, block: failWithRetryTimeout}.run)
	})
}

// A wake (fetchAndLock for maxTasks 0 that has to wait a millisecond) is accepted, locks
// nothing, answers at once, and makes the engine fetch again for a pending long poll: the
// task whose lock or retry timeout ran out is handed over at once (tasks.Worker sends one
// when it knows such a moment).
func TestConformanceWakeHandsOverToPendingPoll(t *testing.T) {
	t.Run("an expired lock", func(t *testing.T) {
		untilUndisturbed(t, handover{fetchLock: unfetchableFor, notify: true, wake: true}.run)
	})
	t.Run("the end of a retry timeout", func(t *testing.T) {
		untilUndisturbed(t, handover{fetchLock: time.Minute, block: failWithRetryTimeout, notify: true, wake: true}.run)
	})
	t.Run("alone it locks nothing and answers at once", func(t *testing.T) {
		e := newEnv(t, testenv.ModelOptions{})
		e.start("", nil)
		sent := time.Now()
		require.NoError(t, e.c.WakeLongPolls(e.ctx, e.worker))
		assert.Less(t, time.Since(sent), 2*time.Second, "a wake does not wait")
		locked, err := e.c.ExternalTasks(e.ctx, camunda7.ExternalTaskQuery{WorkerID: e.worker})
		require.NoError(t, err)
		assert.Empty(t, locked, "a wake locks no task")
		assert.Len(t, e.fetch(e.worker, 1), 1, "the task is still fetchable")
	})
}

// The lock-watch query (tasks.Worker: the locks on a topic) is honoured: a lock ending
// after lockExpirationBefore, or before lockExpirationAfter, is left out, a task never locked has no lock end, and
// the result is sorted by lock end.
func TestConformanceLockExpirationQuery(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	tasks := e.startLocked(time.Minute, "a", "b")
	require.NoError(t, e.c.ExtendLock(e.ctx, tasks[0].ID, e.worker, 2*time.Minute))
	e.start("never-locked", nil)
	q := camunda7.ExternalTaskQuery{TopicName: e.m.Topic, Active: true, WithRetriesLeft: true, ByLockExpiration: true,
		LockExpirationBefore: time.Now().Add(90 * time.Second)}
	got, err := e.c.ExternalTasks(e.ctx, q)
	require.NoError(t, err)
	require.Len(t, got, 1, "only the lock ending within 90 s; the never-locked task has no lock end")
	assert.Equal(t, tasks[1].ID, got[0].ID)
	q.LockExpirationBefore = time.Now().Add(5 * time.Minute)
	got, err = e.c.ExternalTasks(e.ctx, q)
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, []string{tasks[1].ID, tasks[0].ID}, []string{got[0].ID, got[1].ID}, "earliest lock end first")
	q.LockExpirationAfter = time.Now().Add(90 * time.Second)
	got, err = e.c.ExternalTasks(e.ctx, q)
	require.NoError(t, err)
	require.Len(t, got, 1, "lockExpirationAfter leaves out the lock ending within 90 s")
	assert.Equal(t, tasks[0].ID, got[0].ID)
}

// startLocked starts one instance per business key and locks their tasks for e.worker
// with lock; the tasks are returned in the order of the keys.
func (e *env) startLocked(lock time.Duration, keys ...string) []camunda7.LockedExternalTask {
	e.t.Helper()
	var out []camunda7.LockedExternalTask
	for _, bk := range keys {
		e.start(bk, nil)
		topic := e.topic(lock)
		topic.BusinessKey = bk
		tasks := e.fetch(e.worker, 1, topic)
		require.Len(e.t, tasks, 1)
		out = append(out, tasks[0])
	}
	return out
}

// refetch fetches the task of business key bk for worker.
func (e *env) refetch(worker, bk string) camunda7.LockedExternalTask {
	e.t.Helper()
	topic := e.topic(time.Minute)
	topic.BusinessKey = bk
	tasks := e.fetch(worker, 1, topic)
	require.Len(e.t, tasks, 1, "refetch %s", bk)
	return tasks[0]
}

// extendLock by the lock's own worker after the lock ran out: "Cannot extend a lock that
// expired" (ErrLockExpired) while nobody has refetched the task, "It is locked by worker
// 'B'" (ErrLockLost only) once another worker has.
func TestConformanceExtendLockAfterExpiry(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	tasks := e.startLocked(time.Second, "bk-1", "bk-2")
	for _, tk := range tasks {
		e.unlockedAt(tk.ID)
	}

	t.Run("nobody refetched", func(t *testing.T) {
		id := tasks[0].ID
		before, err := e.c.ExternalTask(e.ctx, id)
		require.NoError(t, err)
		err = e.c.ExtendLock(e.ctx, id, e.worker, time.Minute)
		after := time.Now()
		ee := engineError(t, err, 400, "RestException", q("Cannot extend a lock that expired: lockExpirationTime is not greater than or equal to ")+`\d+`)
		assert.ErrorIs(t, err, camunda7.ErrLockExpired)
		assert.ErrorIs(t, err, camunda7.ErrLockLost)
		assert.ErrorIs(t, err, camunda7.ErrBadRequest)
		// The number is the engine's now, in epoch milliseconds.
		ms, perr := strconv.ParseInt(regexp.MustCompile(`\d+$`).FindString(ee.Message), 10, 64)
		require.NoError(t, perr)
		assert.WithinDuration(t, after, time.UnixMilli(ms), 5*time.Second, "the engine's now")
		// The refusal changes nothing: the expired lock still names the worker.
		got, err := e.c.ExternalTask(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, e.worker, got.WorkerID)
		assert.True(t, got.LockExpirationTime.Equal(before.LockExpirationTime.Time))
	})
	t.Run("another worker refetched", func(t *testing.T) {
		id := tasks[1].ID
		thief := e.worker + "-B"
		require.Equal(t, id, e.in(t).refetch(thief, "bk-2").ID)
		err := e.c.ExtendLock(e.ctx, id, e.worker, time.Minute)
		engineError(t, err, 400, "RestException", q(fmt.Sprintf("The lock of the External Task %s cannot be extended by worker '%s''. It is locked by worker '%s'.", id, e.worker, thief)))
		assert.ErrorIs(t, err, camunda7.ErrLockLost)
		assert.NotErrorIs(t, err, camunda7.ErrLockExpired)
	})
}

// POST /external-task/{id}/lock after one's own lock ran out: while nobody has refetched
// the task it succeeds (for the old owner, and as much for any other worker) and extendLock
// works again; once another worker holds a live lock it is refused (ErrLockLost).
// (complete after one's own lock expired is TestConformanceExpiredLock.)
func TestConformanceLockAfterOwnLockExpired(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	tasks := e.startLocked(time.Second, "bk-1", "bk-2", "bk-3")
	for _, tk := range tasks {
		e.unlockedAt(tk.ID)
	}

	t.Run("nobody refetched: the owner locks it again", func(t *testing.T) {
		id := tasks[0].ID
		before := time.Now()
		require.NoError(t, e.c.Lock(e.ctx, id, e.worker, time.Minute))
		got, err := e.c.ExternalTask(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, e.worker, got.WorkerID)
		assert.WithinDuration(t, before.Add(time.Minute), got.LockExpirationTime.Time, 5*time.Second, "locked from now")
		require.NoError(t, e.c.ExtendLock(e.ctx, id, e.worker, 2*time.Minute), "extendLock works again")
		got, err = e.c.ExternalTask(e.ctx, id)
		require.NoError(t, err)
		assert.WithinDuration(t, before.Add(2*time.Minute), got.LockExpirationTime.Time, 5*time.Second)
		topic := e.topic(time.Minute)
		topic.BusinessKey = "bk-1"
		assert.Empty(t, e.in(t).fetch(e.worker+"-B", 5, topic), "nobody else can fetch it")
	})
	t.Run("nobody refetched: any other worker may lock it too", func(t *testing.T) {
		id := tasks[2].ID
		other := e.worker + "-C"
		require.NoError(t, e.c.Lock(e.ctx, id, other, time.Minute))
		got, err := e.c.ExternalTask(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, other, got.WorkerID)
	})
	t.Run("another worker holds it", func(t *testing.T) {
		id := tasks[1].ID
		thief := e.worker + "-B"
		require.Equal(t, id, e.in(t).refetch(thief, "bk-2").ID)
		err := e.c.Lock(e.ctx, id, e.worker, time.Minute)
		engineError(t, err, 400, "RestException", q(fmt.Sprintf("External Task %s cannot be locked by worker '%s'. It is locked by worker '%s'.", id, e.worker, thief)))
		assert.ErrorIs(t, err, camunda7.ErrLockLost)
		assert.NotErrorIs(t, err, camunda7.ErrLockExpired)
		got, err := e.c.ExternalTask(e.ctx, id)
		require.NoError(t, err)
		assert.Equal(t, thief, got.WorkerID, "the holder keeps it")
	})
}

// failure and bpmnError, like complete (TestConformanceExpiredLock), succeed after one's
// own lock ran out while nobody refetched the task: the engine checks the worker id, not
// the expiry.
func TestConformanceFailureAndBPMNErrorAfterOwnLockExpired(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	tasks := e.startLocked(time.Second, "bk-1", "bk-2")
	for _, tk := range tasks {
		e.unlockedAt(tk.ID)
	}
	require.NoError(t, e.c.Failure(e.ctx, tasks[0].ID, camunda7.FailureRequest{WorkerID: e.worker, ErrorMessage: "late", Retries: 1, RetryTimeout: time.Minute}))
	got, err := e.c.ExternalTask(e.ctx, tasks[0].ID)
	require.NoError(t, err)
	assert.Equal(t, "late", got.ErrorMessage)
	require.NoError(t, e.c.BPMNError(e.ctx, tasks[1].ID, camunda7.BPMNErrorRequest{WorkerID: e.worker, ErrorCode: "BUSINESS_ERROR"}))
	_, err = e.c.ExternalTask(e.ctx, tasks[1].ID)
	assert.ErrorIs(t, err, camunda7.ErrTaskGone, "the BPMN error ended the task")
}

// A long poll the client gave up on still takes the next task: the engine does not
// notice the client left, locks the task for the vanished worker, and the task sits
// locked for the whole lockDuration, for nobody.
func TestConformanceAbandonedLongPollLocksTask(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	const lock = 3 * time.Second
	gone := e.worker + "-gone"
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	ch, sent := e.pendingPoll(ctx, gone, lock, 5*time.Second)
	select {
	case r := <-ch:
		t.Fatalf("the poll answered before it was abandoned: %+v", r)
	case <-time.After(time.Until(sent.Add(200 * time.Millisecond))):
	}
	cancel()
	select {
	case r := <-ch:
		require.ErrorIs(t, r.err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled poll did not return")
	}

	<-time.After(time.Until(sent.Add(time.Second))) // the task comes 1 s after the poll was sent
	created := time.Now()
	pi := e.start("", nil)
	var task camunda7.ExternalTask
	testenv.Eventually(t, 5*time.Second, "the task to be locked for the abandoned poll's worker", func() (bool, error) {
		got, err := e.c.ExternalTasks(e.ctx, camunda7.ExternalTaskQuery{ProcessInstanceID: pi.ID})
		if err != nil || len(got) != 1 {
			return false, err
		}
		task = got[0]
		return task.WorkerID == gone, nil
	})
	seen := time.Now()
	// The engine locked the task between its creation and the moment it was seen locked
	// (on a loaded machine that window is seconds wide, so it bounds the expiry rather than
	// a fixed tolerance): lockDuration from then, not from the poll's send, 1s earlier.
	// The engine's times have milliseconds only.
	expires := task.LockExpirationTime.Time
	assert.False(t, expires.Before(created.Add(lock-10*time.Millisecond)),
		"locked from its creation for lockDuration, not from the poll's send: expires %v after the creation", expires.Sub(created))
	assert.False(t, expires.After(seen.Add(lock)),
		"locked at the latest when seen, for lockDuration: expires %v after it was seen", expires.Sub(seen))
	assert.Empty(t, e.fetch(e.worker+"-alive", 1), "nobody else can fetch it meanwhile")

	free := e.unlockedAt(task.ID)
	lockedFor := free.Sub(created)
	assert.False(t, free.Before(expires.Add(-10*time.Millisecond)), "locked until its expiry, free %v before it", expires.Sub(free))
	alive := e.fetch(e.worker+"-alive", 1)
	require.Len(t, alive, 1, "fetchable once the lock ran out")
	assert.Equal(t, task.ID, alive[0].ID)
	t.Logf("poll for %q abandoned 200ms after the send; a task created %v after the send was locked for it until %s (lockDuration %v): fetchable again %v after its creation",
		gone, created.Sub(sent), task.LockExpirationTime.Format("15:04:05.000"), lock, lockedFor)
}

// complete with a Date variable the engine cannot parse: 400 InvalidRequestException,
// verbatim message (the value is echoed), code null. Nothing happens to the task: it stays
// locked for the worker, with the same expiry, and can be completed. An empty Date string,
// on the other hand, is accepted as a null Date.
func TestConformanceCompleteWithMalformedDate(t *testing.T) {
	e := newEnv(t, testenv.ModelOptions{})
	pi, task := e.startAndLock(time.Minute)
	const msg = "Cannot convert value 'not-a-date' of type 'Date' to java type java.util.Date"

	status, body := rawPost(t, "/external-task/"+task.ID+"/complete",
		fmt.Sprintf(`{"workerId":%q,"variables":{"d":{"type":"Date","value":"not-a-date"}}}`, e.worker))
	assert.Equal(t, 400, status)
	assert.Equal(t, map[string]any{"type": "InvalidRequestException", "message": msg, "code": nil}, body)

	bad := camunda7.Variables{"d": {Type: "Date", Value: json.RawMessage(`"not-a-date"`)}}
	for name, req := range map[string]camunda7.CompleteRequest{
		"variables":      {WorkerID: e.worker, Variables: bad},
		"localVariables": {WorkerID: e.worker, LocalVariables: bad},
	} {
		err := e.c.Complete(e.ctx, task.ID, req)
		ee := engineError(t, err, 400, "InvalidRequestException", q(msg))
		assert.Nil(t, ee.Code, name)
		assert.ErrorIs(t, err, camunda7.ErrBadRequest, name)
		assert.NotErrorIs(t, err, camunda7.ErrLockLost, name)
	}

	got, err := e.c.ExternalTask(e.ctx, task.ID)
	require.NoError(t, err)
	assert.Equal(t, e.worker, got.WorkerID, "still locked for the worker")
	assert.True(t, got.LockExpirationTime.Equal(task.LockExpirationTime.Time), "lock untouched")
	assert.Nil(t, got.Retries)

	status, body = rawPost(t, "/external-task/"+task.ID+"/complete",
		fmt.Sprintf(`{"workerId":%q,"variables":{"d":{"type":"Date","value":""}}}`, e.worker))
	assert.Equal(t, 204, status, "%v", body)
	vars, err := e.c.ProcessInstanceVariables(e.ctx, pi.ID)
	require.NoError(t, err)
	require.True(t, vars.Has("d"))
	assert.Equal(t, "Date", vars["d"].Type)
	assert.JSONEq(t, `null`, string(vars["d"].Value), "an empty Date is stored as null")
}
