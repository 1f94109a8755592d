package taskpage

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/internal/termsafe"
	"github.com/extworker/extworker/internal/webtrust"
)

// Config configures the page.
type Config struct {
	// Service completes the tasks. Required.
	Service *humantask.Service
	// Path is where the pages are served; default "/ui". The service's API (/tasks) may
	// be served beside it on the same listener.
	Path string
	// MaxForm bounds a posted form; default 64 KiB.
	MaxForm int64
	// CommandTimeout bounds a completion, which runs to its answer even when the browser
	// drops the request; default 1m.
	CommandTimeout time.Duration
	// Logger: default discard. It never receives a form.
	Logger *slog.Logger
}

type page struct {
	cfg Config
}

// New returns the page's handler, serving cfg.Path and below.
func New(cfg Config) (http.Handler, error) {
	if cfg.Service == nil {
		return nil, errors.New("taskpage: Config needs Service")
	}
	if cfg.Path == "" {
		cfg.Path = "/ui"
	}
	if !strings.HasPrefix(cfg.Path, "/") {
		return nil, fmt.Errorf("taskpage: Path %q must begin with /", cfg.Path)
	}
	cfg.Path = strings.TrimSuffix(cfg.Path, "/")
	if cfg.MaxForm == 0 {
		cfg.MaxForm = 64 << 10
	}
	if cfg.CommandTimeout == 0 {
		cfg.CommandTimeout = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &page{cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+cfg.Path+"/{$}", p.list)
	mux.HandleFunc("GET "+cfg.Path+"/tasks/{id}", p.form)
	mux.HandleFunc("POST "+cfg.Path+"/tasks/{id}", p.complete)
	if cfg.Path != "" {
		mux.Handle("GET "+cfg.Path, http.RedirectHandler(cfg.Path+"/", http.StatusSeeOther))
	}
	return secured(mux), nil
}

// secured sets the headers every page carries: no scripts, no framing, forms posted
// to this origin only.
func secured(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src '"+styleHash+"'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}

// who is the caller (the service's identity: Service.Identify), or false after a 401
// page (400 for a user whose name cannot be used).
func (p *page) who(w http.ResponseWriter, r *http.Request) (humantask.Identity, bool) {
	id, err := p.cfg.Service.Identify(r)
	if errors.Is(err, humantask.ErrUnusableIdentity) {
		p.render(w, http.StatusBadRequest, "message", view{Title: "Unusable identity", Message: "The portal names you in a way tasks cannot be recorded for (control characters, invalid UTF-8, or too long). Ask its administrator."})
		return humantask.Identity{}, false
	}
	if err != nil { // logged by the service (Service.Identify)
		p.render(w, http.StatusUnauthorized, "message", view{Title: "Not signed in", Message: "Your identity could not be verified. Sign in again through the portal."})
		return humantask.Identity{}, false
	}
	return id, true
}

func (p *page) list(w http.ResponseWriter, r *http.Request) {
	who, ok := p.who(w, r)
	if !ok {
		return
	}
	list, err := p.cfg.Service.Tasks(r.Context(), who)
	if err != nil {
		p.cfg.Logger.Warn("taskpage: list tasks", slog.Any("error", err))
		p.render(w, http.StatusServiceUnavailable, "message", view{User: who.User, Title: "Tasks unavailable", Message: "The engine could not be read. Try again in a moment."})
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	v := view{User: who.User, Title: "Your tasks", Tasks: list.Tasks}
	if list.Unavailable > 0 {
		v.Note = fmt.Sprintf("%d more of your tasks could not be shown just now; reload the page in a moment.", list.Unavailable)
	}
	p.render(w, http.StatusOK, "list", v)
}

// form renders one task's form for the command its address names (?command=, minted
// by a redirect when absent): loading that address again, as the back button does,
// brings the same command back, or, once the command was sent, its answer.
func (p *page) form(w http.ResponseWriter, r *http.Request) {
	who, ok := p.who(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	command := r.URL.Query().Get("command")
	if !validCommandID(command) {
		http.Redirect(w, r, p.cfg.Path+"/tasks/"+url.PathEscape(id)+"?command="+newCommandID(), http.StatusSeeOther)
		return
	}
	a, sent, err := p.cfg.Service.Answer(r.Context(), who, id, command)
	if err != nil {
		p.cfg.Logger.Warn("taskpage: read a command's answer", slog.String("task", id), slog.Any("error", err))
		p.render(w, http.StatusServiceUnavailable, "message", view{User: who.User, Title: "Task unavailable", Message: "The ledger could not be read. Try again in a moment."})
		return
	}
	if sent {
		p.render(w, a.Status, "result", resultView(who, humantask.Command{TaskID: id, ID: command}, a))
		return
	}
	t, err := p.cfg.Service.Task(r.Context(), who, id)
	switch {
	case errors.Is(err, humantask.ErrNoSuchTask):
		p.render(w, http.StatusNotFound, "message", view{User: who.User, Title: "No such task", Message: "This task is not waiting any more: it was completed or removed."})
		return
	case errors.Is(err, humantask.ErrNotAllowed):
		p.render(w, http.StatusForbidden, "message", view{User: who.User, Title: "Not yours", Message: "This task is assigned to someone else, or you are not one of its candidates."})
		return
	case err != nil:
		p.cfg.Logger.Warn("taskpage: read task", slog.String("task", id), slog.Any("error", err))
		p.render(w, http.StatusServiceUnavailable, "message", view{User: who.User, Title: "Task unavailable", Message: "The engine could not be read. Try again in a moment."})
		return
	}
	// Cached for history navigation: the back button may bring this very form back from
	// the browser's cache; loading it anew renders it anew, for the same command.
	w.Header().Set("Cache-Control", "private, no-cache")
	p.render(w, http.StatusOK, "form", view{User: who.User, Title: taskTitle(t), Task: &t, Fields: fields(t), Command: command})
}

// validCommandID reports whether s is a command id newCommandID mints.
func validCommandID(s string) bool {
	if len(s) != 32 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// complete sends the form as its command and shows the answer, with its status.
func (p *page) complete(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		p.cfg.Logger.Warn("taskpage: cross-origin form refused", slog.String("why", err.Error()))
		p.render(w, http.StatusForbidden, "message", view{Title: "Refused", Message: "This form was not sent from this site's own page; nothing was done."})
		return
	}
	who, ok := p.who(w, r)
	if !ok {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, p.cfg.MaxForm)
	if err := r.ParseForm(); err != nil {
		p.render(w, http.StatusBadRequest, "message", view{User: who.User, Title: "Form refused", Message: "The form could not be read; nothing was done."})
		return
	}
	f, err := formOf(r.PostForm)
	if err != nil {
		p.render(w, http.StatusBadRequest, "message", view{User: who.User, Title: "Form refused", Message: err.Error() + "; nothing was done."})
		return
	}
	c := humantask.Command{TaskID: r.PathValue("id"), ID: r.PostForm.Get("command"), IfMatch: r.PostForm.Get("etag"), Form: f}
	if c.ID == "" || c.IfMatch == "" {
		p.render(w, http.StatusPreconditionRequired, "message", view{User: who.User, Title: "Form refused", Message: "The form has no command id or version: load the task again."})
		return
	}
	// The command runs to its answer even when the browser drops the request (a double
	// click cancels the first post): a command abandoned mid-flight would hold its lease,
	// and the same command sent again would wait it out.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), p.cfg.CommandTimeout)
	defer cancel()
	a := p.cfg.Service.Complete(ctx, who, c)
	var note string
	if reused(a) {
		// The same command with another form (edited after the back button): the edit was
		// not sent, and the page shows the command's own answer, not a refusal that reads
		// as if the task were not completed.
		if recorded, ok, err := p.cfg.Service.Answer(ctx, who, c.TaskID, c.ID); err == nil && ok {
			a, note = recorded, "You changed this form after sending it: the change was not sent. This is what the form sent before got:"
		}
	}
	if a.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((a.RetryAfter+time.Second-1)/time.Second)))
	}
	w.Header().Set("Cache-Control", "no-store")
	v := resultView(who, c, a)
	v.Note = note
	p.render(w, a.Status, "result", v)
}

