package humantask

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
)

// Scope is the ledger scope of a completion: its intents are "humantask.complete",
// keyed "<task id>/<command id>/<user digest>" (commandKey).
const Scope = "humantask.complete"

// Guard is a business rule for one task definition: nil allows the completion; an
// error refuses it (422), its text being the reason shown to the user and recorded as
// the command's answer (no secrets in it).
type Guard func(ctx context.Context, t Task, f Form) error

// Config configures a Service.
type Config struct {
	// Engine is the engine the tasks wait in. Required.
	Engine *admin.Client
	// Pool is the ledger's database, migrated (package migrations). Required.
	Pool *pgxpool.Pool
	// Identity tells who sends a request (ProxyHeader, JWT). Required.
	Identity IdentitySource
	// Guards are business rules by task definition key.
	Guards map[string]Guard
	// Namespace is the ledger's namespace; default "humantask".
	Namespace string
	// Lease is how long one request owns a command; a request of the same command that
	// comes meanwhile waits. After a crash, the command is settled from the engine once
	// it has run out. A dispatch (four engine calls) is cut off at nine tenths of it, its
	// outcome then settled from the engine. Default 20s.
	Lease time.Duration
	// AnswerWithin bounds how long a completion waits for a command another request is
	// running, or whose outcome is being reconciled, before answering 503 with
	// Retry-After. Default 10s.
	AnswerWithin time.Duration
	// MaxBody bounds a completion's body; default 1 MiB.
	MaxBody int64
	// MaxTasks bounds the list of GET /tasks; default 50.
	MaxTasks int
	// Logger: default discard. It never receives a token, a form or a body.
	Logger *slog.Logger
	// Observer is told what became of each completion request, for metrics (package
	// metrics: NewHumanTaskMetrics). Default: nothing.
	Observer Observer
	// LedgerObserver is told of the ledger's transitions of the commands, for metrics
	// (package metrics: the worker's Metrics). Default: nothing.
	LedgerObserver idempotency.Observer
}

// maxReconciliations bounds the reconciliations of a command that end still unknown
// (the engine could not be read) before it is held for an operator: a day of a client
// asking once a second.
const maxReconciliations = 24 * 60 * 60

