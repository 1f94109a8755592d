// Package console is the operator console: web pages, served by the production entry
// point when EXTWORKER_CONSOLE_ADDR is set, on which operators see the effect ledger's
// intents in doubt (unknown, held for an operator, orphaned) with their age, one intent's
// event timeline beside the engine's view of its task, incident and process instance,
// give verdicts, approve or reject other operators' verdicts (the two-person rule), and
// see the inbox's parked and the outbox's pending messages. docs/console.md is its
// manual.
//
// # Security model
//
// The console changes money-moving records, so it is built to be hard to misuse:
//
//   - Every request is authenticated, by one of two means: a login form checked against
//     bcrypt hashes (Options.Operators, of one cost) that sets a session cookie
//     (HMAC-signed, HttpOnly, SameSite=Strict, Secure over TLS or with
//     Options.SecureCookies, expiring, revoked on the server at logout), or a reverse
//     proxy's header naming exactly one operator it authenticated (Options.AuthHeader),
//     believed only from the proxy's addresses (Options.TrustedProxies, none wider than
//     a /8 or an IPv6 /32) and only for a registered operator of the ledger (403
//     otherwise), named as the register spells them. Failed logins are throttled per
//     name, per address and per browser that logged in before (throttle), compare
//     against a hash of the same cost even for unknown names, and are logged without
//     the password.
//   - A request naming a host the console is not (Options.AllowedHosts, by default the
//     listen address's names) is refused before anything else: no DNS rebinding.
//   - The operator named in the ledger is always the authenticated one, never a form
//     field. The ledger attests nothing itself: the console's database login is a
//     member of extworker_console, which the ledger trusts to name operators (the
//     two-person rule then compares names), so that login belongs to the console alone.
//   - Pages are read with GET, which never changes anything; every change is a POST whose
//     form carries the session's CSRF token (behind the proxy: the operator's, bound to
//     a signed cookie of the browser's that is renewed every SessionTTL), compared in
//     constant time, and whose Origin or Referer, when sent, is the console's own,
//     answered with a redirect to a page that says what it did (POST/Redirect/GET: a
//     reload sends nothing again), to the operator who sent it, on that page, once.
//   - A form sent after its session ended is kept for after the login only when it
//     carries that session's cookie and CSRF token, and only that operator gets it back.
//   - Every response forbids scripts, frames, plugins and foreign form targets
//     (Content-Security-Policy), sniffing, cross-site referrers and caching. The pages
//     are server-rendered html/template, with no JavaScript at all; everything from the
//     ledger, the engine and the broker is escaped, and so is every character a reader
//     could not see for what it is or that rearranges text (a bidi override, a no-break
//     space, a Hangul filler, a variation selector: hiddenRune), shown as its \u escape;
//     a run of spaces is shown as it is. The forms refuse those characters, naming them.
package console

