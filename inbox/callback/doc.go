// Package callback takes provider HTTP callbacks (webhooks) into the inbox (package
// inbox), so that a callback acts on the engine exactly once, however often the provider
// sends it again: the HTTP transport of an inbox.Handler, as inbox.Consumer is the
// RabbitMQ one.
//
// A Server is an http.Handler for one or more sources, each with its inbox.Handler (its
// Decide) and its signing secrets, at POST …/{source} (the handler's Config.Source).
// A callback is authenticated by the Standard Webhooks scheme
// (https://www.standardwebhooks.com): webhook-id, webhook-timestamp (unix seconds) and
// webhook-signature, space-separated "v1,<base64 HMAC-SHA256 of {id}.{timestamp}.{body}>"
// signatures; secrets are written "whsec_<base64 key>". Any of a source's secrets signs
// (list the old and the new while the provider rotates them); each comparison is in
// constant time; a timestamp more than Config.Tolerance (5 minutes) from the server's
// clock, either way, is refused. The webhook-id is the inbox's message id.
//
// What a callback is answered, decided by its inbox row, so that the same callback sent
// again, to this process or another, after a restart too, gets the same status and the
// same bytes (the body is a function of the row's state, not of the delivery):
//
//	405  not POST                                    nothing recorded
//	404  no such source                              nothing recorded
//	413  a body over Config.MaxBody (1 MiB)          nothing recorded
//	401  a signature missing, malformed, wrong, stale nothing recorded
//	409  the webhook-id with another body            recorded as the inbox's conflict
//	200  {"id":…,"state":"processed"}                acted on (or Decide said Ignore)
//	200  {"id":…,"state":"ignored_duplicate"}        late: the instance moved on
//	200  {"id":…,"state":"failed_final"}             parked for an operator (below)
//	202  {"id":…,"state":"failed_retryable"|…}       waiting: held, handled again by Run
//	503  the inbox's database unreachable            nothing promised: send it again
//
// A parked callback (a body Decide cannot read, fields PostgreSQL cannot store, the
// engine refusing it, early past the inbox's EarlyWindow) is answered 200 with its state,
// failed_final: the provider sending it again cannot help (the inbox would count it a
// duplicate), and a non-2xx answer would only make the provider retry for days and then
// disable the endpoint. Its inbox row says why (`extworker inbox show`); an operator puts
// it back (replay), and the provider's resend of it is then handled afresh. The reason
// the inbox records is never in the answer.
//
// Early callbacks wait without a broker: a callback whose row waits (no process instance
// waits for it yet, the engine unreachable, an outcome to reconcile) is answered 202 only
// once its body is held in extworker_inbox_callbacks (migration 00013), due again after
// the inbox's Handling.Delay. Run, in every process that serves callbacks, takes the due
// ones (FOR UPDATE SKIP LOCKED, under a lease) and hands them to the inbox again, until
// the row settles. The body is held ONLY while its row waits: it is deleted as soon as
// the row settles (processed, ignored_duplicate or failed_final), whichever delivery
// settled it. The inbox row keeps the body's digest, never the body.
//
// Security: the answers and the log records carry no secret, no header value but the
// message id, and no body; a refused signature is logged by source and why.
package callback
