package daemon_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// configOutput runs `extworker config` (table and --json) and returns everything it
// printed, with the error's text.
func configOutput(t *testing.T) (table, asJSON string, err error) {
	t.Helper()
	var out, jsonOut, errOut bytes.Buffer
	err = daemon.ConfigCommand(nil, &out, &errOut)
	_ = daemon.ConfigCommand([]string{"--json"}, &jsonOut, &errOut)
	if err != nil {
		errOut.WriteString(err.Error())
	}
	return out.String() + errOut.String(), jsonOut.String(), err
}

// `extworker config` never shows a secret inside a URL it cannot parse (a password with
// #, /, ? or a bad % escape), nor the password of a URL that is not tagged secret (the
// OAuth2 token endpoint's), nor a token in an http URL's user part.
func TestConfigNeverShowsSecretsInURLs(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"EXTWORKER_DATABASE_URL", "postgres://u:pa55wd#x@127.0.0.1/db"},
		{"EXTWORKER_DATABASE_URL", "postgres://u:12pa55wd/x@127.0.0.1/db"},
		{"EXTWORKER_CONSOLE_DATABASE_URL", "postgres://u:pa55wd?x@127.0.0.1/db"},
		{"EXTWORKER_ENGINE_URL", "https://u:pa55wd#frag@h/engine-rest"},
		{"EXTWORKER_ENGINE_URL", "https://u:pa55wd/x@h/engine-rest"},
		{"EXTWORKER_ENGINE_URL", "https://u:pa55wd?x@h/engine-rest"},
		{"EXTWORKER_ENGINE_URL", "https://u:%zzpa55wd@h/engine-rest"},
		{"EXTWORKER_ENGINE_URL", "https://u:123pa55wd/x@h/engine-rest"},
		{"EXTWORKER_ENGINE_URL", "https://u:123#pa55wd@h/engine-rest"},
		{"EXTWORKER_ENGINE_URL", "http://tok-pa55wd@127.0.0.1:18779/engine-rest"},
		{"EXTWORKER_AMQP_URL", "amqp://extworker:pa55wd#x@127.0.0.1:5672/extworker"},
		{"EXTWORKER_AMQP_URL", "amqp://extworker:%zzpa55wd@127.0.0.1:5672/extworker"},
		{"EXTWORKER_ENGINE_OAUTH_TOKEN_URL", "http://idp:idp-pa55wd@127.0.0.1/token"},
		{"EXTWORKER_ENGINE_OAUTH_TOKEN_URL", "https://idp:pa55wd#x@idp.example/token"},
		{"EXTWORKER_CONSOLE_COCKPIT_URL", "https://ops:pa55wd@cockpit.example/camunda"},
		// A second outside tester: an unescaped / makes the password a path (host "u",
		// port 1234), and secrets in query strings.
		{"EXTWORKER_ENGINE_URL", "http://u:1234/pa55wd@127.0.0.1:8081/engine-rest"},
		{"EXTWORKER_ENGINE_URL", "http://127.0.0.1:8081/engine-rest?token=pa55wd"},
		{"EXTWORKER_ENGINE_OAUTH_TOKEN_URL", "http://127.0.0.1:9/token?client_secret=pa55wd"},
		{"EXTWORKER_CONSOLE_COCKPIT_URL", "https://cockpit.example/camunda?access_token=pa55wd"},
	} {
		t.Run(tc.name+" "+tc.value, func(t *testing.T) {
			testenv.ClearConfigEnv(t)
			t.Setenv(tc.name, tc.value)
			if strings.Contains(tc.name, "OAUTH") {
				t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_ID", "worker")
				t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET", "client-s3cret")
			}
			table, asJSON, _ := configOutput(t)
			for _, secret := range []string{"pa55wd", "s3cret"} {
				assert.NotContains(t, table, secret)
				assert.NotContains(t, asJSON, secret)
			}
			assert.Contains(t, table, tc.name)
		})
	}
}

// An unparseable URL is shown as such, not at all.
func TestConfigUnparseableSecretURLNotShown(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_AMQP_URL", "amqp://extworker:SEC#x@127.0.0.1:5672/extworker")
	table, _, err := configOutput(t)
	require.Error(t, err)
	assert.Regexp(t, `EXTWORKER_AMQP_URL\s+\(not shown: not a URL\)\s+env`, table)
	assert.Contains(t, err.Error(), "percent-encoded")
}

// Credentials inside EXTWORKER_ENGINE_URL (user and password, or a token as the user)
// are a configuration problem, whatever the scheme and host: they would bypass
// EXTWORKER_ENGINE_ALLOW_PLAINTEXT_AUTH and show wherever the URL is shown. The message
// names the variable and where the credentials go, never the credentials.
func TestEngineURLRefusesCredentials(t *testing.T) {
	for _, v := range []string{
		"http://admin:SECRETPW@10.0.0.7:8080/engine-rest",
		"http://TOKSECRET@127.0.0.1:18779/engine-rest",
		"https://admin:SECRETPW@bpm.example.com/engine-rest",
		"http://u:1234/SECRETPW@127.0.0.1:8081/engine-rest", // Go reads host u, port 1234, the password as the path
	} {
		testenv.ClearConfigEnv(t)
		t.Setenv("EXTWORKER_ENGINE_URL", v)
		_, err := daemon.LoadConfig()
		var ce daemon.ConfigError
		require.True(t, errors.As(err, &ce), "%s: a configuration problem (78): %v", v, err)
		assert.Contains(t, err.Error(), "EXTWORKER_ENGINE_URL")
		assert.Contains(t, err.Error(), "put the credentials in EXTWORKER_ENGINE_USER and EXTWORKER_ENGINE_PASSWORD (or the token variables)")
		assert.NotContains(t, err.Error(), "SECRET")
		assert.NotContains(t, err.Error(), "admin")
	}
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_ENGINE_OAUTH_TOKEN_URL", "https://idp:IDPSECRET@idp.example/token")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_ID", "worker")
	t.Setenv("EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET", "client-s3cret")
	_, err := daemon.LoadConfig()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "EXTWORKER_ENGINE_OAUTH_TOKEN_URL")
	assert.Contains(t, err.Error(), "EXTWORKER_ENGINE_OAUTH_CLIENT_ID and EXTWORKER_ENGINE_OAUTH_CLIENT_SECRET")
	assert.NotContains(t, err.Error(), "IDPSECRET")
}

