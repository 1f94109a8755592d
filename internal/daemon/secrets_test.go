package daemon_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// Secrets come from EXTWORKER_<NAME>_FILE, less one trailing newline, and replace defaults.
func TestSecretFiles(t *testing.T) {
	t.Setenv("EXTWORKER_ENGINE_USER", "worker")
	t.Setenv("EXTWORKER_ENGINE_PASSWORD_FILE", testenv.WriteFile(t, "pw", "pa ss\n\n"))
	t.Setenv("EXTWORKER_DATABASE_URL_FILE", testenv.WriteFile(t, "db", "postgres://u:dbsecret@db.example.com/x?sslmode=verify-full\r\n"))
	c, err := daemon.LoadConfig()
	require.NoError(t, err)
	assert.Equal(t, "pa ss\n", c.EnginePassword, "only one trailing newline is trimmed")
	assert.Equal(t, "postgres://u:dbsecret@db.example.com/x?sslmode=verify-full", c.DatabaseURL)
}

// Both the variable and its _FILE, an unreadable file and an empty one are each a problem
// naming the variable, listed together with the rest, and never showing a file's content.
func TestSecretFileProblems(t *testing.T) {
	t.Setenv("EXTWORKER_ENGINE_TOKEN", "tok-from-env")
	t.Setenv("EXTWORKER_ENGINE_TOKEN_FILE", testenv.WriteFile(t, "tok", "tok-from-file"))
	t.Setenv("EXTWORKER_ENGINE_USER", "worker")
	t.Setenv("EXTWORKER_ENGINE_PASSWORD_FILE", filepath.Join(t.TempDir(), "missing"))
	t.Setenv("EXTWORKER_DATABASE_URL_FILE", testenv.WriteFile(t, "empty", "\n"))
	t.Setenv("EXTWORKER_MAX_CONCURRENCY", "0")
	_, err := daemon.LoadConfig()
	require.Error(t, err)
	msg := err.Error()
	assert.Contains(t, msg, "EXTWORKER_ENGINE_TOKEN and EXTWORKER_ENGINE_TOKEN_FILE are both set")
	assert.Contains(t, msg, "EXTWORKER_ENGINE_PASSWORD_FILE: read ")
	assert.Contains(t, msg, "no such file or directory")
	assert.Contains(t, msg, "EXTWORKER_DATABASE_URL_FILE: ")
	assert.Contains(t, msg, "is empty")
	assert.Contains(t, msg, "EXTWORKER_MAX_CONCURRENCY")
	assert.NotContains(t, msg, "tok-from")
	var ce daemon.ConfigError
	assert.ErrorAs(t, err, &ce, "main exits with EX_CONFIG")
}

