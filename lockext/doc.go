// Package lockext keeps an external task's lock alive while its handler runs, and tells
// the handler, through its context, when the lock is gone.
//
// A task fetched with fetchAndLock is locked for LockDuration. A handler that runs
// longer would lose it: another worker fetches the task and the work is done twice. So
// for every running task the runtime (package tasks) starts one Extender, which calls
// extendLock before the lock runs out, much as a Temporal activity heartbeats, and
// which cancels the handler's context with a typed cause when the engine says the lock
// is gone. All the extenders of a worker run on one Scheduler (see Scheduling below):
// a task in flight costs a queue entry, not a goroutine and timers.
//
// # Life of an extender
//
// The runtime notes when it sent the fetchAndLock request, starts an extender for each
// task it got, runs the handler with the extender's context, reports the result, and
// only then stops the extender:
//
//	locks, err := lockext.NewScheduler(client, lockext.SchedulerConfig{}) // once per worker
//	defer locks.Close()
//	// ...
//	sentAt := time.Now()
//	tasks, err := client.FetchAndLock(ctx, req)
//	// ...
//	ext, err := locks.Start(workCtx, lockext.Task{ID: t.ID, WorkerID: worker, GrantedAt: sentAt},
//		lockext.Config{LockDuration: lock, Logger: logger})
//	if err != nil {
//		return err // an invalid config or task, or locks closed (ErrClosed): unlock the task
//	}
//	defer ext.Stop()
//	result := handler(ext.Context(), t)
//	report(result) // complete or failure, while the lock is still being extended
//	ext.Stop()
//
// Extending goes on while the result is reported: a shutdown that cancels workCtx
// cancels the handler's context (with workCtx's cause) but not the extending, because
// reporting the result still needs the lock. Only Stop, a lost lock and MaxRunTime end
// it. Every extendLock call has its own context (the parent's values, not its
// cancellation) and its own timeout.
//
// # Timing
//
// The engine sets a lock's expiry to its own now plus the duration asked for, at some
// moment after the request was sent. The extender never compares clocks with the
// engine: it takes the local time the request was sent (Task.GrantedAt for the fetch,
// the send time of each successful extension afterwards) plus LockDuration as a
// conservative local deadline (Extender.Deadline), which the engine's expiry is never
// before. The next extension goes out Interval (default LockDuration/3) after the
// latest grant.
//
// The local deadline decides when to extend, never that the lock is lost. The engine
// hands a task to a pending long poll at the poll's end or at the next notification
// (docs/engine-facts.md), and locks it from that moment: a task whose lock expired, or
// whose retry timeout ended, while a 20-second poll was pending can arrive with its whole
// local deadline spent although the engine's lock is fresh. Such a late task is extended
// at once, in Start, before its handler runs. And while the engine cannot be reached,
// extending goes on with backoff for as long as it takes: a lock that ran out meanwhile
// is answered "Cannot extend a lock that expired" (camunda7.ErrLockExpired), which means
// nobody else has taken the task yet, so the extender locks it again (Locker.Lock) and
// the handler never notices.
//
// # Scheduling
//
// A Scheduler keeps the next extension of every task it holds in a min-heap ordered by
// when it goes out, and one goroutine sends them: it sleeps until the earliest is due,
// hands each due extension to a call of its own (at most SchedulerConfig.Concurrency in
// flight; the others wait their turn, so a slow engine is not sent more), and puts the
// task back with its next due time when the answer is in. MaxRunTime is an entry of the
// same queue, not a timer. Stop takes the task out of the queue, or cancels its call in
// flight and waits for it.
//
// Tasks fetched in one answer would all be due at the same instant, Interval after
// Interval. So each extension goes out at a random moment up to Spread × Interval
// before it is due (default a quarter), never after, and the sends are paced: at least
// 1/(Burst × need) apart, where need is the extensions per second the tasks held need
// on average (one per Interval each) and Burst is 5 by default, but never more than
// 50ms apart. A burst of extensions due together therefore goes out over a fifth of the
// Interval, inside the quarter it was spread over, and the engine never sees more than
// Burst times the average rate. Everything else is as for one task: the same cadence,
// retries, loss semantics and causes; the package-level Start runs one task on a
// scheduler of its own that neither spreads nor paces. With 10,000 tasks in flight
// against the test engine, bench/ scenario 7 reports the peak RSS, the locks lost, how
// late extensions went out and the engine's extendLock rate.
//
// # Why the context ends
//
// context.Cause(ext.Context()) says why, matched with errors.Is:
//
//   - camunda7.ErrLockLost, as a *LockLostError: the engine answered that the task is gone
//     (camunda7.ErrTaskGone: completed elsewhere, cancelled, instance deleted) or that
//     the lock is not ours (camunda7.ErrLockLost: another worker holds it, or it was
//     unlocked). Nothing else ends a lock: transient errors (not sent, unknown outcome,
//     5xx, suspended, unauthorized, and a 404 that is not the engine's own answer, such
//     as Tomcat's or nginx's HTML page while the engine is redeployed) are retried with
//     doubling backoff up to Interval, and an expired lock nobody took is locked again.
//     The handler's work may now be done by someone else: it should stop, and its
//     result will likely be refused.
//   - ErrMaxRunTime: Config.MaxRunTime passed since Start. Extending stops, so the lock
//     runs out and another worker may take the task: a stuck handler cannot hold it
//     forever.
//   - the parent's cause: the worker is shutting down.
//   - ErrStopped: Stop was called, the normal end.
//
// Lost returns the first two, for the runtime to log or count once the handler returns.
//
// # Reporting while extending
//
// Because extending continues while the result is reported, an extendLock can race a
// complete or failure on the engine. The report then fails with
// camunda7.ErrOptimisticLock (nothing was committed; sent again, it succeeds: see
// TestEngineCompleteRacingExtension, where a complete sent together with an extendLock
// was refused nine times in ten), and an extension sent just after a successful complete
// finds the task gone, so Lost may report ErrTaskGone for a task this worker completed
// itself. So the runtime retries a report refused with ErrOptimisticLock, and once it
// has reported, decides by the report's outcome, not by Lost.
//
// Unlocking is different: it gives the lock up, so Stop the extender first. An unlock
// that meets an extendLock is refused with camunda7.ErrOptimisticLock and the task
// stays locked by this worker, out of every other worker's reach until the extended
// lock runs out (TestEngineUnlockRacingExtension).
package lockext
