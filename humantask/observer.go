package humantask

// Observer is told what became of each completion request, for metrics (package metrics
// implements it: NewHumanTaskMetrics). Methods are called synchronously, once per answer,
// and must be safe for concurrent use and quick. They are given no task id, command id,
// user or form.
//
// Embed NopObserver to implement part of it.
type Observer interface {
	// Completed: this request's command completed the task (the engine completed it
	// now, or a crashed request of it did and it was settled from the engine's history
	// now): a 200 given for the first time.
	Completed()
	// Replayed: the command's recorded answer (status) was given again, from the ledger,
	// without the engine being asked to complete anything.
	Replayed(status int)
	// Conflict: the command found the task completed by another command, or outside the
	// service: a 409 given for the first time.
	Conflict()
	// Refused: the command was refused with status (400, 401, 403, 404, 412, 422, 428),
	// for the first time, or without being recorded (a malformed request, a reused key).
	Refused(status int)
	// Unsettled: the command's outcome was not settled in time (another request of it in
	// flight, a crashed request's lease not run out, the engine unreachable): a 503 with
	// Retry-After.
	Unsettled()
}

// NopObserver does nothing; embed it to implement part of Observer.
type NopObserver struct{}

var _ Observer = NopObserver{}

func (NopObserver) Completed()   {}
func (NopObserver) Replayed(int) {}
func (NopObserver) Conflict()    {}
func (NopObserver) Refused(int)  {}
func (NopObserver) Unsettled()   {}

// observe tells o what answer a was: recorded says it is the command's recorded answer
// (a 200 or a refusal the ledger holds), fresh that this request settled it.
func observe(o Observer, a Answer, recorded, fresh bool) {
	switch {
	case a.Status == 503:
		o.Unsettled()
	case recorded && !fresh:
		o.Replayed(a.Status)
	case a.Status == 200:
		o.Completed()
	case a.Status == 409:
		o.Conflict()
	default:
		o.Refused(a.Status)
	}
}
