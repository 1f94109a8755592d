package inbox

import "time"

// Class says what a delivery was, in one word: logs, metrics (the outcome label of
// extworker_inbox_messages_total), traces (extworker.outcome) and Handling name it by
// these constants.
type Class string

// The classes of a delivery.
const (
	// ClassStarted: this delivery started a process instance.
	ClassStarted Class = "started"
	// ClassCorrelated: this delivery reached the process instance that waited for it.
	ClassCorrelated Class = "correlated"
	// ClassReconciled: an earlier attempt had acted on the message without recording it;
	// the engine said so, and nothing was sent again.
	ClassReconciled Class = "reconciled"
	// ClassDuplicate: the message was consumed before, or a copy of it waits in the retry
	// queue already; nothing was sent to the engine.
	ClassDuplicate Class = "duplicate"
	// ClassConflict: the message id was consumed with another body; parked, never acted on.
	ClassConflict Class = "conflict"
	// ClassLate: the process instance moved past the wait state, or ended; recorded as
	// ignored_duplicate, nothing sent.
	ClassLate Class = "late"
	// ClassIgnored: nothing to do: Decide said so (Action.Ignore), or the start's
	// business key has its instance already (from another message).
	ClassIgnored Class = "ignored"
	// ClassEarly: no process instance waits for it yet (or its process is not deployed):
	// retried, or parked once Config.EarlyWindow has passed.
	ClassEarly Class = "early"
	// ClassUnknownOutcome: an attempt's outcome at the engine is unknown (its answer lost,
	// or its request maybe still in flight); retried, and the engine is asked first.
	ClassUnknownOutcome Class = "unknown-outcome"
	// ClassRetry: not acted on for now (the engine unreachable, throttling, failing; or
	// another message's start of the same key maybe in flight); retried.
	ClassRetry Class = "retry"
	// ClassParked: parked for a reason of its own, its ParkKind (no id, fields PostgreSQL
	// cannot store, unreadable, an invalid action, refused by the engine, the engine
	// failing on it).
	ClassParked Class = "parked"
	// ClassFailed: the inbox could not record it (the database); the delivery comes again.
	ClassFailed Class = "failed"
)

// Handling is what Handle made of a delivery: what the transport does with it, the row's
// state afterwards, and what the delivery was, in one Class. (Not an "outcome": that is a
// task's, tasks.Outcome; nor a "result" or a "receipt", the ledger's words.)
type Handling struct {
	Disposition Disposition
	// State is the inbox row's state afterwards.
	State State
	// Class is what the delivery was.
	Class Class
	// Delay is how long a retried message waits.
	Delay time.Duration
	// Reason explains a retry, a parked message or an ignored one.
	Reason string
	// ProcessInstanceID is the instance started or reached.
	ProcessInstanceID string
}

// actionKind is which of Action's fields Decide set.
type actionKind int

const (
	actionUndecided actionKind = iota // Decide not asked yet
	actionStart
	actionCorrelate
	actionIgnore
)

// engineSays is what the engine said of the message's process instance.
type engineSays int

const (
	// engineUnasked: the engine has not been asked yet.
	engineUnasked engineSays = iota
	// engineNone: start: no instance with the business key; correlate: none waits, none
	// took this message, none moved past it.
	engineNone
	// engineNotDeployed: the start's process is not deployed.
	engineNotDeployed
	// engineWaiting: correlate: instances with the business key are running; the message
	// is sent to them (one that does not wait for it answers so).
	engineWaiting
	// engineTookThis: an instance carries this message's mark (it started it, or took it).
	engineTookThis
	// engineTookOther: start: an instance with the key, from another message; correlate:
	// an instance took another message of this name and waits no more.
	engineTookOther
	// engineEnded: correlate: an instance with the business key has ended.
	engineEnded
)

// facts is what the inbox knows of a delivery when it classifies it: its row as this
// delivery found it, the message, what Decide and the engine said, and the windows.
type facts struct {
	// The row: its state and body digest before this delivery, and this delivery's digest.
	state                State
	storedDigest, digest string
	// suppressed: a copy of the message waits in the retry queue (the row's retry_due_at).
	suppressed bool
	// unresolved: an attempt's outcome at the engine is unknown.
	unresolved bool
	// sinceReceived: since the message was first seen (or replayed); sinceAttempt: since
	// the last attempt began asking the engine (0 if none did).
	sinceReceived, sinceAttempt time.Duration

	// park: why the message cannot be acted on, before the engine is asked (its fields,
	// what Decide said, its action): "" when it can.
	park ParkKind
	// action: what Decide asked.
	action actionKind
	// claimWait: how long another message's start of the same key may still land.
	claimWait time.Duration

	// engine: what the engine said, once asked.
	engine engineSays

	earlyWindow, inFlightWindow time.Duration
}

