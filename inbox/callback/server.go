package callback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/inbox"
)

// DefaultMaxBody is Config.MaxBody's default: 1 MiB.
const DefaultMaxBody = 1 << 20

// Source is one provider whose callbacks the server takes: its inbox handler (its Decide,
// and its Config.Source, which names the source in the path: POST …/{source}) and the
// secrets its signatures may be made with.
type Source struct {
	Handler *inbox.Handler
	// Secrets are the source's signing secrets, "whsec_" and a base64 key each. Any one
	// of them signs: list the new one beside the old while the provider rotates.
	Secrets []string
	// Type returns the message type of a body (inbox.Message.Type, which Decide reads).
	// Default: the body's top-level "type" string, the scheme's payload field, or "".
	Type func(body []byte) string
}

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	// Tolerance is how far a callback's webhook-timestamp may be from this clock, either
	// way. Default DefaultTolerance (5m).
	Tolerance time.Duration
	// MaxBody caps a callback's body: a longer one is answered 413, nothing recorded.
	// Default DefaultMaxBody (1 MiB).
	MaxBody int64
	// PollInterval is how often Run looks for held callbacks that are due. Default 1s.
	PollInterval time.Duration
	// Concurrency is how many held callbacks Run handles at once. Default 4.
	Concurrency int
	// Lease is how long a held callback Run took stays out of other processes' reach
	// while it is handled; it must exceed the sources' inbox.Config.HandleTimeout.
	// Default the longest HandleTimeout plus 30s.
	Lease time.Duration
	// Logger receives refused callbacks (INFO, by source and why, never a header's value
	// or a body) and Run's failures (WARN). Default discard.
	Logger *slog.Logger
}

// Server takes provider callbacks into the inbox (an http.Handler), and handles again the
// ones it holds while no process instance waits for them (Run).
type Server struct {
	pool    *pgxpool.Pool
	sources map[string]*source
	cfg     Config
}

type source struct {
	h       *inbox.Handler
	secrets []Secret
	typ     func([]byte) string
}

// New returns a server for sources that holds waiting callbacks in pool's
// extworker_inbox_callbacks (migration 00013), the database of the handlers' inbox.
func New(pool *pgxpool.Pool, sources []Source, cfg Config) (*Server, error) {
	if pool == nil || len(sources) == 0 {
		return nil, errors.New("callback: a server needs a pool and at least one source")
	}
	s := &Server{pool: pool, sources: map[string]*source{}}
	for _, src := range sources {
		if err := s.add(src); err != nil {
			return nil, err
		}
	}
	s.cfg = s.withDefaults(cfg)
	if s.cfg.Lease <= s.longestHandleTimeout() {
		return nil, fmt.Errorf("callback: Config.Lease %v must exceed the sources' HandleTimeout %v", s.cfg.Lease, s.longestHandleTimeout())
	}
	return s, nil
}

func (s *Server) add(src Source) error {
	if src.Handler == nil {
		return errors.New("callback: a Source needs a Handler")
	}
	name := src.Handler.Config().Source
	if _, dup := s.sources[name]; dup || strings.Contains(name, "/") {
		return fmt.Errorf("callback: source %q twice, or with a slash", name)
	}
	if len(src.Secrets) == 0 {
		return fmt.Errorf("callback: source %q needs at least one secret", name)
	}
	out := &source{h: src.Handler, typ: src.Type}
	for i, text := range src.Secrets {
		sec, err := ParseSecret(text)
		if err != nil {
			return fmt.Errorf("callback: source %q, secret %d: %w", name, i+1, err)
		}
		out.secrets = append(out.secrets, sec)
	}
	if out.typ == nil {
		out.typ = typeField
	}
	s.sources[name] = out
	return nil
}

func (s *Server) withDefaults(c Config) Config {
	if c.Tolerance <= 0 {
		c.Tolerance = DefaultTolerance
	}
	if c.MaxBody <= 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 4
	}
	if c.Lease <= 0 {
		c.Lease = s.longestHandleTimeout() + 30*time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (s *Server) longestHandleTimeout() time.Duration {
	var d time.Duration
	for _, src := range s.sources {
		d = max(d, src.h.Config().HandleTimeout)
	}
	return d
}

// typeField is the body's top-level "type" string, or "".
func typeField(body []byte) string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Type
}

// ServeHTTP takes one callback: POST, to a source's path ({source} in the pattern it is
// mounted with, or the path's rest once a prefix is stripped), a body of at most
// Config.MaxBody, signed with one of the source's secrets within Config.Tolerance. Only
// then is it recorded in the inbox; the answer is the row's (answerOf).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	src, refused := s.admit(w, r)
	if refused != nil {
		refused.write(w)
		return
	}
	body, refused := s.readBody(w, r)
	if refused != nil {
		refused.write(w)
		return
	}
	h := Headers{ID: r.Header.Get(HeaderID), Timestamp: r.Header.Get(HeaderTimestamp), Signature: r.Header.Get(HeaderSignature)}
	if err := Verify(src.secrets, h, body, time.Now(), s.cfg.Tolerance); err != nil {
		s.cfg.Logger.Info("callback: signature refused", "source", src.h.Config().Source, "why", err.Error())
		answerUnauthorized.write(w)
		return
	}
	s.take(r.Context(), src, inbox.Message{ID: h.ID, Type: src.typ(body), Body: body}).write(w)
}

// admit finds the request's source, or says why not.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) (*source, *answer) {
	if r.Method != http.MethodPost {
		return nil, &answerMethod
	}
	name := r.PathValue("source")
	if name == "" {
		name = strings.TrimPrefix(r.URL.Path, "/")
	}
	src, ok := s.sources[name]
	if !ok {
		return nil, &answerNoSource
	}
	return src, nil
}

// readBody reads the body, up to Config.MaxBody.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *answer) {
	if r.ContentLength > s.cfg.MaxBody {
		return nil, &answerTooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, &answerTooLarge
	case err != nil:
		return nil, &answerBadRequest
	}
	return body, nil
}

// take hands an authenticated callback to the source's inbox, on a context the
// provider's hanging up does not cancel (what the engine did must be recorded), holds its
// body while it waits, and answers from its row.
func (s *Server) take(ctx context.Context, src *source, m inbox.Message) answer {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), src.h.Config().HandleTimeout)
	defer cancel()
	h, err := src.h.Handle(ctx, m)
	if err == nil {
		err = s.keep(ctx, src, m, h, 0)
	}
	if err != nil {
		s.cfg.Logger.Warn("callback: not recorded; answered 503", "source", src.h.Config().Source, "error", err)
		return answerUnavailable
	}
	return answerOf(m.ID, h)
}
