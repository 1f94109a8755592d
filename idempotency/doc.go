// Package idempotency runs side effects at most once per business intent, through an
// effect ledger in PostgreSQL.
//
// A handler names each side effect as an Intent: a scope ("payment.collect"), a
// deterministic key ("invoice:INV-1:v1") and the request, of which only a canonical
// digest is stored. Ledger.Do records the intent, takes it for this attempt, marks it
// dispatched before the request leaves, calls Effect.Dispatch with a provider key
// derived from the intent (ProviderKey), and records what came back:
//
//	prepared -> dispatched -> confirmed | rejected | unknown
//	unknown  -> reconciled | prepared (authoritatively not found) | operator_hold
//	operator_hold -> confirmed | rejected | prepared (an operator's verdict)
//	confirmed | reconciled -> compensated (a compensating intent confirmed)
//
// Every later delivery of the same intent replays the recorded outcome without calling
// the provider. An outcome the worker could not see (a timeout after the request was
// written) is never retried blindly: the next attempt asks Effect.Reconcile (by key,
// within Config.ProviderWindow) or Effect.Search (by business key), and parks the
// intent for an operator, with an incident, when neither can tell. Every transition is
// a compare-and-set on the intent's state and attempt, so a worker that lost its lease
// cannot overwrite what another one recorded, and appends an event to an append-only
// trail.
//
// Do returns errors that are already failure outcomes (package failure): a decline is
// a BPMN error, an unknown outcome waits for reconciliation, a held intent is an
// incident.
//
// The operator's side is apart, in Operations (Ledger.Operations, or NewOperations on a
// pool): operators list, inspect and settle intents with List, Get, Events, Resolve,
// Approve and RejectResolution (the two-person rule), and prune settled ones into
// tombstones with Prune; the extworker binary's `effects` command and the console wrap
// them, and docs/operators.md is their runbook.
//
// The database needs the schema of package migrations.
//
// # Testing handlers
//
// NewInMemory returns a ledger that keeps its intents in memory: a handler's unit test
// passes it where production passes the ledger of New, and needs no database. Do is
// written once over both (the same claim decision, leases, fencing, replays and
// reconciliation), and package ledgertest holds both to one behaviour suite. The
// in-memory ledger has no operators (Operations is nil) and runs Effect.Local with a
// nil transaction.
//
// # Traces
//
// Do traces its steps through OpenTelemetry's global TracerProvider (a no-op until a
// program installs one), as children of the span in its ctx (under package tasks, the
// handler's): "ledger claim", "ledger mark dispatched", "provider call" (around
// Effect.Dispatch, whose ctx carries it: httpeffect sends its trace context to the
// provider), "ledger confirm", "ledger reject", "ledger unknown", "ledger not sent",
// "ledger reconcile" (with "provider lookup" around Reconcile or Search) and "ledger
// hold". Each carries idempotency.scope, idempotency.state (the state the step reached)
// and idempotency.attempt; a failed step's status is Error, described by its failure's
// kind. No span carries the intent's key, its request, the business key or an error's
// text.
package idempotency
