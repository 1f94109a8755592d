package humantask

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
)

// Scope is the ledger scope of a completion: its intents are "humantask.complete",
// keyed "<task id>/<command id>".
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
	// it has run out. Default 1m.
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
}

// Service completes Camunda 7 user tasks exactly once per command; see the package doc.
type Service struct {
	cfg    Config
	ledger *idempotency.Ledger
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
		cfg.Lease = time.Minute
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
		// answered 503 until an operator acts) is for a long outage only, not for the
		// ledger's defaults of 5 inconclusive reconciliations (1.5s of an engine not
		// answering, at this backoff) or 10 attempts cut off (service processes killed, or
		// a dispatch outlasting the lease under load): the load test put commands on hold
		// with those. At 100, the backoff doubling up to 102s, a hold comes after hours.
		MaxAttempts: 100, MaxReconciliations: 100,
		// The engine's history is the lookup, for as long as it keeps the task.
		ProviderWindow: 10 * 365 * 24 * time.Hour, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("humantask: %w", err)
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
	in := idempotency.Intent{Scope: Scope, Key: c.TaskID + "/" + c.ID,
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
	for {
		rec, err := s.ledger.Do(ctx, in, eff)
		a, wait := answerOf(rec, err)
		if wait == 0 || time.Now().Add(wait).After(deadline) {
			if wait > 0 {
				s.cfg.Logger.Warn("humantask: command not settled in time", slog.String("task", c.TaskID), slog.Any("error", err))
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
	}{{"the task id", c.TaskID, maxTaskID}, {"the Idempotency-Key", c.ID, maxCommand}, {"the user", who.User, maxUser}} {
		if err := checkName(f.what, f.s, f.limit); err != nil {
			return err
		}
	}
	return nil
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
		return *refusal(http.StatusUnprocessableEntity, "", "the Idempotency-Key was used with a different request", ""), 0
	case errors.Is(err, idempotency.ErrInvalidIntent):
		return *refusal(http.StatusBadRequest, "", "the command cannot be recorded as given", ""), 0
	case errors.Is(err, idempotency.ErrOperatorHold):
		return unsettled("the command is held for an operator", time.Minute), 0
	}
	wait = max(failure.Classify(err).RetryDelay, 50*time.Millisecond)
	wait = min(wait, time.Second)
	return unsettled("the command's outcome is not settled yet", wait), wait
}

// okResult is what the ledger records of a completion: its answer's body.
func okResult(a Answer) idempotency.Result {
	return idempotency.Result{Values: map[string]any{"body": string(a.Body)}}
}

// rejection records a refusal as the command's answer.
func rejection(a Answer) error { return idempotency.Rejected(strconv.Itoa(a.Status), string(a.Body)) }

// dispatch runs the completion-time checks and completes the task with the marker.
func (s *Service) dispatch(ctx context.Context, c Command, who Identity) (idempotency.Result, error) {
	t, err := s.load(ctx, c.TaskID)
	switch {
	case taskMissing(err):
		return s.settleGone(ctx, c, who)
	case err != nil:
		return idempotency.Result{}, idempotency.NotSent(err)
	}
	if a := checkCompletion(t, who, c.IfMatch, c.Form); a != nil {
		return idempotency.Result{}, rejection(*a)
	}
	if g := s.cfg.Guards[t.TaskDefinitionKey]; g != nil {
		if err := g(ctx, t, c.Form); err != nil {
			if ctx.Err() != nil {
				return idempotency.Result{}, idempotency.NotSent(err)
			}
			return idempotency.Result{}, rejection(*refusal(http.StatusUnprocessableEntity, t.ID, "refused by the task's business rule", err.Error()))
		}
	}
	err = s.cfg.Engine.CompleteUserTask(ctx, c.TaskID, engineVariables(c.Form, c.TaskID, c.ID, who.User))
	var answered *camunda7.Error
	switch {
	case err == nil:
		return okResult(completed(c.TaskID, c.ID, who.User)), nil
	case errors.As(err, &answered):
		// The engine refused it: nothing happened. Gone meanwhile (another command won the
		// race): settle from its history; still there: send again later.
		return s.settleGone(ctx, c, who)
	}
	return idempotency.Result{}, err // the outcome is unknown: reconciled next
}

// settleGone settles a command whose task the engine no longer has, or refused to
// complete, from the engine's state.
func (s *Service) settleGone(ctx context.Context, c Command, who Identity) (idempotency.Result, error) {
	st, err := s.engineState(ctx, c.TaskID)
	if err != nil {
		return idempotency.Result{}, idempotency.NotSent(err)
	}
	a, open := settle(st, c.TaskID, c.ID, who.User)
	switch {
	case open:
		return idempotency.Result{}, idempotency.NotSent(errors.New("the engine did not complete the task; it still waits"))
	case a.Status == http.StatusOK:
		return okResult(a), nil
	}
	return idempotency.Result{}, rejection(a)
}

// reconcile settles a command whose dispatch has an unknown outcome (a lost answer, a
// crash) from the engine: still waiting → sent again (after the checks, anew); completed
// by this command → completed; otherwise its 409 or 404. settled: the command's answer
// is decided.
func (s *Service) reconcile(ctx context.Context, c Command, who Identity) (r idempotency.Reconciliation, settled bool, err error) {
	st, err := s.engineState(ctx, c.TaskID)
	if err != nil {
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

// load reads a waiting task with its candidates and form variables; an error matching
// taskMissing when the engine has no such waiting task.
func (s *Service) load(ctx context.Context, id string) (Task, error) {
	t, err := s.cfg.Engine.UserTask(ctx, id)
	if err != nil {
		return Task{}, err
	}
	links, err := s.cfg.Engine.UserTaskIdentityLinks(ctx, id)
	if err != nil {
		return Task{}, s.goneMeanwhile(ctx, id, err)
	}
	vars, err := s.cfg.Engine.UserTaskFormVariables(ctx, id)
	if err != nil {
		return Task{}, s.goneMeanwhile(ctx, id, err)
	}
	return newTask(t, links, vars), nil
}

// goneMeanwhile is err, or the engine's not-found answer when the task went away between two
// reads (the engine answers those with a 500 or a 400, not a 404).
func (s *Service) goneMeanwhile(ctx context.Context, id string, err error) error {
	if _, again := s.cfg.Engine.UserTask(ctx, id); taskMissing(again) {
		return again
	}
	return err
}

// engineState asks the engine what became of a task: waiting, or its history and the
// marker its completion recorded.
func (s *Service) engineState(ctx context.Context, id string) (engineState, error) {
	_, err := s.cfg.Engine.UserTask(ctx, id)
	switch {
	case err == nil:
		return engineState{open: true}, nil
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

// who is r's sender, or the answer refusing r: 401 when it is unknown, 400 when its
// name cannot be stored.
func (s *Service) who(r *http.Request) (Identity, *Answer) {
	who, err := s.cfg.Identity.Identify(r)
	if err != nil {
		s.cfg.Logger.Info("humantask: request without a verified identity", slog.String("why", err.Error()))
		return Identity{}, refusal(http.StatusUnauthorized, "", "no verified identity", "")
	}
	if err := checkName("the user", who.User, maxUser); err != nil {
		return Identity{}, refusal(http.StatusBadRequest, "", err.Error(), "")
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
	c := Command{TaskID: r.PathValue("id"), ID: r.Header.Get("Idempotency-Key"), IfMatch: strings.TrimSpace(r.Header.Get("If-Match"))}
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
	if err := checkName("the task id", id, maxTaskID); err != nil {
		refusal(http.StatusBadRequest, "", err.Error(), "").write(w)
		return
	}
	t, err := s.load(r.Context(), id)
	switch {
	case taskMissing(err):
		refusal(http.StatusNotFound, id, "no such task", "").write(w)
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
	tasks, err := s.tasksOf(r.Context(), who)
	if err != nil {
		s.cfg.Logger.Warn("humantask: list tasks", slog.Any("error", err))
		unsettled("the engine could not be read", time.Second).write(w)
		return
	}
	writeJSON(w, map[string][]Task{"tasks": tasks})
}

// tasksOf lists who's tasks: assigned to who, or unassigned with who or one of its
// groups as a candidate; each read whole, as GET /tasks/{id} shows it.
func (s *Service) tasksOf(ctx context.Context, who Identity) ([]Task, error) {
	limit := strconv.Itoa(s.cfg.MaxTasks)
	queries := []url.Values{{"assignee": {who.User}}, {"candidateUser": {who.User}}}
	if len(who.Groups) > 0 {
		queries = append(queries, url.Values{"candidateGroups": {strings.Join(who.Groups, ",")}})
	}
	seen := map[string]bool{}
	out := []Task{}
	for _, q := range queries {
		q.Set("maxResults", limit)
		// Newest first, at most MaxTasks: a task just assigned or offered is always in the
		// list, however many older ones wait.
		q.Set("sortBy", "created")
		q.Set("sortOrder", "desc")
		ts, err := s.cfg.Engine.UserTasks(ctx, q)
		if err != nil {
			return nil, err
		}
		for _, ut := range ts {
			if seen[ut.ID] || len(out) >= s.cfg.MaxTasks {
				continue
			}
			seen[ut.ID] = true
			t, err := s.load(ctx, ut.ID)
			if taskMissing(err) {
				continue // completed meanwhile
			}
			if err != nil {
				return nil, err
			}
			if allowed(t, who) {
				out = append(out, t)
			}
		}
	}
	return out, nil
}

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
