package inbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestClassify drives the inbox's classification with values alone: no PostgreSQL, no
// engine, no broker. Each case is the row as a delivery finds it, the message, what
// Decide and the engine said, and the windows; the step is what becomes of it.
func TestClassify(t *testing.T) {
	const early, inFlight = 10 * time.Minute, time.Minute
	// due is a first delivery of a message with digest "d", decided as a, the engine
	// not asked yet.
	due := func(a actionKind) facts {
		return facts{state: StateReceived, storedDigest: "d", digest: "d", action: a, earlyWindow: early, inFlightWindow: inFlight}
	}
	with := func(f facts, change func(*facts)) facts { change(&f); return f }
	settle := func(c Class, st State, d Disposition) step { return step{class: c, state: st, disposition: d} }

	for _, tc := range []struct {
		name string
		f    facts
		want step
	}{
		// The row.
		{"first delivery: Decide is asked", due(actionUndecided), step{next: nextDecide}},
		{"another body under a known id: a conflict, parked, the row's state kept",
			with(due(actionStart), func(f *facts) { f.state, f.storedDigest = StateProcessed, "other" }),
			step{class: ClassConflict, state: StateProcessed, disposition: Park, parkKind: ParkConflict}},
		{"a conflict even while the first is being processed",
			with(due(actionUndecided), func(f *facts) { f.state, f.storedDigest = StateProcessing, "other" }),
			step{class: ClassConflict, state: StateProcessing, disposition: Park, parkKind: ParkConflict}},
		{"processed before: a duplicate", with(due(actionUndecided), func(f *facts) { f.state = StateProcessed }),
			settle(ClassDuplicate, StateProcessed, Ack)},
		{"ignored before: a duplicate", with(due(actionUndecided), func(f *facts) { f.state = StateIgnoredDuplicate }),
			settle(ClassDuplicate, StateIgnoredDuplicate, Ack)},
		{"parked before: a duplicate (the replay puts it back to received)", with(due(actionUndecided), func(f *facts) { f.state = StateFailedFinal }),
			settle(ClassDuplicate, StateFailedFinal, Ack)},
		{"its retry copy waits: a duplicate", with(due(actionUndecided), func(f *facts) { f.state, f.suppressed = StateFailedRetryable, true }),
			settle(ClassDuplicate, StateFailedRetryable, Ack)},
		{"a duplicate is not parked for its fields", with(due(actionUndecided), func(f *facts) { f.state, f.park = StateProcessed, ParkUnstorable }),
			settle(ClassDuplicate, StateProcessed, Ack)},

		// The message and Decide.
		{"no id: parked", with(due(actionUndecided), func(f *facts) { f.park = ParkNoID }),
			step{class: ClassParked, state: StateFailedFinal, disposition: Park, parkKind: ParkNoID}},
		{"an invalid action: parked, even with an unknown outcome in flight",
			with(due(actionStart), func(f *facts) { f.park, f.unresolved = ParkInvalidAction, true }),
			step{class: ClassParked, state: StateFailedFinal, disposition: Park, parkKind: ParkInvalidAction}},
		{"Decide says ignore", due(actionIgnore), settle(ClassIgnored, StateProcessed, Ack)},

		// An unknown outcome.
		{"an attempt's request may still be in flight: wait out the window",
			with(due(actionStart), func(f *facts) { f.state, f.unresolved, f.sinceAttempt = StateProcessing, true, 20*time.Second }),
			step{class: ClassUnknownOutcome, state: StateUnknown, disposition: Retry, wait: 40 * time.Second}},
		{"past the in-flight window: ask the engine",
			with(due(actionCorrelate), func(f *facts) { f.state, f.unresolved, f.sinceAttempt = StateUnknown, true, inFlight }),
			step{next: nextAsk}},
		{"another message's start may still land: wait for it",
			with(due(actionStart), func(f *facts) { f.claimWait = 30 * time.Second }),
			step{class: ClassRetry, state: StateFailedRetryable, disposition: Retry, wait: 30 * time.Second}},
		{"another message's start may still land, and this one's outcome is unknown",
			with(due(actionStart), func(f *facts) { f.claimWait, f.unresolved, f.sinceAttempt = time.Second, true, 2*inFlight }),
			step{class: ClassRetry, state: StateUnknown, disposition: Retry, wait: time.Second}},
		{"a correlation due: ask the engine", due(actionCorrelate), step{next: nextAsk}},

		// What the engine says of a start.
		{"no instance with the key: start", with(due(actionStart), func(f *facts) { f.engine = engineNone }),
			step{next: nextAct, class: ClassStarted}},
		{"the instance carries this message's mark: reconciled", with(due(actionStart), func(f *facts) { f.engine = engineTookThis }),
			settle(ClassReconciled, StateProcessed, Ack)},
		{"another message started the key's instance: ignored", with(due(actionStart), func(f *facts) { f.engine = engineTookOther }),
			settle(ClassIgnored, StateIgnoredDuplicate, Ack)},
		{"the process is not deployed: early", with(due(actionStart), func(f *facts) { f.engine = engineNotDeployed }),
			settle(ClassEarly, StateFailedRetryable, Retry)},

		// What the engine says of a correlation.
		{"instances with the key run: correlate", with(due(actionCorrelate), func(f *facts) { f.engine = engineWaiting }),
			step{next: nextAct, class: ClassCorrelated}},
		{"an instance took this message: reconciled", with(due(actionCorrelate), func(f *facts) { f.engine = engineTookThis }),
			settle(ClassReconciled, StateProcessed, Ack)},
		{"an instance took another message of the name: late", with(due(actionCorrelate), func(f *facts) { f.engine = engineTookOther }),
			settle(ClassLate, StateIgnoredDuplicate, Ack)},
		{"the key's instance ended: late", with(due(actionCorrelate), func(f *facts) { f.engine = engineEnded }),
			settle(ClassLate, StateIgnoredDuplicate, Ack)},
		{"none waits yet: early, retried", with(due(actionCorrelate), func(f *facts) { f.engine, f.sinceReceived = engineNone, early }),
			settle(ClassEarly, StateFailedRetryable, Retry)},
		{"none waits past the early window: parked", with(due(actionCorrelate), func(f *facts) { f.engine, f.sinceReceived = engineNone, early+time.Millisecond }),
			step{class: ClassEarly, state: StateFailedFinal, disposition: Park, parkKind: ParkEarly}},
		{"late beats early: an ended instance past the window is late, not parked",
			with(due(actionCorrelate), func(f *facts) { f.engine, f.sinceReceived = engineEnded, 2*early }),
			settle(ClassLate, StateIgnoredDuplicate, Ack)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, classify(tc.f))
		})
	}
}

func TestMarkedSays(t *testing.T) {
	assert.Equal(t, engineTookThis, markedSays("pi-1", found{instance: "pi-2", ended: "pi-3"}), "this message's mark first")
	assert.Equal(t, engineTookOther, markedSays("", found{instance: "pi-2", ended: "pi-3"}))
	assert.Equal(t, engineEnded, markedSays("", found{ended: "pi-3"}))
	assert.Equal(t, engineNone, markedSays("", found{}))
}

func TestParseState(t *testing.T) {
	for in, want := range map[string]State{
		"received": StateReceived, "RECEIVED": StateReceived, "Failed_Final": StateFailedFinal, " processed ": StateProcessed,
		"unknown": StateUnknown, "UNKNOWN_OUTCOME": StateUnknown, "unknown_outcome": StateUnknown, "IGNORED_DUPLICATE": StateIgnoredDuplicate,
	} {
		got, ok := ParseState(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "parked", "unknown-outcome", "FAILED"} {
		_, ok := ParseState(bad)
		assert.False(t, ok, bad)
	}
	for _, st := range States() {
		assert.Regexp(t, `^[a-z_]+$`, string(st), "lower-case snake_case, as stored")
	}
}