// A query string or fragment in EXTWORKER_ENGINE_URL can never address the REST API
// (and would end up inside the derived Cockpit link): refused, without echoing it.
func TestEngineURLRefusesQueryAndFragment(t *testing.T) {
	for _, v := range []string{
		"https://bpm.example.com/engine-rest?token=SECRETQ",
		"https://bpm.example.com/engine-rest#SECRETQ",
		"https://bpm.example.com/engine-rest?",
	} {
		testenv.ClearConfigEnv(t)
		t.Setenv("EXTWORKER_ENGINE_URL", v)
		_, err := daemon.LoadConfig()
		var ce daemon.ConfigError
		require.True(t, errors.As(err, &ce), "%s: %v", v, err)
		assert.Contains(t, err.Error(), "EXTWORKER_ENGINE_URL")
		assert.Contains(t, err.Error(), "query string or fragment")
		assert.NotContains(t, err.Error(), "SECRETQ")
	}
}

// RedactURL masks any user info, a user name alone (a token) included, and a password
// holding an @.
func TestRedactURLMasksAllUserInfo(t *testing.T) {
	assert.Equal(t, "http://***@127.0.0.1:1/engine-rest", daemon.RedactURL("http://TOKSECRET@127.0.0.1:1/engine-rest"))
	assert.Equal(t, "postgres://***@db/x", daemon.RedactURL("postgres://u:a@SECRET@db/x"))
	assert.Equal(t, "https://h/engine-rest", daemon.RedactURL("https://h/engine-rest"))
}

// The Cockpit link is derived only from an engine URL whose path ends in /engine-rest;
// otherwise none is derived, and `extworker config` says so.
func TestCockpitURLDerivedOnlyFromEngineRest(t *testing.T) {
	for _, tc := range []struct{ engine, cockpit string }{
		{"https://bpm.example.com/engine-rest", "https://bpm.example.com/camunda"},
		{"https://bpm.example.com:8443/engine-rest/", "https://bpm.example.com:8443/camunda"},
		{"https://bpm.example.com/ctx/engine-rest", "https://bpm.example.com/ctx/camunda"},
		{"https://bpm.example.com/rest", ""},
		{"https://bpm.example.com/engine-rest/../camunda", ""},
		{"https://bpm.example.com", ""},
	} {
		testenv.ClearConfigEnv(t)
		t.Setenv("EXTWORKER_ENGINE_URL", tc.engine)
		c, err := daemon.LoadConfig()
		require.NoError(t, err)
		assert.Equal(t, tc.cockpit, c.CockpitURL(), tc.engine)
		if tc.cockpit == "" {
			table, _, err := configOutput(t)
			require.NoError(t, err)
			assert.Regexp(t, `EXTWORKER_CONSOLE_COCKPIT_URL\s+\(none: EXTWORKER_ENGINE_URL's path does not end in /engine-rest; set EXTWORKER_CONSOLE_COCKPIT_URL\)\s+derived from EXTWORKER_ENGINE_URL`, table)
		}
	}
}

// The ledger's namespace is checked by the ledger's own rule when the configuration is
// read: invalid UTF-8 and an absurd length (a NUL cannot be in the environment) are configuration problems (78), not
// the worker's exit 1 at start.
func TestLedgerNamespaceValidatedAtConfig(t *testing.T) {
	for _, ns := range []string{"ns\xff", strings.Repeat("n", 10000)} {
		testenv.ClearConfigEnv(t)
		t.Setenv("EXTWORKER_LEDGER_NAMESPACE", ns)
		_, err := daemon.LoadConfig()
		var ce daemon.ConfigError
		require.True(t, errors.As(err, &ce), "%q: %v", ns, err)
		assert.Contains(t, err.Error(), "EXTWORKER_LEDGER_NAMESPACE")
	}
}

// `extworker config`'s table escapes control characters (as --json does): a value cannot
// recolour or rewrite the operator's terminal.
func TestConfigTableEscapesControlCharacters(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_LEDGER_NAMESPACE", "ns\x1b[31mRED\x1b[0m\a")
	t.Setenv("EXTWORKER_WORKER_ID", "w\x1b]0;title\a")
	t.Setenv("EXTWORKER_HTTP_ADDR", "127.0.0.1:0\x1b[2J")
	var out bytes.Buffer
	_ = daemon.ConfigCommand(nil, &out, io.Discard)
	assert.NotContains(t, out.String(), "\x1b")
	assert.NotContains(t, out.String(), "\a")
	assert.Contains(t, out.String(), `ns\x1b[31mRED\x1b[0m\a`)
}
