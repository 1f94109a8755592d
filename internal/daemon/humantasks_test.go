package daemon_test

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/humantask"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// The human-task service is off by default, and none of its variables is checked then.
// Turned on, it needs exactly one identity source: a proxy header with the proxy's
// addresses (none so wide that it names no proxy), or a JWT issuer with its key set and
// audience; TLS files come in pairs. Each problem names its variable.
func TestTasksConfig(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_TASKS_TRUSTED_PROXIES", "not-an-address")
	c, err := daemon.LoadConfig()
	require.NoError(t, err, "off: nothing is checked")
	assert.Empty(t, c.TasksAddr)
	assert.Equal(t, "humantask", c.TasksNamespace)

	t.Setenv("EXTWORKER_TASKS_TRUSTED_PROXIES", "")
	t.Setenv("EXTWORKER_TASKS_ADDR", "127.0.0.1")
	_, err = daemon.LoadConfig()
	assert.ElementsMatch(t, []string{
		`EXTWORKER_TASKS_ADDR "127.0.0.1": want host:port: address 127.0.0.1: missing port in address`,
		"EXTWORKER_TASKS_ADDR needs a way to tell who sends a request: EXTWORKER_TASKS_AUTH_HEADER (a reverse proxy's user header) " +
			"or EXTWORKER_TASKS_JWT_ISSUER (bearer tokens); see docs/humantasks.md",
	}, problemLines(t, err))

	t.Setenv("EXTWORKER_TASKS_ADDR", "127.0.0.1:9470")
	t.Setenv("EXTWORKER_TASKS_AUTH_HEADER", "X-Forwarded-User")
	_, err = daemon.LoadConfig()
	assert.Equal(t, []string{"EXTWORKER_TASKS_AUTH_HEADER needs EXTWORKER_TASKS_TRUSTED_PROXIES: " +
		"the addresses of the proxy that sets it, so that nobody else can name a user"}, problemLines(t, err))
	t.Setenv("EXTWORKER_TASKS_TRUSTED_PROXIES", "10.0.0.0/8,proxy.local")
	_, err = daemon.LoadConfig()
	assert.Equal(t, []string{`EXTWORKER_TASKS_TRUSTED_PROXIES "proxy.local": want CIDRs (10.0.0.0/8) or addresses, comma-separated`}, problemLines(t, err))
	t.Setenv("EXTWORKER_TASKS_TRUSTED_PROXIES", "0.0.0.0/0")
	_, err = daemon.LoadConfig()
	assert.Equal(t, []string{"EXTWORKER_TASKS_TRUSTED_PROXIES: trusted proxy 0.0.0.0/0 is too wide to name a proxy (at least /8)"}, problemLines(t, err))

	t.Setenv("EXTWORKER_TASKS_TRUSTED_PROXIES", "")
	t.Setenv("EXTWORKER_TASKS_JWT_ISSUER", "https://login.example/realms/acme")
	t.Setenv("EXTWORKER_TASKS_JWT_JWKS_URL", "http://login.example/certs")
	t.Setenv("EXTWORKER_TASKS_TLS_KEY_FILE", "/etc/tls/tasks.key")
	_, err = daemon.LoadConfig()
	assert.ElementsMatch(t, []string{
		"EXTWORKER_TASKS_AUTH_HEADER and EXTWORKER_TASKS_JWT_*: set one, not both",
		"EXTWORKER_TASKS_TLS_CERT_FILE and EXTWORKER_TASKS_TLS_KEY_FILE must be set together",
	}, problemLines(t, err))

	t.Setenv("EXTWORKER_TASKS_AUTH_HEADER", "")
	_, err = daemon.LoadConfig()
	assert.ElementsMatch(t, []string{
		"EXTWORKER_TASKS_JWT_ISSUER, EXTWORKER_TASKS_JWT_JWKS_URL and EXTWORKER_TASKS_JWT_AUDIENCE must be set together",
		`EXTWORKER_TASKS_JWT_JWKS_URL "http://login.example/certs": want an https:// URL (http:// only on loopback)`,
		"EXTWORKER_TASKS_TLS_CERT_FILE and EXTWORKER_TASKS_TLS_KEY_FILE must be set together",
	}, problemLines(t, err))

	t.Setenv("EXTWORKER_TASKS_JWT_JWKS_URL", "https://login.example/certs")
	t.Setenv("EXTWORKER_TASKS_JWT_AUDIENCE", "tasks")
	t.Setenv("EXTWORKER_TASKS_TLS_KEY_FILE", "")
	t.Setenv("EXTWORKER_TASKS_PAGE", "yes")
	_, err = daemon.LoadConfig()
	assert.Equal(t, []string{`EXTWORKER_TASKS_PAGE "yes": want true or false`}, problemLines(t, err))
	t.Setenv("EXTWORKER_TASKS_PAGE", "true")
	c, err = daemon.LoadConfig()
	require.NoError(t, err)
	id, err := c.TasksIdentity()
	require.NoError(t, err)
	assert.IsType(t, &humantask.JWT{}, id)

	var out, errOut bytes.Buffer
	require.NoError(t, daemon.ConfigCommand(nil, &out, &errOut))
	for _, name := range []string{"EXTWORKER_TASKS_ADDR", "EXTWORKER_TASKS_AUTH_HEADER", "EXTWORKER_TASKS_GROUPS_HEADER",
		"EXTWORKER_TASKS_TRUSTED_PROXIES", "EXTWORKER_TASKS_JWT_ISSUER", "EXTWORKER_TASKS_JWT_JWKS_URL", "EXTWORKER_TASKS_JWT_AUDIENCE",
		"EXTWORKER_TASKS_JWT_USER_CLAIM", "EXTWORKER_TASKS_JWT_GROUPS_CLAIM", "EXTWORKER_TASKS_TLS_CERT_FILE",
		"EXTWORKER_TASKS_TLS_KEY_FILE", "EXTWORKER_TASKS_PAGE", "EXTWORKER_TASKS_NAMESPACE"} {
		assert.Contains(t, out.String(), name)
	}
}

// With a proxy header, the identity is believed from the proxy's addresses only, with
// the groups of EXTWORKER_TASKS_GROUPS_HEADER.
func TestTasksProxyIdentity(t *testing.T) {
	testenv.ClearConfigEnv(t)
	t.Setenv("EXTWORKER_TASKS_ADDR", "127.0.0.1:9470")
	t.Setenv("EXTWORKER_TASKS_AUTH_HEADER", "X-Forwarded-User")
	t.Setenv("EXTWORKER_TASKS_GROUPS_HEADER", "X-Forwarded-Groups")
	t.Setenv("EXTWORKER_TASKS_TRUSTED_PROXIES", "192.0.2.7")
	c, err := daemon.LoadConfig()
	require.NoError(t, err)
	id, err := c.TasksIdentity()
	require.NoError(t, err)
	req := httptest.NewRequest("GET", "/tasks", nil)
	req.Header.Set("X-Forwarded-User", "alice")
	req.Header.Set("X-Forwarded-Groups", "approvers, clerks")
	req.RemoteAddr = "192.0.2.7:4000"
	who, err := id.Identify(req)
	require.NoError(t, err)
	assert.Equal(t, humantask.Identity{User: "alice", Groups: []string{"approvers", "clerks"}}, who)
	req.RemoteAddr = "192.0.2.8:4000"
	_, err = id.Identify(req)
	assert.ErrorIs(t, err, humantask.ErrNoIdentity)
}
