package camunda7

// Client security: credentials are not sent over plain HTTP beyond the machine unless
// allowed, and a cached bearer token the engine rejects is replaced once.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Basic auth, a static bearer token and a token source over http:// to a host that is not
// loopback are refused, naming BaseURL and AllowPlaintextAuth and showing no secret;
// AllowPlaintextAuth allows them with a warning. Loopback hosts, https and no credentials
// are allowed without either.
func TestAuthPlaintextRefusedUnlessAllowed(t *testing.T) {
	ts := TokenSourceFunc(func(context.Context) (string, error) { return "t0ken-s3cret", nil })
	creds := map[string]Config{
		"basic":        {Username: "worker", Password: "pw-s3cret"},
		"bearer":       {BearerToken: "t0ken-s3cret"},
		"token source": {TokenSource: ts},
	}
	for name, cred := range creds {
		t.Run(name, func(t *testing.T) {
			for _, remote := range []string{"http://engine.example/engine-rest", "http://10.0.0.7:8080/engine-rest",
				"http://[2001:db8::1]:8080/engine-rest", "HTTP://engine.example/engine-rest", "http://u:url-s3cret@engine.example/engine-rest"} {
				cfg := cred
				cfg.BaseURL = remote
				err := cfg.Validate()
				require.Error(t, err, remote)
				assert.Contains(t, err.Error(), "over plain http would travel in clear to a host that is not loopback: use https, or set AllowPlaintextAuth")
				assert.Contains(t, err.Error(), "BaseURL ")
				assert.NotContains(t, err.Error(), "s3cret")
				_, err = New(cfg)
				assert.Error(t, err, remote)

				var logs bytes.Buffer
				cfg.AllowPlaintextAuth = true
				cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				_, err = New(cfg)
				require.NoError(t, err, remote)
				assert.Contains(t, logs.String(), "level=WARN")
				assert.Contains(t, logs.String(), "over plain HTTP travels in clear (AllowPlaintextAuth)")
				assert.NotContains(t, logs.String(), "s3cret")
			}
			for _, ok := range []string{"http://127.0.0.1:8081/engine-rest", "http://127.1.2.3/engine-rest", "http://[::1]:8080/engine-rest",
				"http://localhost:8080/engine-rest", "http://LOCALHOST/engine-rest", "https://engine.example/engine-rest"} {
				cfg := cred
				cfg.BaseURL = ok
				var logs bytes.Buffer
				cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				_, err := New(cfg)
				require.NoError(t, err, ok)
				assert.NotContains(t, logs.String(), "WARN", ok)
			}
		})
	}
	assert.NoError(t, Config{BaseURL: "http://engine.example/engine-rest"}.Validate(), "no credentials, nothing to leak")
}

// cachingSource hands out tok-1, tok-2, ... and keeps each until it is invalidated, like
// an OAuth2 client-credentials source.
type cachingSource struct {
	mu          sync.Mutex
	fetched     int
	cur         string
	invalidated []string
	fail        error // returned by fetches after the first
}

func (s *cachingSource) Token(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == "" {
		if s.fetched > 0 && s.fail != nil {
			return "", s.fail
		}
		s.fetched++
		s.cur = fmt.Sprintf("tok-%d", s.fetched)
	}
	return s.cur, nil
}

func (s *cachingSource) InvalidateToken(tok string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.invalidated = append(s.invalidated, tok)
	if s.cur == tok {
		s.cur = ""
	}
}

// acceptOnly answers 401 to every bearer token but want, and 204 to want.
func acceptOnly(want string) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Header.Get("Authorization") != "Bearer "+want {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// A 401 to a cached token invalidates it; the same request goes again, once, with a fresh
// token, and succeeds. The next request reuses the fresh token.
func TestAuthTokenRefreshedOn401(t *testing.T) {
	f := newFakeEngine(t, acceptOnly("tok-2"))
	src := &cachingSource{}
	c := f.client(t, Config{TokenSource: src})
	require.NoError(t, completeCall(t.Context(), c))
	reqs := f.requests()
	require.Len(t, reqs, 2)
	assert.Equal(t, "Bearer tok-1", reqs[0].Header.Get("Authorization"))
	assert.Equal(t, "Bearer tok-2", reqs[1].Header.Get("Authorization"))
	assert.Equal(t, reqs[0].Body, reqs[1].Body, "the same request, body included")
	assert.JSONEq(t, `{"workerId":"a"}`, string(reqs[1].Body))
	assert.Equal(t, 2, src.fetched)
	assert.Equal(t, []string{"tok-1"}, src.invalidated)

	require.NoError(t, completeCall(t.Context(), c))
	assert.Len(t, f.requests(), 3)
	assert.Equal(t, 2, src.fetched, "the fresh token is kept")
}

// A 401 to the fresh token too is rejected credentials (ErrUnauthorized, 401): no second
// retry, no loop.
func TestAuthSecond401IsUnauthorized(t *testing.T) {
	f := newFakeEngine(t, acceptOnly("never"))
	src := &cachingSource{}
	c := f.client(t, Config{TokenSource: src})
	err := completeCall(t.Context(), c)
	require.ErrorIs(t, err, ErrUnauthorized)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, http.StatusUnauthorized, ce.StatusCode)
	assert.Len(t, f.requests(), 2, "the first attempt and one retry")
	assert.Equal(t, 2, src.fetched)
	assert.Equal(t, []string{"tok-1"}, src.invalidated)
}

// A 403 (authenticated, not allowed) is not a stale token: no retry.
func TestAuthTokenForbiddenNotRetried(t *testing.T) {
	f := newFakeEngine(t, answer(http.StatusForbidden, "", ""))
	src := &cachingSource{}
	err := completeCall(t.Context(), f.client(t, Config{TokenSource: src}))
	require.ErrorIs(t, err, ErrUnauthorized)
	assert.Len(t, f.requests(), 1)
	assert.Empty(t, src.invalidated)
}

// Without a TokenInvalidator (a plain TokenSourceFunc, a static token, basic auth) a 401
// is returned at once: sending the same credentials again cannot help.
func TestAuth401WithoutInvalidatorNotRetried(t *testing.T) {
	for name, cfg := range map[string]Config{
		"token source func": {TokenSource: TokenSourceFunc(func(context.Context) (string, error) { return "tok-1", nil })},
		"static bearer":     {BearerToken: "tok-1"},
		"basic":             {Username: "u", Password: "p"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeEngine(t, acceptOnly("tok-2"))
			err := completeCall(t.Context(), f.client(t, cfg))
			require.ErrorIs(t, err, ErrUnauthorized)
			assert.Len(t, f.requests(), 1)
		})
	}
}

// A 401, then no new token: the error says so, wraps the source's error, and is not sent
// (the 401 means the engine did nothing).
func TestAuthTokenRefreshFailsAfter401(t *testing.T) {
	f := newFakeEngine(t, acceptOnly("tok-2"))
	idpDown := errors.New("identity provider unreachable")
	src := &cachingSource{fail: idpDown}
	err := completeCall(t.Context(), f.client(t, Config{TokenSource: src}))
	requireNotSent(t, err)
	assert.ErrorIs(t, err, idpDown)
	assert.Contains(t, err.Error(), "get a new bearer token after the engine rejected one (401): identity provider unreachable")
	assert.Len(t, f.requests(), 1)
}