// next is what to do with a delivery: ask (Decide, then the engine) or act (send the
// start or the correlation), or settle it with a disposition.
type next int

const (
	nextSettle next = iota
	nextDecide
	nextAsk
	nextAct
)

// step is classify's answer.
type step struct {
	next next
	// What the delivery was, and (nextSettle) how it is settled: the row's state, the
	// transport's disposition, and how long a retry waits (0: the backoff's).
	class       Class
	state       State
	disposition Disposition
	wait        time.Duration
	// parkKind says why a parked message was parked.
	parkKind ParkKind
}

// classify decides what becomes of a delivery, from what the inbox knows of it: a
// conflict (its id with another body), a duplicate (consumed before, or its retry copy
// waiting), parked (what it is or asks cannot be carried out), an unknown outcome whose
// request may still be in flight (wait), then what the engine says: start or correlate,
// reconciled (the engine has it from an earlier attempt), late, ignored, early (retried,
// or parked past the early window). A function of values: the I/O around it gathers the
// facts (the row, Decide, the engine) and carries out the step.
func classify(f facts) step {
	switch {
	case f.storedDigest != f.digest:
		return step{class: ClassConflict, state: f.state, disposition: Park, parkKind: ParkConflict}
	case f.state == StateProcessed || f.state == StateIgnoredDuplicate || f.state == StateFailedFinal, f.suppressed:
		return step{class: ClassDuplicate, state: f.state, disposition: Ack}
	case f.park != "":
		return step{class: ClassParked, state: StateFailedFinal, disposition: Park, parkKind: f.park}
	case f.action == actionUndecided:
		return step{next: nextDecide}
	case f.unresolved && f.engine == engineUnasked && f.sinceAttempt < f.inFlightWindow:
		// An attempt whose end nobody recorded may have a request still on its way to the
		// engine, which asking now would not see: ask once it can no longer land.
		return step{class: ClassUnknownOutcome, state: StateUnknown, disposition: Retry, wait: f.inFlightWindow - f.sinceAttempt}
	case f.action == actionIgnore:
		return step{class: ClassIgnored, state: StateProcessed, disposition: Ack}
	case f.action == actionStart && f.engine == engineUnasked && f.claimWait > 0:
		return step{class: ClassRetry, state: retryState(f.unresolved), disposition: Retry, wait: f.claimWait}
	case f.engine == engineUnasked:
		return step{next: nextAsk}
	case f.engine == engineTookThis:
		return step{class: ClassReconciled, state: StateProcessed, disposition: Ack}
	case f.engine == engineTookOther && f.action == actionStart:
		return step{class: ClassIgnored, state: StateIgnoredDuplicate, disposition: Ack}
	case f.engine == engineTookOther, f.engine == engineEnded:
		return step{class: ClassLate, state: StateIgnoredDuplicate, disposition: Ack}
	case f.engine == engineWaiting, f.engine == engineNone && f.action == actionStart:
		return step{next: nextAct, class: actedClass(f.action)}
	case f.sinceReceived > f.earlyWindow:
		return step{class: ClassEarly, state: StateFailedFinal, disposition: Park, parkKind: ParkEarly}
	}
	return step{class: ClassEarly, state: retryState(f.unresolved), disposition: Retry}
}

// retryState is the state of a message that waits to be retried: unknown while an
// attempt's outcome is unknown (whatever failed since), else failed_retryable.
func retryState(unresolved bool) State {
	if unresolved {
		return StateUnknown
	}
	return StateFailedRetryable
}

// actedClass is the class of a delivery that acted in the engine.
func actedClass(a actionKind) Class {
	if a == actionStart {
		return ClassStarted
	}
	return ClassCorrelated
}

// kindOf is which action a is (checkAction has made sure it is one).
func kindOf(a Action) actionKind {
	switch {
	case a.Start != nil:
		return actionStart
	case a.Correlate != nil:
		return actionCorrelate
	}
	return actionIgnore
}