// Service completes Camunda 7 user tasks exactly once per command; see the package doc.
type Service struct {
	cfg    Config
	ledger *idempotency.Ledger
	fields fieldCache
	// unverified limits the records of requests without a verified identity.
	unverified logLimit
	// faults are the commands the engine failed once in this process (faultAgain).
	faults sync.Map
}

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Engine == nil || cfg.Pool == nil || cfg.Identity == nil {
		return nil, errors.New("humantask: Config needs Engine, Pool and Identity")
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "humantask"
	}
	if cfg.Lease == 0 {
		cfg.Lease = 20 * time.Second
	}
	if cfg.AnswerWithin == 0 {
		cfg.AnswerWithin = 10 * time.Second
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.MaxTasks == 0 {
		cfg.MaxTasks = 50
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = NopObserver{}
	}
	l, err := idempotency.New(cfg.Pool, idempotency.Config{Namespace: cfg.Namespace, Lease: cfg.Lease,
		InProgressBackoff: 100 * time.Millisecond, ReconcileBackoff: 100 * time.Millisecond,
		// The engine settles every command once it answers, so an operator hold (a command
		// answered 503 until an operator acts) is for an engine that cannot be read for a
		// day, not for the ledger's defaults of 5 inconclusive reconciliations or 10
		// attempts cut off (service processes killed, or a dispatch outlasting the lease
		// under load: the load test put commands on hold with those). A command whose
		// outcome is unknown is reconciled on each of its requests, as often as a client
		// sends them (Retry-After is at most 1s): at 100, an engine away two minutes put
		// every such command on hold (TestEngineSIGKILLDuringCompletions).
		MaxAttempts: 100, MaxReconciliations: maxReconciliations,
		// The engine's history is the lookup, for as long as it keeps the task.
		ProviderWindow: 10 * 365 * 24 * time.Hour, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("humantask: %w", err)
	}
	if cfg.LedgerObserver != nil {
		l = l.WithHooks(idempotency.Hooks{Observer: cfg.LedgerObserver})
	}
	return &Service{cfg: cfg, ledger: l}, nil
}

// Command is one completion: a command id (the Idempotency-Key) on a task, as the form
// the user saw (IfMatch, the task's ETag then) with its variables.
type Command struct {
	TaskID  string
	ID      string
	IfMatch string
	Form    Form
}

// Complete completes c.TaskID for who, once per command, and returns the answer: the
// recorded one when the command was answered before.
func (s *Service) Complete(ctx context.Context, who Identity, c Command) Answer {
	if err := checkCommand(who, c); err != nil {
		a := *refusal(http.StatusBadRequest, "", err.Error(), "")
		observe(s.cfg.Observer, a, false, false)
		return a
	}
	// fresh: this request settled the command (its dispatch or reconciliation gave the
	// answer), rather than finding it recorded.
	var fresh atomic.Bool
	in := idempotency.Intent{Scope: Scope, Key: commandKey(c.TaskID, who.User, c.ID),
		Request: map[string]any{"user": who.User, "form": c.Form},
		Task:    idempotency.TaskRef{Actor: who.User, TaskID: c.TaskID}}
	lookup := func(ctx context.Context, _ idempotency.Query) (idempotency.Reconciliation, error) {
		r, settled, err := s.reconcile(ctx, c, who)
		if settled {
			fresh.Store(true)
		}
		return r, err
	}
	eff := idempotency.Effect{
		Dispatch: func(ctx context.Context, _ string) (idempotency.Result, error) {
			res, err := s.dispatch(ctx, c, who)
			var rej *idempotency.Rejection
			if err == nil || errors.As(err, &rej) {
				fresh.Store(true)
			}
			return res, err
		},
		Reconcile:  lookup,
		Search:     lookup,
		OnRejected: func(r *idempotency.Rejection) error { return r },
	}
	deadline := time.Now().Add(s.cfg.AnswerWithin)
	var waited time.Duration
	for {
		rec, err := s.ledger.Do(ctx, in, eff)
		a, wait := answerOf(rec, err)
		if operatorSettled(rec, err) {
			a, wait = s.fromEngine(ctx, c, who), 0
		}
		// Each wait at least doubles: a command the engine keeps refusing is asked again a
		// few times within AnswerWithin, not dozens of times a second.
		if wait > 0 {
			wait = max(wait, min(2*waited, time.Second))
			waited = wait
		}
		if wait == 0 || time.Now().Add(wait).After(deadline) {
			if wait > 0 {
				s.cfg.Logger.Warn("humantask: command not settled in time", slog.String("task", c.TaskID), slog.Any("error", err))
			}
			if recordedAnswer(err) {
				s.faults.Delete(in.Key) // settled: a fault seen once is forgotten (faultAgain)
			}
			observe(s.cfg.Observer, a, recordedAnswer(err), fresh.Load())
			return a
		}
		select {
		case <-ctx.Done():
			observe(s.cfg.Observer, a, false, false)
			return a
		case <-time.After(wait):
		}
	}
}

// recordedAnswer reports whether the ledger's err (nil: a completion) is the command's
// recorded answer, rather than a refusal of the request or an unsettled outcome.
func recordedAnswer(err error) bool {
	var rej *idempotency.Rejection
	return err == nil || errors.As(err, &rej)
}

// checkCommand refuses what cannot be recorded or sent as given.
func checkCommand(who Identity, c Command) error {
	for _, f := range []struct {
		what, s string
		limit   int
	}{{"the task id", c.TaskID, maxTaskID}, {"the Idempotency-Key", c.ID, maxCommand}} {
		if err := checkID(f.what, f.s, f.limit); err != nil {
			return err
		}
	}
	if err := checkName("the user", who.User, maxUser); err != nil {
		return err
	}
	return checkForm(c.Form)
}

// answerOf is the answer of what the ledger returned, or (wait > 0) how long to wait
// before asking it again because the command is not settled yet.
func answerOf(rec idempotency.Receipt, err error) (a Answer, wait time.Duration) {
	var rej *idempotency.Rejection
	switch {
	case err == nil:
		body, _ := rec.Values["body"].(string)
		return Answer{Status: http.StatusOK, Body: []byte(body)}, 0
	case errors.As(err, &rej):
		status, perr := strconv.Atoi(rej.Code)
		if perr != nil {
			status = http.StatusConflict
		}
		return Answer{Status: status, Body: []byte(rej.Message)}, 0
	case errors.Is(err, idempotency.ErrDigestMismatch):
		return newAnswer(http.StatusUnprocessableEntity, answerBody{State: StateKeyReused,
			Error: "the Idempotency-Key was used with a different request: this request was not sent, and the command's answer stands (send the command's own request again for it)"}), 0
	case errors.Is(err, idempotency.ErrInvalidIntent):
		return *refusal(http.StatusBadRequest, "", "the command cannot be recorded as given", ""), 0
	case errors.Is(err, idempotency.ErrOperatorHold):
		return unsettled("the command is held for an operator", time.Minute), 0
	}
	wait = max(failure.Classify(err).RetryDelay, 50*time.Millisecond)
	wait = min(wait, time.Second)
	return unsettled("the command's outcome is not settled yet", wait), wait
}

// operatorSettled reports whether the ledger's answer is an operator's resolution of
// the command (`extworker effects resolve`) rather than an answer this service recorded:
// a rejection whose code is no HTTP status, or a confirmation without a body.
func operatorSettled(rec idempotency.Receipt, err error) bool {
	var rej *idempotency.Rejection
	if errors.As(err, &rej) {
		_, perr := strconv.Atoi(rej.Code)
		return perr != nil
	}
	body, _ := rec.Values["body"].(string)
	return err == nil && body == ""
}

// fromEngine answers a command an operator settled: the row holds no answer of the
// service's, and one operator's word is not the truth of a completion, so the answer is
// the engine's (settle); a task still waiting → 409, the command closed.
func (s *Service) fromEngine(ctx context.Context, c Command, who Identity) Answer {
	st, err := s.engineState(ctx, c.TaskID, who)
	if err != nil {
		return unsettled("the engine could not be read", time.Second)
	}
	a, open := settle(st, c.TaskID, c.ID, who.User)
	if open {
		return *refusal(http.StatusConflict, c.TaskID, "an operator closed this command; send a new one", "")
	}
	return a
}

// okResult is what the ledger records of a completion: its answer's body.
func okResult(a Answer) idempotency.Result {
	return idempotency.Result{Values: map[string]any{"body": string(a.Body)}}
}

// rejection records a refusal as the command's answer.
func rejection(a Answer) error { return idempotency.Rejected(strconv.Itoa(a.Status), string(a.Body)) }

// reconcile settles a command whose dispatch has an unknown outcome (a lost answer, a
// crash) from the engine: still waiting → sent again (after the checks, anew); completed
// by this command → completed; otherwise its 409 or 404. settled: the command's answer
// is decided.
func (s *Service) reconcile(ctx context.Context, c Command, who Identity) (r idempotency.Reconciliation, settled bool, err error) {
	st, err := s.engineState(ctx, c.TaskID, who)
	switch {
	case err != nil && ctx.Err() != nil:
		// Cut short by the caller (a client that gave up), or by the lease: no answer. The
		// ledger counts the first towards nothing (a client resending with a short timeout
		// spent the command's reconciliations and put it on hold), the second as unknown.
		return idempotency.Reconciliation{}, false, err
	case err != nil:
		return idempotency.StillUnknown("the engine could not be asked: " + err.Error()), false, nil
	}
	a, open := settle(st, c.TaskID, c.ID, who.User)
	switch {
	case open:
		return idempotency.Absent(), false, nil
	case a.Status == http.StatusOK:
		return idempotency.Found(okResult(a)), true, nil
	}
	return idempotency.ReconciledRejected(strconv.Itoa(a.Status), string(a.Body)), true, nil
}

// taskMissing reports whether err is the engine's own answer that it has no such
// waiting task (a 404 InvalidRequestException), not a 404 of something in between.
func taskMissing(err error) bool {
	var e *camunda7.Error
	return errors.As(err, &e) && e.StatusCode == http.StatusNotFound && e.Type == "InvalidRequestException"
}

// load reads a waiting task with its candidates, form variables and declared form
// fields; an error matching
// taskMissing when the engine has no such waiting task.
func (s *Service) load(ctx context.Context, id string) (Task, error) {
	t, err := s.cfg.Engine.UserTask(ctx, id)
	if err != nil {
		return Task{}, err
	}
	return s.loadRest(ctx, t)
}

// loadRest reads the rest of a waiting task t the engine answered (its candidates, form
// variables and declared form fields).
func (s *Service) loadRest(ctx context.Context, t *admin.UserTask) (Task, error) {
	id := t.ID
	links, err := s.cfg.Engine.UserTaskIdentityLinks(ctx, id)
	if err != nil {
		return Task{}, s.goneMeanwhile(ctx, id, err)
	}
	vars, err := s.cfg.Engine.UserTaskFormVariables(ctx, id)
	if err != nil {
		return Task{}, s.goneMeanwhile(ctx, id, err)
	}
	form, err := s.fields.form(ctx, t.ProcessDefinitionID, t.TaskDefinitionKey, s.cfg.Engine.ProcessDefinitionXML)
	if err != nil {
		return Task{}, s.goneMeanwhile(ctx, id, err)
	}
	if form.fields != nil {
		// The engine answers every visible variable besides the declared fields: the form
		// shows its fields only (and the ETag digests them only, so that a variable another
		// branch sets does not make this form stale).
		shown := camunda7.Variables{}
		for _, name := range form.declared {
			if v, ok := vars[name]; ok {
				shown[name] = v
			}
		}
		vars = shown
	}
	// The markers of the instance's tasks completed before are the service's own: they
	// name who completed another task, with which command, which a 404 hides from those
	// who had no right on it.
	maps.DeleteFunc(vars, func(name string, _ camunda7.Variable) bool { return strings.HasPrefix(name, markerPrefix) })
	out := newTask(t, links, vars, form.fields)
	out.defaulted = form.defaulted
	return out, nil
}

// goneMeanwhile is err, or the engine's not-found answer when the task went away between two
// reads (the engine answers those with a 500 or a 400, not a 404).
func (s *Service) goneMeanwhile(ctx context.Context, id string, err error) error {
	if _, again := s.cfg.Engine.UserTask(ctx, id); taskMissing(again) {
		return again
	}
	return err
}

// engineState asks the engine what became of a task: waiting, or its history, the
// marker its completion recorded, and whether who ever had a right on it.
func (s *Service) engineState(ctx context.Context, id string, who Identity) (engineState, error) {
	t, err := s.cfg.Engine.UserTask(ctx, id)
	switch {
	case err == nil:
		return engineState{open: true, suspended: t.Suspended}, nil
	case !taskMissing(err):
		return engineState{}, err
	}
	hs, err := s.cfg.Engine.HistoricUserTasks(ctx, url.Values{"taskId": {id}})
	if err != nil || len(hs) == 0 {
		return engineState{}, err
	}
	st := engineState{history: &hs[0]}
	vs, err := s.cfg.Engine.HistoricVariableInstances(ctx, url.Values{"processInstanceId": {hs[0].ProcessInstanceID}, "variableName": {markerName(id)}})
	if err != nil {
		return engineState{}, err
	}
	for _, v := range vs {
		var text string
		var m marker
		if json.Unmarshal(v.Value, &text) == nil && json.Unmarshal([]byte(text), &m) == nil && m.Command != "" {
			st.marker = &m
		}
	}
	// The identity-link log is read only when the task itself does not already name who
	// (its assignee, or the user whose command completed it).
	if st.hadRight = hadRight(hs[0], st.marker, nil, who); st.hadRight {
		return st, nil
	}
	log, err := s.cfg.Engine.HistoricIdentityLinks(ctx, url.Values{"taskId": {id}})
	if err != nil {
		return engineState{}, err
	}
	st.hadRight = hadRight(hs[0], st.marker, log, who)
	return st, nil
}

// Handler serves the routes: GET /tasks (the caller's: assigned, or candidate while
// unassigned), GET /tasks/{id}, POST /tasks/{id}/complete.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /tasks", s.list)
	mux.HandleFunc("GET /tasks/{id}", s.get)
	mux.HandleFunc("POST /tasks/{id}/complete", s.complete)
	return mux
}

