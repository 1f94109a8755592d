package console_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/console"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/testenv"
)

// The console as the entry point opens it from EXTWORKER_CONSOLE_*: on a listener of
// its own, with the operators file; a login that is not the console's is named on every
// page; an operators file that is not one is a configuration error.
func TestOpenFromConfig(t *testing.T) {
	testenv.DB(t)
	testenv.ClearConfigEnv(t)
	ctx := testenv.Context(t, time.Minute)
	line, err := console.OperatorLine("alice", mustHash(t, "alice-password"))
	require.NoError(t, err)
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LEDGER_NAMESPACE", testenv.Unique("ns"))
	t.Setenv("EXTWORKER_CONSOLE_ADDR", "127.0.0.1:0")
	t.Setenv("EXTWORKER_CONSOLE_OPERATORS_FILE", testenv.WriteFile(t, "operators", line+"\n"))
	t.Setenv("EXTWORKER_CONSOLE_DATABASE_URL", testenv.DBURLAs(testenv.ConsoleLogin))
	logger := slog.New(slog.DiscardHandler)
	loginPage := func() string {
		t.Helper()
		cfg, err := daemon.LoadConfig()
		require.NoError(t, err)
		s, err := console.Open(ctx, cfg, nil, logger)
		require.NoError(t, err)
		defer s.Close()
		addr, stop, err := s.Start(ctx)
		require.NoError(t, err)
		defer stop()
		resp, err := http.Get("http://" + addr + "/login")
		require.NoError(t, err)
		defer resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.NotEmpty(t, resp.Header.Get("Content-Security-Policy"))
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(b)
	}
	assert.NotContains(t, loginPage(), `class="notice"`, "the console's own login can do everything")

	t.Setenv("EXTWORKER_CONSOLE_DATABASE_URL", "") // the worker's: the database owner here
	assert.Contains(t, loginPage(), "is not a member of extworker_console")

	t.Setenv("EXTWORKER_CONSOLE_OPERATORS_FILE", testenv.WriteFile(t, "operators", "alice:plain-password\n"))
	cfg, err := daemon.LoadConfig()
	require.NoError(t, err)
	_, err = console.Open(ctx, cfg, nil, logger)
	var ce daemon.ConfigError
	require.True(t, errors.As(err, &ce), "a configuration error: %v", err)
	assert.NotContains(t, err.Error(), "plain-password")
}

// (e) EXTWORKER_CONSOLE_TRUSTED_PROXIES=0.0.0.0/0 is refused at start, naming the
// variable: it would believe the operator header from anyone.
func TestOpenRefusesWideTrustedProxies(t *testing.T) {
	testenv.DB(t)
	testenv.ClearConfigEnv(t)
	ctx := testenv.Context(t, time.Minute)
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_LEDGER_NAMESPACE", testenv.Unique("ns"))
	t.Setenv("EXTWORKER_CONSOLE_ADDR", "127.0.0.1:0")
	t.Setenv("EXTWORKER_CONSOLE_AUTH_HEADER", "X-Forwarded-User")
	t.Setenv("EXTWORKER_CONSOLE_DATABASE_URL", testenv.DBURLAs(testenv.ConsoleLogin))
	for _, wide := range []string{"0.0.0.0/0", "::/0", "10.0.0.0/8,0.0.0.0/1"} {
		t.Setenv("EXTWORKER_CONSOLE_TRUSTED_PROXIES", wide)
		cfg, err := daemon.LoadConfig()
		require.NoError(t, err)
		_, err = console.Open(ctx, cfg, nil, slog.New(slog.DiscardHandler))
		var ce daemon.ConfigError
		require.True(t, errors.As(err, &ce), "a configuration error: %v", err)
		assert.Contains(t, err.Error(), "EXTWORKER_CONSOLE_TRUSTED_PROXIES", wide)
	}
}
