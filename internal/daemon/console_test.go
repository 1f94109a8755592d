package daemon_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// The console is off by default, and none of its variables is checked then. Turned on,
// it needs exactly one way of authenticating operators, a proxy header only with the
// proxy's addresses, and TLS files in pairs.
func TestConsoleConfig(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_CONSOLE_TRUSTED_PROXIES", "not-an-address")
	c, err := daemon.LoadConfig()
	require.NoError(t, err, "off: nothing is checked")
	assert.Empty(t, c.ConsoleAddr)

	t.Setenv("EXTWORKER_CONSOLE_TRUSTED_PROXIES", "")
	t.Setenv("EXTWORKER_CONSOLE_ADDR", "127.0.0.1:9465")
	_, err = daemon.LoadConfig()
	assert.Equal(t, []string{"EXTWORKER_CONSOLE_ADDR needs a way to authenticate operators: EXTWORKER_CONSOLE_OPERATORS_FILE (name:bcrypt-hash lines) " +
		"or EXTWORKER_CONSOLE_AUTH_HEADER (a reverse proxy's user header); see docs/console.md"}, problemLines(t, err))

	t.Setenv("EXTWORKER_CONSOLE_OPERATORS_FILE", "/etc/extworker/operators")
	t.Setenv("EXTWORKER_CONSOLE_AUTH_HEADER", "X-Forwarded-User")
	t.Setenv("EXTWORKER_CONSOLE_TRUSTED_PROXIES", "10.0.0.0/8,proxy.local")
	t.Setenv("EXTWORKER_CONSOLE_TLS_CERT_FILE", "/etc/tls/console.crt")
	t.Setenv("EXTWORKER_CONSOLE_SESSION_TTL", "0s")
	_, err = daemon.LoadConfig()
	assert.ElementsMatch(t, []string{
		"EXTWORKER_CONSOLE_OPERATORS_FILE and EXTWORKER_CONSOLE_AUTH_HEADER: set one, not both",
		`EXTWORKER_CONSOLE_TRUSTED_PROXIES "proxy.local": want CIDRs (10.0.0.0/8) or addresses, comma-separated`,
		"EXTWORKER_CONSOLE_TLS_CERT_FILE and EXTWORKER_CONSOLE_TLS_KEY_FILE must be set together",
		"EXTWORKER_CONSOLE_SESSION_TTL 0s: must be positive",
	}, problemLines(t, err))

	t.Setenv("EXTWORKER_CONSOLE_OPERATORS_FILE", "")
	t.Setenv("EXTWORKER_CONSOLE_TRUSTED_PROXIES", "")
	t.Setenv("EXTWORKER_CONSOLE_TLS_CERT_FILE", "")
	t.Setenv("EXTWORKER_CONSOLE_SESSION_TTL", "8h")
	_, err = daemon.LoadConfig()
	assert.Equal(t, []string{"EXTWORKER_CONSOLE_AUTH_HEADER needs EXTWORKER_CONSOLE_TRUSTED_PROXIES: " +
		"the addresses of the proxy that sets it, so that nobody else can name an operator"}, problemLines(t, err))

	t.Setenv("EXTWORKER_CONSOLE_TRUSTED_PROXIES", "10.0.0.0/8, 192.0.2.7")
	c, err = daemon.LoadConfig()
	require.NoError(t, err)
	proxies, err := daemon.ConsoleTrustedProxies(c.ConsoleTrustedProxies)
	require.NoError(t, err)
	assert.Equal(t, "[10.0.0.0/8 192.0.2.7/32]", fmtAny(proxies))
}

// The console's database defaults to the worker's; Cockpit is found beside the engine's
// REST root, unless EXTWORKER_CONSOLE_COCKPIT_URL says otherwise.
// `extworker config` lists the console's variables, the database URL's password masked.
func TestConsoleConfigDefaults(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_ENGINE_URL", "https://camunda.example:8443/engine-rest/")
	c, err := daemon.LoadConfig()
	require.NoError(t, err)
	assert.Equal(t, c.DatabaseURL, c.ConsoleDatabase())
	assert.Equal(t, "https://camunda.example:8443/camunda", c.CockpitURL())
	t.Setenv("EXTWORKER_CONSOLE_COCKPIT_URL", "https://cockpit.example/camunda/")
	t.Setenv("EXTWORKER_CONSOLE_DATABASE_URL", "postgres://console:c0nsole-pw@db.example/ledger?sslmode=verify-full")
	c, err = daemon.LoadConfig()
	require.NoError(t, err)
	assert.Equal(t, "https://cockpit.example/camunda", c.CockpitURL())
	assert.Equal(t, "postgres://console:c0nsole-pw@db.example/ledger?sslmode=verify-full", c.ConsoleDatabase())

	var out, errOut bytes.Buffer
	require.NoError(t, daemon.ConfigCommand(nil, &out, &errOut))
	for _, name := range []string{"EXTWORKER_CONSOLE_ADDR", "EXTWORKER_CONSOLE_OPERATORS_FILE", "EXTWORKER_CONSOLE_AUTH_HEADER",
		"EXTWORKER_CONSOLE_TRUSTED_PROXIES", "EXTWORKER_CONSOLE_SESSION_KEY_FILE", "EXTWORKER_CONSOLE_SESSION_TTL",
		"EXTWORKER_CONSOLE_TLS_CERT_FILE", "EXTWORKER_CONSOLE_TLS_KEY_FILE", "EXTWORKER_CONSOLE_DATABASE_URL", "EXTWORKER_CONSOLE_COCKPIT_URL"} {
		assert.Contains(t, out.String(), name)
	}
	assert.NotContains(t, out.String(), "c0nsole-pw")
}

func fmtAny(v any) string { return fmt.Sprint(v) }