// identify answers 401 and returns false when r's sender is unknown (400 when its
// name cannot be stored).
func (s *Service) identify(w http.ResponseWriter, r *http.Request) (Identity, bool) {
	who, refused := s.who(r)
	if refused != nil {
		refused.write(w)
		return Identity{}, false
	}
	return who, true
}

// ErrUnusableIdentity is a sender whose user name cannot be stored or sent (invalid
// UTF-8, control characters, too long).
var ErrUnusableIdentity = errors.New("humantask: the user's name cannot be stored or sent")

// Identify tells who sends r, as every route of the service does (and a page in front
// of it should): the identity source's answer (an error matching ErrNoIdentity when it
// knows none), the user's name checked (ErrUnusableIdentity), and the groups that can
// name an engine group (the others dropped: none of them is any task's candidate).
func (s *Service) Identify(r *http.Request) (Identity, error) {
	who, err := s.cfg.Identity.Identify(r)
	if err != nil {
		if !errors.Is(err, ErrNoIdentity) {
			err = fmt.Errorf("%w: %v", ErrNoIdentity, err)
		}
		if ok, suppressed := s.unverified.allow(time.Now()); ok {
			s.cfg.Logger.Info("humantask: request without a verified identity", slog.String("why", err.Error()),
				slog.Int("not_logged_since_the_last", suppressed))
		}
		return Identity{}, err
	}
	if err := checkName("the user", who.User, maxUser); err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnusableIdentity, err)
	}
	groups := make([]string, 0, len(who.Groups))
	for _, g := range who.Groups {
		if checkName("a group", g, maxGroup) == nil && !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	who.Groups = groups
	return who, nil
}