// Exactly one engine authentication method, completely configured.
func TestAuthMethodProblems(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"basic and bearer", map[string]string{"USER": "u", "PASSWORD": "p", "TOKEN": "t"},
			[]string{"engine authentication: choose one of basic", "bearer (EXTWORKER_ENGINE_TOKEN)"}},
		{"user without password", map[string]string{"USER": "u"}, []string{"EXTWORKER_ENGINE_PASSWORD (or EXTWORKER_ENGINE_PASSWORD_FILE) is required"}},
		{"password without user", map[string]string{"PASSWORD": "p"}, []string{"EXTWORKER_ENGINE_USER is required"}},
		{"oauth2 incomplete", map[string]string{"OAUTH_CLIENT_ID": "id", "OAUTH_TOKEN_URL": "ftp://idp"},
			[]string{"EXTWORKER_ENGINE_OAUTH_TOKEN_URL ftp://idp: scheme must be http or https", "EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET (or EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET_FILE) is required"}},
		{"oauth2 and basic", map[string]string{"USER": "u", "PASSWORD": "p", "OAUTH_TOKEN_URL": "https://idp/token", "OAUTH_CLIENT_ID": "id", "OAUTH_CLIENT_SECRET": "s"},
			[]string{"choose one of basic", "oauth2 (EXTWORKER_ENGINE_OAUTH_TOKEN_URL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv("EXTWORKER_ENGINE_"+k, v)
			}
			_, err := daemon.LoadConfig()
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// PostgreSQL TLS: sslmode must be one pgx knows; pgx reads sslrootcert at start.
func TestDatabaseTLSModes(t *testing.T) {
	for _, mode := range daemon.SSLModes {
		require.NoError(t, daemon.CheckDatabaseURL("postgres://u:p@db/x?sslmode="+mode), mode)
	}
	err := daemon.CheckDatabaseURL("postgres://u:hunter2@db/x?sslmode=verify_full")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `EXTWORKER_DATABASE_URL postgres://***@db/x?sslmode=verify_full: sslmode "verify_full": want one of disable, allow, prefer, require, verify-ca, verify-full`)
	err = daemon.CheckDatabaseURL("host=db user=u password=hunter2 sslmode=secure")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "hunter2")

	err = daemon.CheckDatabaseURL("postgres://u:hunter2@db/x?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
	require.Error(t, err, "a missing CA file is found at start")
	assert.Contains(t, err.Error(), "ca.pem")
	assert.NotContains(t, err.Error(), "hunter2")

	t.Setenv("EXTWORKER_DATABASE_URL", "postgres://u:p@db/x?sslmode=bogus")
	t.Setenv("EXTWORKER_LOG_LEVEL", "loud")
	_, err = daemon.LoadConfig()
	require.Error(t, err)
	assert.Contains(t, err.Error(), `sslmode "bogus"`)
	assert.Contains(t, err.Error(), "EXTWORKER_LOG_LEVEL", "listed with the other problems")
}

func TestMasking(t *testing.T) {
	assert.Equal(t, "postgres://extworker:***@db:5432/x?sslmode=require", daemon.MaskURL("postgres://extworker:s3cret@db:5432/x?sslmode=require"))
	assert.Equal(t, "postgres://u:***@db/x", daemon.MaskURL("postgres://u:p%40ss@word@db/x"))
	assert.Equal(t, "https://bpm.example.com/engine-rest", daemon.MaskURL("https://bpm.example.com/engine-rest"))
	assert.Equal(t, "postgres://u@db/x?password=***&sslpassword=***", daemon.MaskURL("postgres://u@db/x?password=a&sslpassword=b"))
	assert.Equal(t, "host=db password=*** user=u", daemon.MaskURL("host=db password='a b' user=u"))
	assert.Equal(t, "host=db password=*** sslpassword=***", daemon.RedactURL("host=db password=x1 sslpassword=x2"))
	assert.Equal(t, "cannot connect as *** to ***", daemon.Scrub("cannot connect as hunter2 to hunter2", "hunter2", "ab"))
}

