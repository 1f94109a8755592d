// Package camunda7 is a client for the external-task REST API of Camunda 7 and its
// forks (Operaton, CIB seven), faithful to the real engine down to its status codes,
// messages and quirks. It knows nothing of workers: the runtime in package tasks is
// built on it, and so are tests and operator tools.
//
// # Calls
//
// Every call takes a context and returns typed results. FetchAndLock long-polls when
// AsyncResponseTimeout is set; its HTTP timeout is derived from the long poll so the
// client never abandons a poll the engine is still holding (an abandoned poll can lock
// tasks nobody receives). Per-task calls (Complete, Failure, BPMNError, ExtendLock,
// Lock, Unlock, ExternalTask, ExternalTaskErrorDetails, SetExternalTaskRetries) name
// the task and the worker. Version is the readiness probe; VariableData downloads a
// File variable's content. The calls tests, demos and operators need beyond a worker's
// (deployments, process instances, messages, incidents, history) are in package admin,
// built on Do, which sends any other REST call with the client's authentication, limits
// and errors.
//
// # Variables
//
// Variables are typed the way the engine speaks them ({"type","value","valueInfo"}).
// Constructors (StringVar, LongVar, DateVar, JSONVar, ObjectVar, ...) always send an
// explicit type; accessors (Variables.String, Variables.Long, Variables.JSON, ...)
// return a *VariableError for a missing variable or a wrong type, and never put a
// variable's value in an error. Longs keep full 64-bit precision and dates use the
// engine's own format (2006-01-02T15:04:05.000-0700) with the time's own offset.
// FetchTopic.Variables nil fetches no variables, unlike the engine's default of all:
// AllVariables must be asked for.
//
// # Errors
//
// Errors fall in three kinds, and the difference matters for what a caller may do next:
//
//   - *Error: the engine answered with an error. Nothing happened; errors.Is matches
//     ErrTaskGone (the engine's own answer that the task does not exist: completed,
//     cancelled or deleted), ErrLockLost (locked by
//     another worker, unlocked, or an expired lock being extended), ErrLockExpired
//     (only the last: extendLock after the lock ran out and before anyone else took
//     the task, which Lock can then take back), ErrSuspended, ErrOptimisticLock,
//     ErrFormRefused (a user task form's values refused on submit-form; FormRefusal
//     gives the reason without the value), ErrUnauthorized, ErrBadRequest, ErrNotFound.
//   - ErrNotSent (a *TransportError with Sent false, or an argument the client refused):
//     the request never reached the engine, so it is safe to send again.
//   - ErrUnknownOutcome (a *TransportError with Sent true, or a *ResponseError): the
//     request left but its answer was lost or unreadable (timeout, reset, a proxy's
//     error page, a truncated or oversized body). The engine may have acted on it; find
//     out before doing anything that could act twice.
//
// SafeToRetry tells the first two from the third, like pgconn.SafeToRetry.
//
// "Task gone" is decided by one function (taskGoneAnswer) from the engine's JSON error
// body alone: a 404 whose type is the engine's (RestException, InvalidRequestException,
// NotFoundException) and whose message is "External task with id <id> does not exist"
// (or "Cannot find external task with id <id>"), and errorDetails' 500 quirk. Any other
// 404 on an external-task endpoint (Tomcat's or nginx's HTML page while /engine-rest is
// being redeployed, an empty body, JSON of another shape or message) says nothing about
// the task: it is a *ResponseError that matches ErrNotSent (and ErrMalformedResponse),
// so callers send it again; it never cancels a handler or drops a result.
//
// ErrThrottled matches a 429 or 413, as a proxy in front of the engine answers when it
// rations requests: an *Error, or a *ResponseError when its body could not be read, and
// a refusal either way. RetryAfter returns the delay its Retry-After header asked for
// (seconds or an HTTP-date, capped at MaxRetryAfter).
//
// # Known engine behaviour
//
// The conformance suite (conformance*_test.go) pins the engine facts this package relies
// on; docs/engine-facts.md lists them with the tests that pin them. Among them: complete,
// failure, bpmnError and lock succeed after one's own lock expired as long as nobody
// refetched the task, while extendLock after expiry always fails (ErrLockExpired); unlock
// lets anyone release a lock and wakes pending long polls, as does a new task, but a
// lock or retry timeout running out wakes nothing: a pending poll gets such a task at
// the next wake-up or at its own timeout, locked from that moment; a poll the client
// abandoned still locks the next task, for lockDuration; a complete with an unparsable
// Date variable is a 400 that leaves the lock alone; every per-task call on an unknown
// id is a 404 RestException "External task with id <id> does not exist", except
// errorDetails, which is text/plain and answers an unknown id with a 500.
package camunda7