// reused reports whether a is the 422 of a command id sent again with another form.
func reused(a humantask.Answer) bool {
	var b answer
	return a.Status == http.StatusUnprocessableEntity && json.Unmarshal(a.Body, &b) == nil && b.State == humantask.StateKeyReused
}

// sameOrigin refuses a post another site's page sent: the browser's Sec-Fetch-Site,
// Origin and Referer, whichever it sends, must say this site (webtrust.SameOrigin:
// this host, over https when the page is served over TLS).
func sameOrigin(r *http.Request) error {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" {
		return fmt.Errorf("Sec-Fetch-Site %q", s)
	}
	for _, h := range []string{"Origin", "Referer"} {
		v := r.Header.Get(h)
		if v == "" {
			continue
		}
		if !webtrust.SameOrigin(r, v) {
			return fmt.Errorf("%s of another site", h)
		}
	}
	return nil
}

// field is a form variable as an input: kind boolean, number or string; other types
// are shown, not sent.
type field struct {
	Name, Kind, Value string
	Step              string
	Checked           bool
}

// fields are t's form variables as inputs: only its declared form fields when it has
// any (the others are shown, not sent).
func fields(t humantask.Task) []field {
	vs := t.Variables
	names := make([]string, 0, len(vs))
	for n := range vs {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]field, 0, len(names))
	for _, n := range names {
		v := vs[n]
		val, _ := v.Decode()
		f := field{Name: n, Kind: "other", Value: string(v.Value)}
		if t.Fields != nil && !slices.Contains(t.Fields, n) {
			out = append(out, f)
			continue
		}
		switch v.Type {
		case camunda7.TypeBoolean:
			b, _ := val.(bool)
			f.Kind, f.Checked = "boolean", b
		case camunda7.TypeLong, camunda7.TypeInteger, camunda7.TypeShort:
			f.Kind, f.Step, f.Value = "number", "1", numberValue(v)
		case camunda7.TypeDouble:
			f.Kind, f.Step, f.Value = "number", "any", numberValue(v)
		case camunda7.TypeString:
			s, _ := val.(string)
			f.Kind, f.Value = "string", s
		}
		out = append(out, f)
	}
	return out
}

