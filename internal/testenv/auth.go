package testenv

import (
	"testing"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
)

// The second engine `make up` starts, with HTTP basic authentication on /engine-rest and
// its own database (camunda_auth); see services/engine-up.sh (ENGINE_REST_AUTH=true).
const (
	DefaultAuthEngineURL = "http://127.0.0.1:8081/engine-rest"
	// AuthEngineUser and AuthEnginePassword are the administrator engine-up.sh creates
	// (ENGINE_ADMIN_USER, ENGINE_ADMIN_PASSWORD).
	AuthEngineUser     = "admin"
	AuthEnginePassword = "extworker-admin"
)

// AuthEngineURL is EXTWORKER_TEST_AUTH_ENGINE_URL or the local engine with authentication.
func AuthEngineURL() string { return env("EXTWORKER_TEST_AUTH_ENGINE_URL", DefaultAuthEngineURL) }

// AuthEngine returns a client for the engine with REST authentication, logged in as the
// administrator, after checking it answers. Like Engine, it fails in CI and skips
// elsewhere when that engine is not there.
func AuthEngine(t testing.TB) *admin.Client {
	t.Helper()
	return engine(t, "engine with REST authentication",
		camunda7.Config{BaseURL: AuthEngineURL(), Username: AuthEngineUser, Password: AuthEnginePassword})
}
