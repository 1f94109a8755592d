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
// incident. Operators list, inspect and settle intents with List, Get, Events, Resolve,
// Approve and RejectResolution (the two-person rule), and prune settled ones into
// tombstones with Prune; the extworker binary's `effects` command wraps them, and
// docs/operators.md is their runbook.
//
// The database needs the schema of package migrations.
package idempotency