// numberValue is a number variable's value for an input: empty for null.
func numberValue(v camunda7.Variable) string {
	if v.IsNull() {
		return ""
	}
	return string(v.Value)
}

// formOf reads the posted variables: each "kind.<name>" names an input "var.<name>".
func formOf(v url.Values) (humantask.Form, error) {
	f := humantask.Form{}
	for k, kinds := range v {
		name, ok := strings.CutPrefix(k, "kind.")
		if !ok {
			continue
		}
		shown := termsafe.String(name) // the sender's bytes, in the refusal's page and log
		if len(kinds) != 1 {
			return nil, fmt.Errorf("%s is given %d kinds", shown, len(kinds))
		}
		val := strings.TrimSpace(v.Get("var." + name))
		switch kinds[0] {
		case "boolean":
			f[name] = val == "true"
		case "number":
			if val == "" {
				f[name] = nil
				continue
			}
			n, ok := typedNumber(val)
			if !ok {
				return nil, fmt.Errorf("%s is not a number", shown)
			}
			f[name] = n
		case "string":
			f[name] = v.Get("var." + name)
		default:
			return nil, fmt.Errorf("%s has an unknown kind", shown)
		}
	}
	return f, nil
}

// typedNumber is a number as a person types it into a number input ("+5", "0500",
// "-007.50") as JSON writes it ("5", "500", "-7.50"): a plus sign and the integer
// part's leading zeros dropped. false when it does not begin with a digit after its
// sign; the rest ("0x1p3", "1_001") the service refuses as not a number (400).
func typedNumber(s string) (json.Number, bool) {
	sign, rest := "", s
	switch {
	case strings.HasPrefix(s, "+"):
		rest = s[1:]
	case strings.HasPrefix(s, "-"):
		sign, rest = "-", s[1:]
	}
	digits := len(rest) - len(strings.TrimLeft(rest, "0123456789"))
	if digits == 0 {
		return "", false
	}
	whole := strings.TrimLeft(rest[:digits], "0")
	if whole == "" {
		whole = "0"
	}
	return json.Number(sign + whole + rest[digits:]), true
}

// newCommandID is 128 random bits, hex.
func newCommandID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

func taskTitle(t humantask.Task) string {
	if t.Name != "" {
		return t.Name
	}
	return t.TaskDefinitionKey
}

// answer is an Answer's body, as package humantask writes it.
type answer struct {
	State       string `json:"state"`
	Error       string `json:"error"`
	Task        string `json:"task"`
	Command     string `json:"command"`
	CompletedBy string `json:"completedBy"`
	CompletedAt string `json:"completedAt"`
	Reason      string `json:"reason"`
}