// Credentials over plain http:// to a host that is not loopback are a configuration
// problem naming the variable and EXTWORKER_ENGINE_ALLOW_PLAINTEXT_AUTH, showing no secret:
// the password or token to EXTWORKER_ENGINE_URL, the OAuth2 client secret to
// EXTWORKER_ENGINE_OAUTH_TOKEN_URL. Loopback hosts (the test engines, `make demo`), https
// and no credentials are fine.
func TestAuthPlaintextHTTPRefused(t *testing.T) {
	oauth := func(tokenURL string) map[string]string {
		return map[string]string{"EXTWORKER_ENGINE_OAUTH_TOKEN_URL": tokenURL, "EXTWORKER_ENGINE_OAUTH_CLIENT_ID": "worker",
			"EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET": "client-s3cret"}
	}
	with := func(m map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	basic := map[string]string{"EXTWORKER_ENGINE_USER": "worker", "EXTWORKER_ENGINE_PASSWORD": "pw-s3cret"}
	bearer := map[string]string{"EXTWORKER_ENGINE_TOKEN": "tok-s3cret"}
	const remote = "http://bpm.example.com/engine-rest"
	const allow = "use https, or set EXTWORKER_ENGINE_ALLOW_PLAINTEXT_AUTH=true"
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string // problems; none: valid
	}{
		{"basic", with(basic, "EXTWORKER_ENGINE_URL", remote),
			[]string{"EXTWORKER_ENGINE_URL " + remote + " is plain http to a host that is not loopback: the password (EXTWORKER_ENGINE_PASSWORD) would travel in clear; " + allow}},
		{"bearer", with(bearer, "EXTWORKER_ENGINE_URL", "http://10.0.0.7:8080/engine-rest"),
			[]string{"EXTWORKER_ENGINE_URL http://10.0.0.7:8080/engine-rest is plain http to a host that is not loopback: " +
				"the bearer token (EXTWORKER_ENGINE_TOKEN) would travel in clear; " + allow}},
		{"oauth2 token URL", with(oauth("http://idp.example.com/token"), "EXTWORKER_ENGINE_URL", "https://bpm.example.com/engine-rest"),
			[]string{"EXTWORKER_ENGINE_OAUTH_TOKEN_URL http://idp.example.com/token is plain http to a host that is not loopback: " +
				"the client secret (EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET) would travel in clear; " + allow}},
		{"oauth2 engine URL", with(oauth("https://idp.example.com/token"), "EXTWORKER_ENGINE_URL", remote),
			[]string{"EXTWORKER_ENGINE_URL " + remote + " is plain http to a host that is not loopback: the OAuth2 access token would travel in clear"}},
		{"oauth2 both", with(oauth("http://idp.example.com/token"), "EXTWORKER_ENGINE_URL", remote),
			[]string{"EXTWORKER_ENGINE_OAUTH_TOKEN_URL http://idp.example.com/token is plain http", "EXTWORKER_ENGINE_URL " + remote + " is plain http"}},
		{"basic over loopback", with(basic, "EXTWORKER_ENGINE_URL", "http://127.0.0.1:8081/engine-rest"), nil},
		{"bearer over localhost", with(bearer, "EXTWORKER_ENGINE_URL", "http://localhost:8080/engine-rest"), nil},
		{"oauth2 over ::1", with(oauth("http://[::1]:9000/token"), "EXTWORKER_ENGINE_URL", "http://[::1]:8080/engine-rest"), nil},
		{"basic over https", with(basic, "EXTWORKER_ENGINE_URL", "https://bpm.example.com/engine-rest"), nil},
		{"no credentials", map[string]string{"EXTWORKER_ENGINE_URL": remote}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.ClearConfigEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			c, err := daemon.LoadConfig()
			if tc.want == nil {
				require.NoError(t, err)
				var logs bytes.Buffer
				_, err := daemon.NewClient(c, slog.New(slog.NewTextHandler(&logs, nil)))
				require.NoError(t, err)
				assert.NotContains(t, logs.String(), "WARN", "no warning where nothing travels in clear")
				return
			}
			lines := problemLines(t, err)
			require.Len(t, lines, len(tc.want), lines)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), "s3cret")

			// Allowed explicitly: valid, and each plaintext hop is warned of at start.
			t.Setenv("EXTWORKER_ENGINE_ALLOW_PLAINTEXT_AUTH", "true")
			c, err = daemon.LoadConfig()
			require.NoError(t, err)
			assert.True(t, c.EngineAllowPlaintextAuth)
			var logs bytes.Buffer
			_, err = daemon.NewClient(c, slog.New(slog.NewTextHandler(&logs, nil)))
			require.NoError(t, err)
			assert.Equal(t, len(tc.want), strings.Count(logs.String(), "level=WARN"), logs.String())
			assert.Contains(t, logs.String(), "over plain HTTP")
			assert.NotContains(t, logs.String(), "s3cret")
		})
	}

	// newClient refuses it too, for a config that was not validated.
	_, err := daemon.NewClient(daemon.Config{EngineURL: "https://bpm.example.com/engine-rest", EngineOAuthTokenURL: "http://idp.example.com/token",
		EngineOAuthClientID: "worker", EngineOAuthClientSecret: "client-s3cret", EngineTimeout: time.Second}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "EXTWORKER_ENGINE_OAUTH_TOKEN_URL http://idp.example.com/token is plain http")
	_, err = daemon.NewClient(daemon.Config{EngineURL: remote, EngineToken: "tok-s3cret", EngineTimeout: time.Second}, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "AllowPlaintextAuth")
	assert.NotContains(t, err.Error(), "s3cret")
}

