package console

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/operate"
	"github.com/extworker/extworker/outbox"
)

// ---- login

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
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: nonce, Path: "/login", HttpOnly: true, Secure: h.opts.SecureCookies,
		SameSite: http.SameSiteStrictMode, MaxAge: 3600})
	h.render(w, r, status, "login", identity{CSRF: h.sign("csrf", "login|"+nonce)}, page{Title: "Log in", Error: problem})
}

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
	name, password := strings.TrimSpace(r.PostFormValue("name")), r.PostFormValue("password")
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	now := h.now()
	keys := []string{"name:" + strings.ToLower(name), "addr:" + host}
	if h.limits.blocked(now, keys...) {
		h.opts.Logger.Warn("console: login refused: too many failures", slog.String("operator", logName(name)), slog.String("remote", r.RemoteAddr))
		h.showLogin(w, r, http.StatusTooManyRequests, fmt.Sprintf("Too many failed logins for this name or address; try again in %v.", failureWindow))
		return
	}
	operator, ok := h.checkPassword(name, password)
	if !ok {
		h.limits.fail(now, keys...)
		h.opts.Logger.Warn("console: login failed", slog.String("operator", logName(name)), slog.String("remote", r.RemoteAddr))
		h.showLogin(w, r, http.StatusUnauthorized, "Unknown name or wrong password.")
		return
	}
	s := session{Operator: operator, Expires: now.Add(h.opts.SessionTTL), Nonce: randomToken()}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: h.sign("session", s.encode()), Path: "/", HttpOnly: true,
		Secure: h.opts.SecureCookies, SameSite: http.SameSiteStrictMode, Expires: s.Expires})
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: "", Path: "/login", MaxAge: -1})
	h.opts.Logger.Info("console: operator logged in", slog.String("operator", operator), slog.String("remote", r.RemoteAddr))
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// logName is a login name fit for a log line: what was typed may be anything, even a
// password typed into the wrong field, so only a plausible name is logged.
func logName(name string) string {
	if operatorName.MatchString(name) {
		return name
	}
	return "(not a valid name)"
}

func (h *handler) logout(w http.ResponseWriter, r *http.Request, id identity) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: h.opts.SecureCookies,
		SameSite: http.SameSiteStrictMode})
	h.opts.Logger.Info("console: operator logged out", slog.String("operator", id.Operator))
	http.Redirect(w, r, "/login", http.StatusSeeOther)
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
	Namespace      string
	Row            idempotency.Row
	Events         []idempotency.Event
	Resolutions    []idempotency.ResolutionRequest
	Engine         operate.View
	Instance       string // the process instance
	Resolvable     bool   // unknown or held, and nothing pending
	HasPending     bool
	ApprovalNeeded map[string]string // verdict -> why it needs a second operator
	Action         *operate.Action   // what was done in the engine after a verdict applied
	Form           resolveForm       // the resolve form, as last submitted
}

type resolveForm struct {
	As, ProviderRef, ErrorCode, Values, Reason string
}

func (h *handler) intent(w http.ResponseWriter, r *http.Request, id identity) {
	scope, key := r.URL.Query().Get("scope"), r.URL.Query().Get("key")
	h.showIntent(w, r, id, scope, key, http.StatusOK, page{}, nil, resolveForm{})
}

// showIntent renders the intent's page, with what an action did (p.Done, act) or why it
// was refused (p.Error, status).
func (h *handler) showIntent(w http.ResponseWriter, r *http.Request, id identity, scope, key string, status int, p page,
	act *operate.Action, form resolveForm) {
	ctx := r.Context()
	l := h.opts.Ledger
	row, err := l.Get(ctx, scope, key)
	if err != nil {
		st := http.StatusInternalServerError
		if errors.Is(err, idempotency.ErrNotFound) {
			st = http.StatusNotFound
		}
		h.render(w, r, st, "error", id, page{Title: "Intent", Error: joinErr(p.Error, err.Error())})
		return
	}
	d := intentData{Namespace: l.Namespace(), Row: row, Action: act, Form: form, ApprovalNeeded: map[string]string{}}
	var problems []string
	if d.Events, err = l.Events(ctx, scope, key); err != nil {
		problems = append(problems, "events: "+err.Error())
	}
	if d.Resolutions, err = l.Resolutions(ctx, idempotency.ResolutionFilter{Scope: scope, Key: key}); err != nil {
		problems = append(problems, "resolutions: "+err.Error())
	}
	for _, res := range d.Resolutions {
		if res.Status == idempotency.ResolutionPending {
			d.HasPending = true
		}
	}
	d.Resolvable = (row.State == idempotency.StateUnknown || row.State == idempotency.StateOperatorHold) && !d.HasPending
	for _, as := range []idempotency.State{idempotency.StateConfirmed, idempotency.StateRejected, idempotency.StatePrepared} {
		if need, why := l.ApprovalNeeded(row, as); need {
			d.ApprovalNeeded[verdictName(as)] = why
		}
	}
	d.Engine = h.opts.Engine.View(ctx, row)
	d.Instance = d.Engine.ProcessInstanceID(row)
	p.Title, p.Data = row.Scope+" / "+row.Key, d
	if len(problems) > 0 {
		p.Error = joinErr(p.Error, strings.Join(problems, "; "))
	}
	h.render(w, r, status, "intent", id, p)
}

