// Package humantask completes Camunda 7 user tasks exactly once per command, for the
// user the task is for, as the form the user saw showed it.
//
// The engine's POST /task/{id}/complete has no version, no command id and no
// authorization of its own: a second click gets a 500 ("Cannot find task"), and whoever
// holds the engine's credentials completes any task. A Service stands in front of it
// (Service.Handler, or Service.Complete from Go):
//
//	GET  /tasks                the caller's tasks: assigned to it, or unassigned with it
//	                           (or one of its groups) as a candidate; each with its etag
//	GET  /tasks/{id}           one task, with an ETag header
//	POST /tasks/{id}/complete  a JSON object of scalar form variables, with the headers
//	                           Idempotency-Key (the command id) and If-Match (the ETag)
//
// # The ETag
//
// A task's ETag is a digest of everything the engine exposes that a completion may
// depend on: the task's fields (assignee, owner, delegation, due dates, priority,
// suspension, and lastUpdated, which the engine moves on claim, assignment and
// identity-link changes but not on variable changes), its candidate users and groups
// (its identity links), and the variables its form shows (GET
// /task/{id}/form-variables). camunda7's TestConformanceUserTaskVersion pins which
// engine field moves on what; TestETagChanges pins that the ETag moves on each.
//
// # Checks at completion time
//
// In this order, against the engine's state when the command runs: the caller is the
// task's assignee or, while nobody is assigned, a candidate (user, or a member of a
// candidate group) — else 403; the task's ETag is If-Match — else 412; each value fits
// the type of the variable it overwrites, and keeps it (a string a String, an integer in
// its range a Short, Integer or Long, a number a Double, a boolean a Boolean, null
// anything; a Date, Json or Object variable cannot be set from a form here) — else 422; the Guard registered for the task's
// definition key (Config.Guards) allows it — else 422 with the guard's reason. A task
// whose form declares fields (camunda:formData in the process's BPMN; Task.Fields) is
// completed with those only, less the readonly ones — else 422 naming them — and
// through its form (submit-form), so the engine's validations hold (a refusal is a 422
// naming the field and the validation); a task that declares none may set any
// variable, and a guard that must allow only some names refuses the others. Strings
// are at most 4000 characters (the engine's column), else 400.
//
// # Answers
//
//	200 {"state":"completed","task":…,"command":…,"completedBy":…}  this command completed it
//	409 {"error":…,"task":…,"completedBy":…,"completedAt":…}         another command did (or someone
//	                                                                 outside this service: no completedBy),
//	                                                                 told to a user who had a right on the task
//	                                                                 (else 404); {"state":"suspended",…}: the
//	                                                                 task's process is suspended;
//	                                                                 {"state":"delegated",…}: its delegation is
//	                                                                 pending (the engine would resolve it, not
//	                                                                 complete it)
//	412 stale If-Match (one ETag, a list, or *); 403 not allowed; 404 unknown task; 422 guard refusal (with "reason")
//	    or an Idempotency-Key reused with another request
//	428 no Idempotency-Key or If-Match; 400 a body, key, task id or user that cannot be
//	    stored or sent (invalid UTF-8, NUL bytes, nested values); 401 no verified identity
//	503 with Retry-After: the command's outcome is not settled yet (another request of it
//	    in flight, the engine unreachable); send it again
//
// Every answer from 200 to 422 except the 422 of a reused key is the command's: it is
// recorded, and the same command (same task, key, user and form) gets it again byte for
// byte, from any process, without the engine being asked again. A refused command stays
// refused: after a 412 the form is loaded again and sent as a new command.
//
// # Exactly once, through crashes
//
// A completion is an effect on the engine, and the effect ledger (package idempotency)
// already runs effects at most once with a state machine this package reuses rather than
// building a third one beside the ledger's and the inbox's: the intent is scope
// "humantask.complete" with key "<task id>/<command id>/<digest of the user>" (a command
// id is its sender's: another user's copy of it is another command), its request digest is the
// digest of the user and the form (the form itself is never stored); the answer is
// recorded as the intent's result (a 200's body) or its rejection (the status as code,
// the body as message), built from non-secret fields only. The command is recorded, and
// marked dispatched, before the engine is called.
//
// The engine records which command completed the task in the completion's own
// transaction: the process variable "extworker_completion_<task id>" =
// {"command":…,"user":…} is sent with the completion (forms may not use the prefix), so
// history (/history/task for who and when, /history/variable-instance for the marker)
// says it. A command whose answer was lost, or whose service died after calling the
// engine, is settled from there on its next request (once the dead request's lease has
// run out, Config.Lease): the task still waits → checked and completed anew; completed
// with this command's marker → 200; with another's → 409 (404 to a user who never had a
// right on the task, by the history's identity-link log); gone otherwise → 404.
//
// # Identity
//
// Config.Identity says who sends a request: ProxyHeader (a reverse proxy's headers,
// believed only from its addresses, as the console does) or JWT (a bearer token
// verified with go-oidc against a JWKS: issuer, audience, expiry; user and groups
// claims). No token, body or form reaches a log, an error or a stored row.
//
// The database needs the schema of package migrations (the ledger's).
package humantask