// tokenServer is an OAuth2 token endpoint handing out at-1, at-2, ... each valid for an
// hour, counting its fetches.
func tokenServer(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var fetched atomic.Int32
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := fetched.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("at-%d", n), "token_type": "Bearer", "expires_in": 3600})
	}))
	t.Cleanup(idp.Close)
	return idp, &fetched
}

// A 401 to a cached OAuth2 token (revoked, or the engine's keys rotated before it expired)
// drops it: a new one is fetched, once, and the request sent again succeeds. A 401 to the
// new token too is rejected credentials, with no loop.
func TestOAuthTokenRefreshedOn401(t *testing.T) {
	idp, fetched := tokenServer(t)
	var engineHits atomic.Int32
	var accept atomic.Value
	accept.Store("at-2") // the first token is refused
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		engineHits.Add(1)
		if r.Header.Get("Authorization") != "Bearer "+accept.Load().(string) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"version":"7.24.0"}`))
	}))
	t.Cleanup(engine.Close)

	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_ENGINE_URL", engine.URL+"/engine-rest")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_TOKEN_URL", idp.URL+"/token")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_ID", "worker")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET", "client-s3cret")
	c, err := daemon.LoadConfig()
	require.NoError(t, err)
	client, err := daemon.NewClient(c, nil)
	require.NoError(t, err)

	v, err := client.Version(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "7.24.0", v)
	assert.EqualValues(t, 2, fetched.Load(), "the token endpoint is asked again once")
	assert.EqualValues(t, 2, engineHits.Load(), "the request is sent again once")

	_, err = client.Version(t.Context())
	require.NoError(t, err)
	assert.EqualValues(t, 2, fetched.Load(), "the new token is cached")
	assert.EqualValues(t, 3, engineHits.Load())

	// Every token refused: one new token, one resend, then ErrUnauthorized.
	accept.Store("none")
	_, err = client.Version(t.Context())
	require.ErrorIs(t, err, camunda7.ErrUnauthorized)
	var ce *camunda7.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, http.StatusUnauthorized, ce.StatusCode)
	assert.EqualValues(t, 3, fetched.Load())
	assert.EqualValues(t, 5, engineHits.Load())

	// At start that is the rejected-credentials exit, naming the OAuth2 variables.
	err = daemon.CheckEngine(t.Context(), c, discardLogger())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "rejected the credentials (401): check EXTWORKER_ENGINE_OAUTH_TOKEN_URL")
	assert.NotContains(t, err.Error(), "s3cret")
	var cfgErr daemon.ConfigError
	assert.ErrorAs(t, err, &cfgErr)
	assert.EqualValues(t, 5, fetched.Load(), "checkEngine's client: a token, and one more after the 401")
	assert.EqualValues(t, 7, engineHits.Load())
}

// InvalidateToken drops the cached token only if it is the one rejected: requests that
// were sent with the old token and come back after a new one was fetched leave it alone.
func TestOAuthInvalidateOnlyRejectedToken(t *testing.T) {
	idp, fetched := tokenServer(t)
	s := daemon.NewOAuthTokenSource(daemon.Config{EngineOAuthTokenURL: idp.URL + "/token", EngineOAuthClientID: "worker",
		EngineOAuthClientSecret: "s", EngineTimeout: 5 * time.Second}, nil)
	tok, err := s.Token(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "at-1", tok)
	s.InvalidateToken("at-1")
	tok, err = s.Token(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "at-2", tok)
	s.InvalidateToken("at-1") // a late 401 to the old token
	tok, err = s.Token(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "at-2", tok)
	assert.EqualValues(t, 2, fetched.Load())
}