import (
	"bytes"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/operate"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static/console.css
var staticFS embed.FS

// Options are what the console is built from.
type Options struct {
	// Ledger is the effect ledger on the console's database login (a member of
	// extworker_console; see the package documentation).
	Ledger *idempotency.Operations
	// DB reads the inbox and the outbox; the console's login suffices.
	DB *pgxpool.Pool
	// Engine is where the console reads tasks and gives them their retry back.
	Engine operate.Engine
	// CockpitURL is the engine's web applications' root (http://host:8080/camunda): the
	// console links to process instances there.
	CockpitURL string

	// Operators maps each operator's name (lower case) to their bcrypt hash: the login
	// form's. Set this or AuthHeader.
	Operators map[string][]byte
	// AuthHeader is a reverse proxy's header naming the operator it authenticated,
	// believed only from TrustedProxies, and only for a registered operator
	// (extworker_operators, which DB reads).
	AuthHeader     string
	TrustedProxies []netip.Prefix

	// SessionKey signs session cookies and CSRF tokens; nil draws a random one, so that
	// sessions end with the process. Replicas behind one address share a key.
	SessionKey []byte
	// SessionTTL is how long a login lasts (default 8h).
	SessionTTL time.Duration
	// SecureCookies marks every cookie Secure: set it behind a proxy that terminates
	// TLS, where the console sees plain HTTP. A request over TLS to the console itself
	// gets Secure cookies without it.
	SecureCookies bool
	// Addr is the address the console listens on (EXTWORKER_CONSOLE_ADDR): AllowedHosts'
	// default is derived from it.
	Addr string
	// AllowedHosts are the names (or addresses) requests must name in their Host header;
	// any other is refused with 421, so that a page served to another name (DNS
	// rebinding) cannot read or post to the console.
	AllowedHosts []string
	// Notice, when not empty, is shown on every page: a problem with the console's setup
	// that operators should know of (a database login that cannot resolve, say).
	Notice string
	Logger *slog.Logger
}

// handler is the console.
type handler struct {
	opts    Options
	key     []byte
	dummy   []byte          // compared against for a name not in Operators
	hosts   map[string]bool // the Host names answered
	pages   map[string]*template.Template
	mux     *http.ServeMux
	limits  *throttle
	revoked revocations
	shown   onceSet // the flashes shown
	now     func() time.Time
}

// New returns the console's handler.
func New(o Options) (http.Handler, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.SessionTTL <= 0 {
		o.SessionTTL = 8 * time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	h := &handler{opts: o, key: o.SessionKey, now: time.Now}
	if len(h.key) == 0 {
		h.key = make([]byte, 32)
		_, _ = rand.Read(h.key)
	}
	var err error
	if h.opts.TrustedProxies, err = CheckTrustedProxies(o.TrustedProxies); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	if h.hosts, err = allowedHosts(o.AllowedHosts, o.Addr); err != nil {
		return nil, err
	}
	if err := h.passwords(); err != nil {
		return nil, err
	}
	if err := h.parseTemplates(); err != nil {
		return nil, err
	}
	h.routes()
	return h, nil
}

// check refuses options the console cannot work with.
func (o Options) check() error {
	switch {
	case o.Ledger == nil || o.DB == nil || o.Engine.Dial == nil:
		return errors.New("console: a ledger, a database pool and an engine are required")
	case len(o.Operators) == 0 && o.AuthHeader == "":
		return errors.New("console: operators (a login form) or a proxy's authentication header is required")
	case len(o.Operators) > 0 && o.AuthHeader != "":
		return errors.New("console: operators or a proxy's authentication header, not both")
	case o.AuthHeader != "" && len(o.TrustedProxies) == 0:
		return errors.New("console: a proxy's authentication header is believed only from trusted proxies; none given")
	}
	return nil
}

// passwords prepares the login form's checks: the dummy hash of the operators' cost and
// the throttle, which keeps every operator's name.
func (h *handler) passwords() error {
	cost, err := hashCost(h.opts.Operators)
	if err != nil || cost == 0 {
		h.limits = newThrottle(nil, throttleSlots)
		return err
	}
	if h.dummy, err = dummyHash(cost); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	names := make([]string, 0, len(h.opts.Operators))
	for n := range h.opts.Operators {
		names = append(names, n)
	}
	h.limits = newThrottle(names, throttleSlots)
	return nil
}

// securityHeaders are on every response, and so is Cache-Control: no-store: nothing the
// console answers, page, redirect or error, is kept by a browser or a proxy.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
	"X-Content-Type-Options":  "nosniff",
	"Referrer-Policy":         "same-origin",
	"X-Frame-Options":         "DENY",
	"Cache-Control":           "no-store",
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for k, v := range securityHeaders {
		w.Header().Set(k, v)
	}
	if !h.hostAllowed(r.Host) {
		h.opts.Logger.Warn("console: request refused: not a host the console answers to", slog.String("remote", r.RemoteAddr),
			slog.String("host", visiblePlain(r.Host)))
		http.Error(w, "421 misdirected request: this console does not answer to that host name", http.StatusMisdirectedRequest)
		return
	}
	h.mux.ServeHTTP(w, r)
}

func (h *handler) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /static/console.css", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, staticFS, "static/console.css")
	})
	m.HandleFunc("GET /login", h.loginPage)
	m.HandleFunc("POST /login", h.login)
	m.HandleFunc("POST /logout", h.authed(h.logout))
	m.HandleFunc("GET /{$}", h.authed(h.overview))
	m.HandleFunc("GET /intent", h.authed(h.intent))
	m.HandleFunc("POST /intent/resolve", h.authed(h.resolve))
	m.HandleFunc("GET /resolutions", h.authed(h.resolutions))
	m.HandleFunc("POST /resolutions/{id}/approve", h.authed(h.decide))
	m.HandleFunc("POST /resolutions/{id}/reject", h.authed(h.decide))
	m.HandleFunc("GET /inbox", h.authed(h.inboxPage))
	m.HandleFunc("GET /outbox", h.authed(h.outboxPage))
	h.mux = m
}

