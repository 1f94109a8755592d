// Package fakeprovider is a deterministic fake payment (and email) provider over HTTP,
// for what the tests cannot run for real. It honours Idempotency-Key in three dialects
// (Stripe, the IETF draft, Brandur's demo), forgets keys after a retention on a virtual
// clock, offers a lagging business-key search, injects scripted faults, and records
// every request in a Jepsen-style history. The demo, the crash-point tests and the soak
// charge through it (docs/reliability.md, The fake provider); the matrix rows it serves
// are in the same document's Scenario matrix.
//
// # Endpoints
//
//	POST /v1/charges                      {"invoice","amountCents"}, Idempotency-Key required
//	GET  /v1/charges?idempotency_key=K    the answer stored under K (also /v1/charges/by-key/K)
//	GET  /v1/charges/search?invoice=INV   {"data":[charge...]} after the search lag; 501 if disabled
//	POST /v1/emails                       {"to","template","invoice"}, Idempotency-Key honoured unless EmailDedupeOff
//	GET /_admin/effects, GET /_admin/log, POST /_admin/clock?advance=25h, POST /_admin/script (an AdminScript)   test-only
//
// # Idempotency
//
// The first request under a key runs and its answer (success, decline, and in the
// stripe dialect a 500) is stored; a later request with the same key and the same
// digest replays it with Idempotent-Replayed: true. The same key with a different
// digest is refused (stripe 400 idempotency_error, ietf 422, brandur 409
// idempotency_key_mismatch) and a request whose key is still in flight gets 409. 429
// and 503 run before the key store and are never stored. A key at least
// Options.Retention old on the virtual clock is forgotten: a lookup finds nothing and a
// new request with it makes a second effect, as Stripe does after 24 hours.
//
// # Faults
//
// A fault applies to one POST. Rules are matched in the order key (ScriptKey), invoice
// (Script), n-th charge request (ScriptNth) and probability (ScriptRandom, seeded by
// Options.Seed); the first match wins. Faults are drawn under one lock in request
// order, so the same seed and the same request order give the same faults, and the
// history shows which fault each request got.
//
// # Client
//
// Client maps every answer to one outcome a caller can act on: a Charge; ErrNotSent
// (nothing happened: unreachable, 429 as *RateLimitError, 409 in flight as
// *InUseError); ErrUnknownOutcome (the request left and no usable answer came back: a
// dropped connection or a 5xx); *DeclineError; ErrKeyMismatch (permanent); and for
// lookups ErrNotFound and *StoredFailureError.
package fakeprovider