// resolve records the logged-in operator's verdict.
func (h *handler) resolve(w http.ResponseWriter, r *http.Request, id identity) {
	scope, key := r.PostFormValue("scope"), r.PostFormValue("key")
	form := resolveForm{As: r.PostFormValue("as"), ProviderRef: strings.TrimSpace(r.PostFormValue("provider_ref")),
		ErrorCode: strings.TrimSpace(r.PostFormValue("error_code")), Values: r.PostFormValue("values"), Reason: r.PostFormValue("reason")}
	res := idempotency.Resolution{ProviderRef: form.ProviderRef, ErrorCode: form.ErrorCode, Reason: form.Reason, Operator: id.Operator}
	var problems []string
	switch form.As {
	case "confirmed":
		res.As = idempotency.StateConfirmed
	case "rejected":
		res.As = idempotency.StateRejected
	case "retry":
		res.As = idempotency.StatePrepared
	default:
		problems = append(problems, "choose a verdict: confirmed, rejected or retry")
	}
	values, err := parseValues(form.Values)
	if err != nil {
		problems = append(problems, err.Error())
	}
	res.Values = values
	if strings.TrimSpace(form.Reason) == "" {
		problems = append(problems, "a reason is required (what you checked, for the audit trail)")
	}
	if res.As == idempotency.StateConfirmed && form.ProviderRef == "" {
		problems = append(problems, "confirming needs the provider's reference")
	}
	if res.As != idempotency.StateRejected && form.ErrorCode != "" {
		problems = append(problems, "an error code goes only with rejected")
	}
	if res.As != idempotency.StateConfirmed && len(values) > 0 || res.As == idempotency.StatePrepared && form.ProviderRef != "" {
		problems = append(problems, "the provider reference and values go with confirmed")
	}
	if len(problems) > 0 {
		h.showIntent(w, r, id, scope, key, http.StatusBadRequest, page{Error: strings.Join(problems, "; ")}, nil, form)
		return
	}
	out, err := h.opts.Ledger.Resolve(r.Context(), scope, key, res)
	if err != nil {
		h.opts.Logger.Warn("console: resolution refused", slog.String("operator", id.Operator), slog.String("idempotency_scope", scope),
			slog.Any("error", err))
		h.showIntent(w, r, id, scope, key, statusOf(err), page{Error: err.Error()}, nil, form)
		return
	}
	if out.Pending != nil {
		h.opts.Logger.Info("console: resolution requested", slog.String("operator", id.Operator), slog.Int64("resolution", out.Pending.ID))
		h.showIntent(w, r, id, scope, key, http.StatusOK, page{Done: []string{fmt.Sprintf(
			"Resolution #%d recorded: %s. The intent stays %s until a second operator approves it.", out.Pending.ID, out.Pending.VerdictText(), out.Row.State)}},
			nil, resolveForm{})
		return
	}
	act := h.opts.Engine.ResumeTask(r.Context(), out.Row)
	h.opts.Logger.Info("console: resolution applied", slog.String("operator", id.Operator), slog.String("engine_action", act.Action))
	h.showIntent(w, r, id, scope, key, http.StatusOK, page{Done: []string{fmt.Sprintf("The intent is now %s, by operator:%s.", out.Row.State, id.Operator)}},
		&act, resolveForm{})
}