// who is r's sender, or the answer refusing r: 401 when it is unknown, 400 when its
// name cannot be stored.
func (s *Service) who(r *http.Request) (Identity, *Answer) {
	who, err := s.Identify(r)
	switch {
	case errors.Is(err, ErrUnusableIdentity):
		return Identity{}, refusal(http.StatusBadRequest, "", strings.TrimPrefix(err.Error(), ErrUnusableIdentity.Error()+": "), "")
	case err != nil:
		return Identity{}, refusal(http.StatusUnauthorized, "", "no verified identity", "")
	}
	return who, nil
}

func (s *Service) complete(w http.ResponseWriter, r *http.Request) {
	refuse := func(a *Answer) {
		observe(s.cfg.Observer, *a, false, false)
		a.write(w)
	}
	who, refused := s.who(r)
	if refused != nil {
		refuse(refused)
		return
	}
	// If-Match lines are one list (RFC 9110 5.3); two command ids are no command id.
	c := Command{TaskID: r.PathValue("id"), ID: r.Header.Get("Idempotency-Key"),
		IfMatch: strings.TrimSpace(strings.Join(r.Header.Values("If-Match"), ", "))}
	if len(r.Header.Values("Idempotency-Key")) > 1 {
		refuse(refusal(http.StatusBadRequest, "", "more than one Idempotency-Key", ""))
		return
	}
	if c.ID == "" || c.IfMatch == "" {
		refuse(refusal(http.StatusPreconditionRequired, "", "Idempotency-Key and If-Match (the task's ETag) are required", ""))
		return
	}
	body, err := readBody(r, s.cfg.MaxBody)
	if err == nil {
		c.Form, err = parseForm(body)
	}
	if err != nil {
		refuse(refusal(http.StatusBadRequest, "", err.Error(), ""))
		return
	}
	s.Complete(r.Context(), who, c).write(w)
}

