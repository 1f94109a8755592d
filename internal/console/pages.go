package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/operate"
	"github.com/extworker/extworker/outbox"
)

// ---- login

type loginData struct{ Next string }

func (h *handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if h.opts.AuthHeader != "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	h.showLogin(w, r, http.StatusOK, "")
}

// showLogin renders the login form with a fresh pre-session token: the form's CSRF
// token is bound to a random cookie, so that another site cannot log a browser in.
func (h *handler) showLogin(w http.ResponseWriter, r *http.Request, status int, problem string) {
	nonce := randomToken()
	h.setCookie(w, r, &http.Cookie{Name: loginCookie, Value: nonce, Path: "/login", MaxAge: 3600})
	h.render(w, r, status, "login", identity{CSRF: h.sign("csrf", "login|"+nonce)},
		page{Title: "Log in", Error: problem, Data: loginData{Next: safeNext(r.FormValue("next"))}})
}

// login checks the form, throttled (see throttle), and answers with a redirect either
// way: to the page the operator came for, or back to the form saying why not.
func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	if h.opts.AuthHeader != "" {
		http.Error(w, "the console authenticates through its proxy", http.StatusNotFound)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	want := ""
	if c, err := r.Cookie(loginCookie); err == nil {
		want = h.sign("csrf", "login|"+c.Value)
	}
	if err := h.checkCSRF(r, want); err != nil {
		h.opts.Logger.Warn("console: login form refused", slog.String("remote", r.RemoteAddr), slog.String("why", err.Error()))
		h.showLogin(w, r, http.StatusForbidden, err.Error())
		return
	}
	name, password, next := strings.TrimSpace(r.PostFormValue("name")), r.PostFormValue("password"), safeNext(r.PostFormValue("next"))
	keys, now := h.loginKeys(r, name), h.now()
	if wait := h.limits.wait(now, keys...); wait > 0 {
		h.opts.Logger.Warn("console: login refused: too many failures", slog.String("operator", logName(name)), slog.String("remote", r.RemoteAddr))
		h.loginFailed(w, r, next, fmt.Sprintf("Too many failed logins for this name or from this address: try again in %s.", age((wait+time.Second-1).Truncate(time.Second))))
		return
	}
	operator, ok := h.checkPassword(name, password)
	if !ok {
		h.limits.fail(now, keys...)
		h.opts.Logger.Warn("console: login failed", slog.String("operator", logName(name)), slog.String("remote", r.RemoteAddr))
		h.loginFailed(w, r, next, "Unknown name or wrong password.")
		return
	}
	if strings.HasPrefix(keys[0].id, "device:") {
		h.limits.forget(keys[0])
	}
	h.startSession(w, r, operator)
	h.opts.Logger.Info("console: operator logged in", slog.String("operator", operator), slog.String("remote", r.RemoteAddr))
	http.Redirect(w, r, or(next, "/"), http.StatusSeeOther)
}

func (h *handler) loginFailed(w http.ResponseWriter, r *http.Request, next, why string) {
	h.redirect(w, r, loginPath(next), "", flash{Error: why})
}

// startSession sets the session cookie, marks the browser as one operator logged in
// from (a device cookie, kept when it is already theirs), and drops a form kept for
// another operator. The browser keeps the cookie an hour past the session's end
// (sessionGrace), so that a form sent just after it is kept for its operator (keepForm);
// the console takes it for nothing else.
func (h *handler) startSession(w http.ResponseWriter, r *http.Request, operator string) {
	s := session{Operator: operator, Expires: h.now().Add(h.opts.SessionTTL), Nonce: randomToken()}
	h.setCookie(w, r, &http.Cookie{Name: sessionCookie, Value: h.sign("session", s.encode()), Expires: s.Expires.Add(sessionGrace)})
	h.dropOthersDraft(w, r, operator)
	if _, ok := h.device(r, operator); !ok {
		h.setDevice(w, r, operator)
	}
	h.clearCookie(w, r, loginCookie, "/login")
}