// decide approves or rejects a pending resolution as the logged-in operator.
func (h *handler) decide(w http.ResponseWriter, r *http.Request, id identity) {
	approving := strings.HasSuffix(r.URL.Path, "/approve")
	rid, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || rid <= 0 {
		h.render(w, r, http.StatusNotFound, "error", id, page{Title: "Resolution", Error: "no such resolution"})
		return
	}
	ctx := r.Context()
	req, err := h.opts.Ledger.Resolution(ctx, rid)
	if err != nil {
		h.render(w, r, statusOf(err), "error", id, page{Title: "Resolution", Error: err.Error()})
		return
	}
	d := idempotency.Decision{Operator: id.Operator, Reason: r.PostFormValue("reason")}
	if strings.TrimSpace(d.Reason) == "" {
		h.showIntent(w, r, id, req.Scope, req.Key, http.StatusBadRequest, page{Error: "a reason is required (what you checked, for the audit trail)"}, nil, resolveForm{})
		return
	}
	if !approving {
		if _, err := h.opts.Ledger.RejectResolution(ctx, rid, d); err != nil {
			h.showIntent(w, r, id, req.Scope, req.Key, statusOf(err), page{Error: err.Error()}, nil, resolveForm{})
			return
		}
		h.opts.Logger.Info("console: resolution rejected", slog.String("operator", id.Operator), slog.Int64("resolution", rid))
		h.showIntent(w, r, id, req.Scope, req.Key, http.StatusOK, page{Done: []string{fmt.Sprintf("Resolution #%d rejected; the intent is unchanged.", rid)}},
			nil, resolveForm{})
		return
	}
	out, err := h.opts.Ledger.Approve(ctx, rid, d)
	if err != nil {
		h.opts.Logger.Warn("console: approval refused", slog.String("operator", id.Operator), slog.Int64("resolution", rid), slog.Any("error", err))
		h.showIntent(w, r, id, req.Scope, req.Key, statusOf(err), page{Error: err.Error()}, nil, resolveForm{})
		return
	}
	act := h.opts.Engine.ResumeTask(ctx, out.Row)
	h.opts.Logger.Info("console: resolution approved", slog.String("operator", id.Operator), slog.Int64("resolution", rid),
		slog.String("engine_action", act.Action))
	h.showIntent(w, r, id, req.Scope, req.Key, http.StatusOK, page{Done: []string{fmt.Sprintf(
		"Resolution #%d approved: the intent is now %s.", rid, out.Row.State)}}, &act, resolveForm{})
}

// statusOf is the HTTP status of a ledger error.
func statusOf(err error) int {
	switch {
	case errors.Is(err, idempotency.ErrSelfApproval):
		return http.StatusForbidden
	case errors.Is(err, idempotency.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, idempotency.ErrNotPending), errors.Is(err, idempotency.ErrStaleResolution):
		return http.StatusConflict
	}
	return http.StatusUnprocessableEntity
}

// parseValues reads the resolve form's result values: NAME=VALUE, one a line.
func parseValues(s string) (map[string]any, error) {
	out := map[string]any{}
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("values line %d: want NAME=VALUE", i+1)
		}
		out[strings.TrimSpace(name)] = strings.TrimSpace(value)
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
}

func (h *handler) resolutions(w http.ResponseWriter, r *http.Request, id identity) {
	status := r.URL.Query().Get("status")
	d := resolutionsData{Status: status, Statuses: []string{"", "pending", "approved", "rejected", "stale"}}
	var p page
	switch idempotency.ResolutionStatus(status) {
	case "", idempotency.ResolutionPending, idempotency.ResolutionApproved, idempotency.ResolutionRejected, idempotency.ResolutionStale:
		var err error
		if d.Resolutions, err = h.opts.Ledger.Resolutions(r.Context(), idempotency.ResolutionFilter{Status: idempotency.ResolutionStatus(status)}); err != nil {
			p.Error = err.Error()
		}
	default:
		p.Error = "status: want pending, approved, rejected or stale"
	}
	p.Title, p.Data = "Resolutions", d
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
	if d.Retrying, err = inbox.List(r.Context(), h.opts.DB, inbox.Filter{States: []inbox.State{inbox.StateFailedRetryable, inbox.StateUnknownOutcome}}); err != nil {
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
	return a + "; " + b
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// verdictName is the form's name of a verdict.
func verdictName(s idempotency.State) string {
	if s == idempotency.StatePrepared {
		return "retry"
	}
	return string(s)
}

func urlValues(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v.Encode()
}

// cockpitInstance links to a process instance's runtime view in Cockpit.
func (h *handler) cockpitInstance(id string) string {
	if h.opts.CockpitURL == "" || id == "" {
		return ""
	}
	return strings.TrimSuffix(h.opts.CockpitURL, "/") + "/app/cockpit/default/#/process-instance/" + url.PathEscape(id) + "/runtime"
}

// age says how long ago t was, e.g. "3m12s", "5h4m", "3d2h".
func age(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Hour:
		return d.Truncate(time.Second).String()
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// ago is age with "ago", or "just now".
func ago(now, t time.Time) string {
	if a := age(now, t); a != "just now" {
		return a + " ago"
	}
	return "just now"
}