func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	who, ok := s.identify(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	if err := checkID("the task id", id, maxTaskID); err != nil {
		refusal(http.StatusBadRequest, "", err.Error(), "").write(w)
		return
	}
	t, err := s.load(r.Context(), id)
	switch {
	case taskMissing(err):
		refusal(http.StatusNotFound, id, "no such task", "").write(w)
	case engineFault(err) != nil:
		s.cfg.Logger.Warn("humantask: the engine fails to show a task", slog.String("task", id), slog.Any("error", err))
		refusal(http.StatusBadGateway, id, "the engine fails to show this task ("+engineFault(err).Type+"): an operator must look at the engine's log", "").write(w)
	case err != nil:
		s.cfg.Logger.Warn("humantask: read task", slog.String("task", id), slog.Any("error", err))
		unsettled("the engine could not be read", time.Second).write(w)
	case !allowed(t, who):
		refusal(http.StatusForbidden, id, "not the assignee or a candidate of this task", "").write(w)
	default:
		w.Header().Set("ETag", t.ETag)
		writeJSON(w, t)
	}
}

func (s *Service) list(w http.ResponseWriter, r *http.Request) {
	who, ok := s.identify(w, r)
	if !ok {
		return
	}
	list, err := s.tasksOf(r.Context(), who)
	if err != nil {
		s.cfg.Logger.Warn("humantask: list tasks", slog.Any("error", err))
		unsettled("the engine could not be read", time.Second).write(w)
		return
	}
	writeJSON(w, list)
}