// authed runs next for an authenticated operator, with the CSRF check for a POST.
// Without a login, a page read goes to the login form (and back after it), and a form
// whose session ended is kept for after the login (keepForm); anything else is refused.
func (h *handler) authed(next func(http.ResponseWriter, *http.Request, identity)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := h.who(r)
		if err != nil {
			h.unauthenticated(w, r, err)
			return
		}
		if !id.Session {
			h.bindHeaderToken(w, r, &id)
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
			if err := h.checkCSRF(r, id.CSRF); err != nil {
				h.opts.Logger.Warn("console: form refused", slog.String("operator", id.Operator), slog.String("remote", r.RemoteAddr),
					slog.String("path", r.URL.Path), slog.String("why", err.Error()))
				h.render(w, r, http.StatusForbidden, "error", id, page{Title: "Refused", Error: err.Error()})
				return
			}
		}
		next(w, r, id)
	}
}

// unauthenticated answers a request without a login.
func (h *handler) unauthenticated(w http.ResponseWriter, r *http.Request, err error) {
	if h.opts.AuthHeader == "" {
		if r.Method == http.MethodGet {
			http.Redirect(w, r, loginPath(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		if back, ok := h.keepForm(w, r); ok {
			h.redirect(w, r, loginPath(back), "", flash{Error: "Your session ended before the form was sent, so nothing was done; log in again: the form is kept, filled in as you typed it."})
			return
		}
	}
	h.opts.Logger.Warn("console: request refused: not authenticated", slog.String("remote", r.RemoteAddr),
		slog.String("path", r.URL.Path), slog.String("why", err.Error()))
	status, title := http.StatusUnauthorized, "Not authenticated"
	var refused authError
	switch {
	case errors.As(err, &refused):
		status, title = refused.status, refused.title
	case errors.Is(err, errAmbiguousOperator):
		status = http.StatusBadRequest
	}
	h.render(w, r, status, "error", identity{}, page{Title: title, Error: err.Error()})
}

// page is what every template gets.
type page struct {
	Title  string
	Me     identity
	Notice string
	// Error is shown plainly at the top; Done says what an action did, Action what it
	// did in the engine.
	Error  string
	Done   []string
	Action *operate.Action
	Data   any
}

// funcs are the templates' helpers.
func (h *handler) funcs() template.FuncMap {
	return template.FuncMap{
		"show":    visibleHTML,
		"plain":   visiblePlain,
		"showp":   func(s *string) template.HTML { return visibleHTML(deref(s)) },
		"refill":  refill,
		"at":      func(t time.Time) template.HTML { return stamp(h.now(), t) },
		"atp":     func(t *time.Time) template.HTML { return stampp(h.now(), t) },
		"ago":     func(t time.Time) string { return ago(h.now(), t) },
		"cockpit": h.cockpitInstance,
		"verdict": verdictOf,
		"queue":   func(rows any, empty string) queue { return queue{Rows: rows, Empty: empty} },
		"intentURL": func(scope, key string) string {
			return intentPath(scope, key)
		},
		"deref": func(p *int) int {
			if p == nil {
				return -1
			}
			return *p
		},
		"derefI64": func(p *int64) string {
			if p == nil {
				return "-"
			}
			return fmt.Sprint(*p)
		},
	}
}

// queue is a list a template shows, with what it says when the list is empty.
type queue struct {
	Rows  any
	Empty string
}

func (h *handler) parseTemplates() error {
	h.pages = map[string]*template.Template{}
	base, err := template.New("layout.html").Funcs(h.funcs()).ParseFS(templateFS, "templates/layout.html", "templates/partials.html")
	if err != nil {
		return err
	}
	for _, name := range []string{"login", "error", "overview", "intent", "resolutions", "inbox", "outbox"} {
		t, err := template.Must(base.Clone()).ParseFS(templateFS, "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("console: template %s: %w", name, err)
		}
		h.pages[name] = t
	}
	return nil
}

// render writes a page, with what the last form did when it is a page read. The page is
// rendered whole before it is sent, so that a template's failure is an error page, not
// half a page that looks complete; and it is UTF-8 whatever the data held.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name string, id identity, p page) {
	p.Me, p.Notice = id, h.opts.Notice
	if r.Method == http.MethodGet {
		f := h.takeFlash(w, r, id.Operator)
		p.Done, p.Error = append(f.Done, p.Done...), joinErr(f.Error, p.Error)
		if p.Action == nil {
			p.Action = f.Action
		}
	}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout.html", p); err != nil {
		h.opts.Logger.Error("console: rendering a page failed", slog.String("page", name), slog.String("path", r.URL.Path), slog.Any("error", err))
		http.Error(w, "the console could not render this page; its log says why", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(bytes.ToValidUTF8(buf.Bytes(), []byte("\uFFFD")))
}