// logName is a login name fit for a log line: what was typed may be anything, even a
// password typed into the wrong field, so only a plausible name is logged.
func logName(name string) string {
	if operatorName.MatchString(name) {
		return name
	}
	return "(not a valid name)"
}

// logout ends the session: revoked on the server until it would have expired, and the
// cookie removed.
func (h *handler) logout(w http.ResponseWriter, r *http.Request, id identity) {
	if id.Session {
		h.revoked.revoke(h.now(), session{Nonce: id.nonce, Expires: id.expires})
	}
	h.clearCookie(w, r, sessionCookie, "/")
	h.opts.Logger.Info("console: operator logged out", slog.String("operator", id.Operator))
	h.redirect(w, r, "/login", "", flash{Done: []string{"Logged out."}})
}

// loginPath is the login form's path, with the page to go back to after it.
func loginPath(next string) string {
	if next = safeNext(next); next == "" || next == "/" {
		return "/login"
	}
	return "/login?" + urlValues("next", next)
}

// safeNext is next when it is a page of this console (a path, not another site's URL,
// nor the login form itself), else "".
func safeNext(next string) string {
	u, err := url.Parse(next)
	switch {
	case err != nil || len(next) > 2048 || !validQuery(next) || visiblePlain(next) != next:
		return ""
	case !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, `/\`):
		return ""
	case u.Scheme != "" || u.Host != "" || u.Path == "/login":
		return ""
	}
	return next
}

// keepForm keeps, for after the login, a form whose session ended: sent with the
// session's cookie (signed by this console, for an operator in the file, expired or
// logged out since) and with that session's CSRF token, from a page of this console
// (its Origin or Referer says so). Anything less could be anyone's form, filled in for
// whoever logs in next in that browser: it is not kept. The draft names the session's
// operator, and only they get it back. It returns the page to go back to.
func (h *handler) keepForm(w http.ResponseWriter, r *http.Request) (string, bool) {
	s, ended := h.endedSession(r)
	if !ended {
		return "", false
	}
	origin := or(r.Header.Get("Origin"), r.Header.Get("Referer"))
	if origin == "" || !h.sameOrigin(r, origin) {
		return "", false
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := h.checkCSRF(r, h.sessionCSRF(s.Nonce)); err != nil {
		return "", false
	}
	d, ok := draftOf(r)
	if !ok {
		return "", false
	}
	d.Operator = s.Operator
	return intentPath(d.Scope, d.Key), h.setDraft(w, r, d)
}

// draftOf is the verdict or decision r's form holds, as typed.
func draftOf(r *http.Request) (draft, bool) {
	scope, key := r.PostFormValue("scope"), r.PostFormValue("key")
	if !validQuery(scope) || !validQuery(key) || scope == "" {
		return draft{}, false
	}
	d := draft{Scope: scope, Key: key}
	if r.URL.Path == "/intent/resolve" {
		f := readResolveForm(r)
		d.Resolve = &f
	} else if id, err := strconv.ParseInt(r.PathValue("id"), 10, 64); err == nil {
		d.Decide = &decideForm{ID: id, Approve: strings.HasSuffix(r.URL.Path, "/approve"), Reason: typed(r.PostFormValue("reason"))}
	} else {
		return draft{}, false
	}
	return d, true
}

// ---- overview

type overviewData struct {
	Unknown, Held, Orphaned []idempotency.Row
	Pending                 []idempotency.ResolutionRequest
	// Parked and Outbox are counts: the inbox's parked messages and conflicting copies
	// (of every source), the namespace's unpublished events.
	Parked, Retrying, Outbox int
	Limit                    int
	Problems                 []string
}

// Count is a queue's length as the overview shows it: "100+" when the queue was cut at
// its limit.
func (d overviewData) Count(n int) string {
	if n >= d.Limit {
		return strconv.Itoa(d.Limit) + "+"
	}
	return strconv.Itoa(n)
}

const queueLimit = 100

func (h *handler) overview(w http.ResponseWriter, r *http.Request, id identity) {
	ctx := r.Context()
	var d overviewData
	d.Limit = queueLimit
	note := func(what string, err error) {
		if err != nil {
			d.Problems = append(d.Problems, what+": "+err.Error())
		}
	}
	var err error
	d.Unknown, err = h.opts.Ledger.List(ctx, idempotency.Filter{States: []idempotency.State{idempotency.StateUnknown}, Limit: queueLimit})
	note("unknown intents", err)
	d.Held, err = h.opts.Ledger.List(ctx, idempotency.Filter{States: []idempotency.State{idempotency.StateOperatorHold}, Limit: queueLimit})
	note("held intents", err)
	d.Orphaned, err = h.opts.Ledger.List(ctx, idempotency.Filter{Orphaned: true, Limit: queueLimit})
	note("orphaned intents", err)
	d.Pending, err = h.opts.Ledger.Resolutions(ctx, idempotency.ResolutionFilter{Status: idempotency.ResolutionPending, Limit: queueLimit})
	note("pending resolutions", err)
	parked, err := inbox.ReadParked(ctx, h.opts.DB, "")
	note("parked inbox messages", err)
	d.Parked, d.Retrying = parked.Messages+parked.Conflicts, parked.Retrying
	backlog, err := outbox.ReadBacklog(ctx, h.opts.DB, h.opts.Ledger.Namespace())
	note("unpublished outbox events", err)
	d.Outbox = backlog.Unpublished
	h.render(w, r, http.StatusOK, "overview", id, page{Title: "Overview", Data: d})
}

// ---- one intent

type intentData struct {
	Namespace   string
	Row         idempotency.Row
	Events      []idempotency.Event
	Resolutions []idempotency.ResolutionRequest
	Engine      operate.View
	Instance    string // the process instance
	HasPending  bool
	// OrphanOpen: orphaned, and no closing verdict approved.
	OrphanOpen bool
	// Verdicts are the resolve form's choices; none when nothing can be resolved now.
	Verdicts []verdictOption
	Form     resolveForm // the resolve form as typed (a draft), or empty
	Decide   decideForm  // an approval's or rejection's form as typed
}

// DecideReason is the reason typed into resolution id's approve (or reject) form.
func (d intentData) DecideReason(id int64, approve bool) string {
	if d.Decide.ID == id && d.Decide.Approve == approve {
		return refill(d.Decide.Reason)
	}
	return ""
}

// verdictOption is one of the resolve form's verdicts.
type verdictOption struct {
	Value, Label string
	Needs        string // why it needs a second operator, if it does
	Checked      bool
}

type resolveForm struct {
	As, ProviderRef, ErrorCode, Values, Reason string
}

func (h *handler) intent(w http.ResponseWriter, r *http.Request, id identity) {
	scope, key := r.URL.Query().Get("scope"), r.URL.Query().Get("key")
	if !validQuery(scope) || !validQuery(key) {
		h.render(w, r, http.StatusBadRequest, "error", id, page{Title: "Intent", Error: "scope and key: UTF-8 text without NUL, at most 4096 bytes each"})
		return
	}
	d, err := h.intentData(r.Context(), scope, key)
	if err != nil {
		st := http.StatusInternalServerError
		if errors.Is(err, idempotency.ErrNotFound) {
			st = http.StatusNotFound
		}
		h.render(w, r, st, "error", id, page{Title: "Intent", Error: err.Error()})
		return
	}
	if dr, ok := h.takeDraft(w, r, scope, key, id.Operator); ok {
		d.refill(dr)
	}
	p := page{Title: d.Row.Scope + " / " + d.Row.Key, Data: d}
	if len(d.problems) > 0 {
		p.Error = strings.Join(d.problems, "; ")
	}
	h.render(w, r, http.StatusOK, "intent", id, p)
}

// intentPage is intentData with what could not be read.
type intentPage struct {
	intentData
	problems []string
}

// intentData reads an intent, its events and resolutions, and the engine's view of it.
func (h *handler) intentData(ctx context.Context, scope, key string) (intentPage, error) {
	l := h.opts.Ledger
	row, err := l.Get(ctx, scope, key)
	if err != nil {
		return intentPage{}, err
	}
	d := intentPage{intentData: intentData{Namespace: l.Namespace(), Row: row}}
	if d.Events, err = l.Events(ctx, scope, key); err != nil {
		d.problems = append(d.problems, "events: "+err.Error())
	}
	if d.Resolutions, err = l.Resolutions(ctx, idempotency.ResolutionFilter{Scope: scope, Key: key}); err != nil {
		d.problems = append(d.problems, "resolutions: "+err.Error())
	}
	closed := false
	for _, res := range d.Resolutions {
		d.HasPending = d.HasPending || res.Status == idempotency.ResolutionPending
		closed = closed || res.As == idempotency.VerdictClose && res.Status == idempotency.ResolutionApproved
	}
	d.OrphanOpen = row.OrphanedAt != nil && !closed
	d.Verdicts = h.verdictOptions(d.intentData)
	d.Engine = h.opts.Engine.View(ctx, row)
	d.Instance = d.Engine.ProcessInstanceID(row)
	return d, nil
}

// refill puts a draft into the page's forms.
func (d *intentPage) refill(dr draft) {
	if dr.Resolve != nil {
		d.Form = *dr.Resolve
		for i := range d.Verdicts {
			d.Verdicts[i].Checked = d.Verdicts[i].Value == d.Form.As
		}
	}
	if dr.Decide != nil {
		d.Decide = *dr.Decide
	}
}

// verdicts are the resolve form's verdicts: the form's values, the ledger's verdicts,
// and what each means.
var verdicts = []struct {
	value string
	as    idempotency.State
	label string
}{
	{"confirmed", idempotency.StateConfirmed, "confirmed: the provider has it"},
	{"rejected", idempotency.StateRejected, "rejected: it did not happen and will not"},
	{"retry", idempotency.StatePrepared, "retry: the provider never got it; send again with the same key"},
	{"close", idempotency.VerdictClose, "close the orphan: dealt with outside the ledger (compensated, refunded by hand, or accepted); the intent keeps its state"},
}

// verdictOptions are the verdicts d's intent can take now: none while one is pending;
// confirmed, rejected and retry for an unknown or held intent; close for an open
// orphan, whatever its state.
func (h *handler) verdictOptions(d intentData) []verdictOption {
	if d.HasPending {
		return nil
	}
	doubt := d.Row.State == idempotency.StateUnknown || d.Row.State == idempotency.StateOperatorHold
	var out []verdictOption
	for _, v := range verdicts {
		if v.as == idempotency.VerdictClose && !d.OrphanOpen || v.as != idempotency.VerdictClose && !doubt {
			continue
		}
		o := verdictOption{Value: v.value, Label: v.label}
		if need, why := h.opts.Ledger.ApprovalNeeded(d.Row, v.as); need {
			o.Needs = why
		}
		out = append(out, o)
	}
	return out
}

// resolve records the logged-in operator's verdict, and answers with a redirect to the
// intent's page, which says what happened (and has the form as typed after a refusal).
func (h *handler) resolve(w http.ResponseWriter, r *http.Request, id identity) {
	scope, key := r.PostFormValue("scope"), r.PostFormValue("key")
	if !validQuery(scope) || !validQuery(key) {
		h.render(w, r, http.StatusBadRequest, "error", id, page{Title: "Resolve", Error: "scope and key: UTF-8 text without NUL, at most 4096 bytes each"})
		return
	}
	form, back := readResolveForm(r), intentPath(scope, key)
	keep := draft{Scope: scope, Key: key, Operator: id.Operator, Resolve: &form}
	res, problem := form.resolution(id.Operator)
	if problem != "" {
		h.refuse(w, r, id.Operator, back, problem, keep)
		return
	}
	out, err := h.opts.Ledger.Resolve(r.Context(), scope, key, res)
	if err != nil {
		h.opts.Logger.Warn("console: resolution refused", slog.String("operator", id.Operator), slog.Any("error", err))
		h.refuse(w, r, id.Operator, back, err.Error(), keep)
		return
	}
	f := flash{}
	if out.Pending != nil {
		h.opts.Logger.Info("console: resolution requested", slog.String("operator", id.Operator), slog.Int64("resolution", out.Pending.ID))
		f.Done = []string{fmt.Sprintf("Resolution #%d recorded: %s. The intent stays %s until a second operator approves it.",
			out.Pending.ID, form.As, out.Row.State)}
	} else {
		act := h.opts.Engine.ResumeTask(r.Context(), out.Row)
		h.opts.Logger.Info("console: resolution applied", slog.String("operator", id.Operator), slog.String("engine_action", act.Action))
		f.Done, f.Action = []string{fmt.Sprintf("The intent is now %s, by operator:%s.", out.Row.State, id.Operator)}, &act
	}
	h.done(w, r, id.Operator, back, f)
}

// done answers operator's form that did what it said: to back, saying what.
func (h *handler) done(w http.ResponseWriter, r *http.Request, operator, back string, f flash) {
	h.redirect(w, r, back, operator, f)
}

// refuse answers operator's form that was refused: to back, saying why, with the form as
// typed.
func (h *handler) refuse(w http.ResponseWriter, r *http.Request, operator, back, why string, keep draft) {
	if (keep.Resolve != nil || keep.Decide != nil) && !h.setDraft(w, r, keep) {
		why += " (The form was too long to keep; type it again.)"
	}
	h.redirect(w, r, back, operator, flash{Error: why})
}

func readResolveForm(r *http.Request) resolveForm {
	return resolveForm{As: r.PostFormValue("as"), ProviderRef: typed(r.PostFormValue("provider_ref")), ErrorCode: typed(r.PostFormValue("error_code")),
		Values: typed(r.PostFormValue("values")), Reason: typed(r.PostFormValue("reason"))}
}

// resolution is the verdict the form gives, or why the console refuses it ("" when it
// does not). Fields are stored as shown: trimmed, and refused when they hold what a
// reader could not see.
func (f resolveForm) resolution(operator string) (idempotency.Resolution, string) {
	var problems []string
	note := func(err error) {
		if err != nil {
			problems = append(problems, err.Error())
		}
	}
	note(fieldProviderRef.check(f.ProviderRef))
	note(fieldErrorCode.check(f.ErrorCode))
	note(fieldValues.check(f.Values))
	note(reasonProblem(f.Reason))
	res := idempotency.Resolution{ProviderRef: strings.TrimSpace(f.ProviderRef), ErrorCode: strings.TrimSpace(f.ErrorCode),
		Reason: strings.TrimSpace(f.Reason), Operator: operator}
	values, err := parseValues(f.Values)
	note(err)
	res.Values = values
	for _, v := range verdicts {
		if v.value == f.As {
			res.As = v.as
		}
	}
	note(resolution(res).consistent())
	return res, strings.Join(problems, "; ")
}

// reasonProblem is why a typed reason is refused, or nil.
func reasonProblem(reason string) error {
	if err := fieldReason.check(reason); err != nil {
		return err
	}
	if strings.TrimSpace(reason) == "" {
		return errors.New("a reason is required (what you checked, for the audit trail)")
	}
	return nil
}

// consistent is nil when the verdict and its fields go together.
func (res resolution) consistent() error {
	ref, code, values := res.ProviderRef != "", res.ErrorCode != "", len(res.Values) > 0
	switch res.As {
	case "":
		return errors.New("choose a verdict: confirmed, rejected, retry, or close for an orphan")
	case idempotency.StateConfirmed:
		if !ref {
			return errors.New("confirming needs the provider's reference")
		}
		if code {
			return errors.New("an error code goes only with rejected")
		}
	case idempotency.StateRejected:
		if values {
			return errors.New("result values go only with confirmed")
		}
	default:
		if ref || code || values {
			return fmt.Errorf("%s takes no provider reference, error code or values", verdictLabel(res.As))
		}
	}
	return nil
}

// resolution is the ledger's, with the form's checks.
type resolution idempotency.Resolution

// decide approves or rejects a pending resolution as the logged-in operator, and
// answers with a redirect to the intent's page.
func (h *handler) decide(w http.ResponseWriter, r *http.Request, id identity) {
	approving := strings.HasSuffix(r.URL.Path, "/approve")
	rid, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || rid <= 0 {
		h.render(w, r, http.StatusNotFound, "error", id, page{Title: "Resolution", Error: "no such resolution"})
		return
	}
	req, err := h.opts.Ledger.Resolution(r.Context(), rid)
	if err != nil {
		h.refuse(w, r, id.Operator, "/resolutions", err.Error(), draft{})
		return
	}
	back := intentPath(req.Scope, req.Key)
	form := decideForm{ID: rid, Approve: approving, Reason: typed(r.PostFormValue("reason"))}
	keep := draft{Scope: req.Scope, Key: req.Key, Operator: id.Operator, Decide: &form}
	if err := reasonProblem(form.Reason); err != nil {
		h.refuse(w, r, id.Operator, back, err.Error(), keep)
		return
	}
	d := idempotency.Decision{Operator: id.Operator, Reason: strings.TrimSpace(form.Reason)}
	if approving {
		h.approve(w, r, id, req, d, back, keep)
	} else {
		h.reject(w, r, id, req, d, back, keep)
	}
}

// approve applies req as the second operator; the engine gets the task's retry back,
// unless the verdict closed an orphan (its task is gone).
func (h *handler) approve(w http.ResponseWriter, r *http.Request, id identity, req idempotency.ResolutionRequest, d idempotency.Decision,
	back string, keep draft) {
	out, err := h.opts.Ledger.Approve(r.Context(), req.ID, d)
	if err != nil {
		h.opts.Logger.Warn("console: approval refused", slog.String("operator", id.Operator), slog.Int64("resolution", req.ID), slog.Any("error", err))
		h.refuse(w, r, id.Operator, back, err.Error(), keep)
		return
	}
	f := flash{Done: []string{fmt.Sprintf("Resolution #%d approved: the intent is now %s.", req.ID, out.Row.State)}}
	if req.As == idempotency.VerdictClose {
		f.Done = []string{fmt.Sprintf("Resolution #%d approved: the orphan is closed; the intent stays %s.", req.ID, out.Row.State)}
	} else {
		act := h.opts.Engine.ResumeTask(r.Context(), out.Row)
		f.Action = &act
	}
	h.opts.Logger.Info("console: resolution approved", slog.String("operator", id.Operator), slog.Int64("resolution", req.ID))
	h.done(w, r, id.Operator, back, f)
}

// reject turns req down (or withdraws it, when it is the operator's own).
func (h *handler) reject(w http.ResponseWriter, r *http.Request, id identity, req idempotency.ResolutionRequest, d idempotency.Decision,
	back string, keep draft) {
	if _, err := h.opts.Ledger.RejectResolution(r.Context(), req.ID, d); err != nil {
		h.refuse(w, r, id.Operator, back, err.Error(), keep)
		return
	}
	h.opts.Logger.Info("console: resolution rejected", slog.String("operator", id.Operator), slog.Int64("resolution", req.ID))
	verb := "rejected"
	if strings.EqualFold(req.RequestedBy, id.Operator) {
		verb = "withdrawn"
	}
	h.done(w, r, id.Operator, back, flash{Done: []string{fmt.Sprintf("Resolution #%d %s; the intent is unchanged.", req.ID, verb)}})
}

// valueName is what a result value may be called: a process variable's name.
var valueName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,63}$`)

// parseValues reads the resolve form's result values: NAME=VALUE, one a line, each
// name once.
func parseValues(s string) (map[string]any, error) {
	out := map[string]any{}
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		name = strings.TrimSpace(name)
		switch {
		case !ok || !valueName.MatchString(name):
			return nil, fmt.Errorf("values line %d: want NAME=VALUE, the name of letters, digits and _.- (a letter or _ first)", i+1)
		case out[name] != nil:
			return nil, fmt.Errorf("values line %d: %s is given twice", i+1, name)
		}
		out[name] = strings.TrimSpace(value)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// ---- resolutions

type resolutionsData struct {
	Status      string
	Statuses    []string
	Resolutions []idempotency.ResolutionRequest
	Empty       string
}

func (h *handler) resolutions(w http.ResponseWriter, r *http.Request, id identity) {
	status := r.URL.Query().Get("status")
	if status == "" {
		status = "all"
	}
	d := resolutionsData{Status: status, Statuses: []string{"all", "pending", "approved", "rejected", "stale"}}
	p := page{Title: "Resolutions", Data: &d}
	filter := idempotency.ResolutionStatus(status)
	switch filter {
	case "all":
		filter = ""
	case idempotency.ResolutionPending, idempotency.ResolutionApproved, idempotency.ResolutionRejected, idempotency.ResolutionStale:
	default:
		d.Status = "all"
		p.Error = "status: want all, pending, approved, rejected or stale (nothing is all)"
		h.render(w, r, http.StatusBadRequest, "resolutions", id, p)
		return
	}
	var err error
	if d.Resolutions, err = h.opts.Ledger.Resolutions(r.Context(), idempotency.ResolutionFilter{Status: filter}); err != nil {
		p.Error = err.Error()
	}
	d.Empty = "No resolutions."
	if filter != "" {
		d.Empty = "No " + status + " resolutions."
	}
	h.render(w, r, http.StatusOK, "resolutions", id, p)
}

// ---- inbox and outbox

func (h *handler) inboxPage(w http.ResponseWriter, r *http.Request, id identity) {
	var p page
	type data struct{ Parked, Retrying []inbox.Record }
	var d data
	var err error
	if d.Parked, err = inbox.List(r.Context(), h.opts.DB, inbox.Filter{Parked: true}); err != nil {
		p.Error = err.Error()
	}
	if d.Retrying, err = inbox.List(r.Context(), h.opts.DB, inbox.Filter{States: []inbox.State{inbox.StateFailedRetryable, inbox.StateUnknown}}); err != nil {
		p.Error = joinErr(p.Error, err.Error())
	}
	p.Title, p.Data = "Inbox", d
	h.render(w, r, http.StatusOK, "inbox", id, p)
}

func (h *handler) outboxPage(w http.ResponseWriter, r *http.Request, id identity) {
	var p page
	rows, err := outbox.ReadUnpublished(r.Context(), h.opts.DB, h.opts.Ledger.Namespace(), queueLimit)
	if err != nil {
		p.Error = err.Error()
	}
	p.Title, p.Data = "Outbox", rows
	h.render(w, r, http.StatusOK, "outbox", id, p)
}

// ---- helpers

func joinErr(a, b string) string {
	if a == "" {
		return b
	}
	if b == "" {
		return a
	}
	return a + "; " + b
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func urlValues(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v.Encode()
}

// intentPath is an intent's page.
func intentPath(scope, key string) string { return "/intent?" + urlValues("scope", scope, "key", key) }

// cockpitInstance links to a process instance's runtime view in Cockpit.
func (h *handler) cockpitInstance(id string) string {
	if h.opts.CockpitURL == "" || id == "" {
		return ""
	}
	return strings.TrimSuffix(h.opts.CockpitURL, "/") + "/app/cockpit/default/#/process-instance/" + url.PathEscape(id) + "/runtime"
}