// TaskList is a user's tasks as far as the engine could show them.
type TaskList struct {
	Tasks []Task `json:"tasks"`
	// Unavailable counts the tasks the engine found for the user but could not show in
	// time (each is logged): Tasks leaves them out. A list of none but such tasks is an
	// error instead.
	Unavailable int `json:"unavailable,omitempty"`
}

const (
	// listReaders bounds the tasks of a list read side by side.
	listReaders = 8
	// listWithin times AnswerWithin bounds a list (30s by default): a hanging engine held
	// one 30s per task, and at AnswerWithin alone a list timed out under CI's load.
	listWithin = 3
)

// tasksOf lists who's tasks: assigned to who, or unassigned with who or one of its
// groups as a candidate; each read whole, as GET /tasks/{id} shows it (readAll), the
// list within listWithin times AnswerWithin: a task the engine does not show in time is
// left out and counted; when none is left to show, the list is an error, not empty (a
// user was told she had nothing to do).
func (s *Service) tasksOf(ctx context.Context, who Identity) (TaskList, error) {
	ctx, cancel := context.WithTimeout(ctx, listWithin*s.cfg.AnswerWithin)
	defer cancel()
	found, err := s.findTasks(ctx, who)
	if err != nil {
		return TaskList{}, err
	}
	read, errs := s.readAll(ctx, found, who)
	list := TaskList{Tasks: []Task{}}
	var left []string
	for i := range found { // newest first, as found
		switch {
		case errs[i] == nil && allowed(read[i], who):
			if len(list.Tasks) < s.cfg.MaxTasks {
				list.Tasks = append(list.Tasks, read[i])
			}
		case errs[i] != nil && !taskMissing(errs[i]) && !errors.Is(errs[i], errNotRead): // missing: completed meanwhile
			left, err = append(left, found[i].ID), errs[i]
		}
	}
	if len(left) > 0 {
		s.cfg.Logger.Warn("humantask: tasks left out of a list", slog.Int("tasks", len(left)),
			slog.Any("first", left[:min(len(left), 10)]), slog.Any("error", err))
	}
	list.Unavailable = len(left)
	if len(list.Tasks) == 0 && len(left) > 0 {
		return TaskList{}, fmt.Errorf("the engine showed none of the %d tasks found: %w", len(left), err)
	}
	return list, nil
}

// errNotRead marks a task readAll did not read: MaxTasks were shown before it.
var errNotRead = errors.New("not read: the list was full")

