// Package failpoint kills the process at named points, for the crash tests: real process
// death by SIGKILL, so no deferred cleanup, no flush, no goodbye to the engine.
//
// Points are enabled from the environment, never from code:
//
//	EXTWORKER_FAILPOINTS=after-dispatch-mark          kill at the first hit
//	EXTWORKER_FAILPOINTS=before-complete@3,in-extension   kill at the third hit of one, the first of the other
//
// The points exist only in builds with the failpoints tag (go build -tags failpoints,
// on Unix): the crash tests, the fault matrix and the soak build their workers that way
// (make test and the soak targets pass it). In every other build Inject is an empty
// function the compiler removes, Enabled is false, and the production binary contains
// no way to kill itself (TestProductionBinaryHasNoFailpointsOrFakes).
package failpoint

// Env is the variable that enables failpoints.
const Env = "EXTWORKER_FAILPOINTS"

// Points named in the worker, in the order a side effect passes them.
const (
	AfterPrepared       = "after-prepared"        // intent recorded and claimed, nothing sent
	AfterDispatchMark   = "after-dispatch-mark"   // dispatched committed, request not yet sent
	AfterProviderAnswer = "after-provider-answer" // provider answered, ledger not yet confirmed
	AfterConfirm        = "after-confirm"         // ledger confirmed, engine not yet told
	BeforeComplete      = "before-complete"       // the completion is about to be sent
	InExtension         = "in-extension"          // a lock extension is about to be sent

	OutboxBeforePublish = "outbox-before-publish" // the relay holds an event, nothing sent
	OutboxAfterPublish  = "outbox-after-publish"  // the broker confirmed an event, not yet marked published
	InboxAfterEngine    = "inbox-after-engine"    // the engine answered a start or correlation, the inbox row not yet settled
	InboxAfterAck       = "inbox-after-ack"       // the inbox row settled and the delivery acknowledged
)