// resultView is the page of an answer: built from the answer alone, so the same command
// shows the same page.
func resultView(who humantask.Identity, c humantask.Command, a humantask.Answer) view {
	var b answer
	_ = json.Unmarshal(a.Body, &b)
	v := view{User: who.User, Status: a.Status, TaskID: c.TaskID, Command: c.ID, Answer: b}
	switch {
	case a.Status == http.StatusOK:
		v.Title, v.Outcome = "Completed", "completed"
		v.Message = "You completed this task."
	case a.Status == http.StatusConflict && b.State == "suspended":
		v.Title, v.Outcome = "Suspended", "suspended"
		v.Message = "This task's process is suspended: the task cannot be completed until it is activated again. Nothing was done; open the task again once it is."
	case a.Status == http.StatusConflict && b.State == "delegated":
		v.Title, v.Outcome = "Delegated", "delegated"
		v.Message = "This task is delegated: its delegate resolves it back to its owner (in Tasklist), which is not a completion. Nothing was completed; once it is resolved, its owner completes it here."
	case a.Status == http.StatusConflict:
		v.Title, v.Outcome = "Already completed", "conflict"
		if at, err := time.Parse(time.RFC3339Nano, b.CompletedAt); err == nil {
			v.At = at.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		if b.CompletedBy != "" {
			v.Message = "This task was already completed by " + b.CompletedBy + " at " + v.At + ". Your form was not sent."
		} else {
			v.Message = "This task was already completed outside this service (in Tasklist, say) at " + v.At + ". Your form was not sent."
		}
	case a.Status == http.StatusPreconditionFailed:
		v.Title, v.Outcome, v.Reload = "Changed since you opened it", "stale", true
		v.Message = "This task changed since you opened it (it was claimed, reassigned, or its data changed). Reload it, check it, and send it again."
	case a.Status == http.StatusForbidden:
		v.Title, v.Outcome = "Not yours", "forbidden"
		v.Message = "This task is not yours any more: it is assigned to someone else, or you are not one of its candidates. Nothing was done."
	case a.Status == http.StatusNotFound:
		v.Title, v.Outcome = "No such task", "gone"
		v.Message = "This task is not waiting any more: it was removed without being completed."
		if b.Error == "no such task" {
			v.Message = "There is no such task for you: none of this id waits, and none you had a right to was completed."
		}
	case a.Status == http.StatusUnprocessableEntity && b.State == humantask.StateKeyReused:
		v.Title, v.Outcome, v.Reload = "Already sent", "reused", true
		v.Message = "This form was already sent with other values; what it sent then is not known yet. Reload the task to see where it stands."
	case a.Status == http.StatusUnprocessableEntity:
		// A refused form is fixed in a new one: the same command would be refused again.
		v.Title, v.Outcome, v.Reload = "Refused", "refused", true
		v.Message = "The task was not completed: " + b.Error + "."
		if b.Reason != "" {
			v.Message = "The task was not completed: " + b.Reason
		}
	case a.Status == http.StatusServiceUnavailable:
		v.Title, v.Outcome = "Not settled yet", "unsettled"
		v.Message = "Whether this task was completed is not known yet. Go back and send the same form again in a moment: it is the same command, and cannot complete the task twice."
	default:
		v.Title, v.Outcome = "Refused", "error"
		v.Message = "The form was refused: " + b.Error + "."
	}
	return v
}

// view is what a template shows.
type view struct {
	User, Title, Message string
	// Note, when set, comes before the message (the result page of an edited resubmit).
	Note    string
	Tasks   []humantask.Task
	Task    *humantask.Task
	Fields  []field
	Command string
	// The result page.
	Status              int
	TaskID, Outcome, At string
	Reload              bool
	Answer              answer
	Path                string
	Style               template.CSS
}

func (p *page) render(w http.ResponseWriter, status int, name string, v view) {
	v.Path, v.Style = p.cfg.Path, template.CSS(style)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if w.Header().Get("Cache-Control") == "" {
		w.Header().Set("Cache-Control", "no-store")
	}
	w.WriteHeader(status)
	if err := templates.ExecuteTemplate(w, name, v); err != nil {
		p.cfg.Logger.Error("taskpage: render", slog.String("template", name), slog.Any("error", err))
	}
}

var styleHash = func() string {
	sum := sha256.Sum256([]byte(style))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}()