// readAll reads found's tasks (loadRest), listReaders at a time in found's order, until
// MaxTasks of them are who's (the later ones are errNotRead): first each within a
// quarter of AnswerWithin, then the ones that took longer again, each within what is
// left of ctx. So tasks the engine is slow to show cost the others little: an outside
// tester's 25 slow tasks, each given AnswerWithin at once, used up a list's whole time
// and hid 25 that answered at once.
func (s *Service) readAll(ctx context.Context, found []admin.UserTask, who Identity) ([]Task, []error) {
	read, errs := make([]Task, len(found)), make([]error, len(found))
	var shown atomic.Int64
	pending := make([]int, len(found))
	for i := range pending {
		pending[i] = i
	}
	for _, limit := range []time.Duration{s.cfg.AnswerWithin / 4, 0} {
		cut := make([]bool, len(found)) // read given up at limit, the list's time not out
		var next atomic.Int64
		var wg sync.WaitGroup
		for range min(listReaders, len(pending)) {
			wg.Go(func() {
				for n := int(next.Add(1) - 1); n < len(pending); n = int(next.Add(1) - 1) {
					i := pending[n]
					if shown.Load() >= int64(s.cfg.MaxTasks) {
						read[i], errs[i] = Task{}, errNotRead
						continue
					}
					one, cancel := ctx, context.CancelFunc(func() {})
					if limit > 0 {
						one, cancel = context.WithTimeout(ctx, limit)
					}
					read[i], errs[i] = s.loadRest(one, &found[i])
					cut[i] = errs[i] != nil && one.Err() != nil && ctx.Err() == nil
					cancel()
					if errs[i] == nil && allowed(read[i], who) {
						shown.Add(1)
					}
				}
			})
		}
		wg.Wait()
		pending = slices.DeleteFunc(pending, func(i int) bool { return !cut[i] })
	}
	return read, errs
}

// findTasks queries who's waiting tasks (assigned, candidate user, candidate groups),
// each query newest first and at most MaxTasks, without standalone tasks (no process:
// they cannot be completed here).
func (s *Service) findTasks(ctx context.Context, who Identity) ([]admin.UserTask, error) {
	queries := []map[string]any{{"assignee": who.User}, {"candidateUser": who.User}}
	// The groups go in the query's body (POST /task), in chunks: a user in thousands of
	// groups outgrew the engine's URL and got 503 for ever.
	for chunk := range slices.Chunk(who.Groups, maxGroupsPerQuery) {
		queries = append(queries, map[string]any{"candidateGroups": chunk})
	}
	seen := map[string]bool{}
	var found []admin.UserTask
	for _, q := range queries {
		// Newest first, at most MaxTasks: a task just assigned or offered is always in the
		// list, however many older ones wait.
		q["sorting"] = []map[string]string{{"sortBy": "created", "sortOrder": "desc"}}
		ts, err := s.cfg.Engine.QueryUserTasks(ctx, q, s.cfg.MaxTasks)
		if err != nil {
			return nil, err
		}
		for _, ut := range ts {
			if seen[ut.ID] || ut.ProcessInstanceID == "" {
				continue
			}
			seen[ut.ID] = true
			found = append(found, ut)
		}
	}
	return found, nil
}

// logLimit lets a record through at most once per logEvery and counts the others: a
// stream of requests with bad tokens writes one record per interval, not one each.
type logLimit struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// logEvery is how often logLimit lets a record through.
const logEvery = 10 * time.Second

// allow reports whether a record may be written now, and how many were not since the
// last one.
func (l *logLimit) allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < logEvery {
		l.suppressed++
		return false, 0
	}
	l.last, suppressed, l.suppressed = now, l.suppressed, 0
	return true, suppressed
}

// maxGroupsPerQuery bounds the candidate groups of one task query (each is a bind
// parameter of the engine's SQL).
const maxGroupsPerQuery = 1000

func readBody(r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("the body could not be read (at most %d bytes)", limit)
	}
	return b, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}
