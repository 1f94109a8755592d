package daemon_test

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/daemon"
)

// A second worker on one host meets the first one's operations address: the error names
// the variable with the address taken, and both ways out (another address, or off).
func TestOpsAddressTakenNamesTheWayOut(t *testing.T) {
	first, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer first.Close()
	_, _, err = daemon.StartOps(context.Background(), daemon.OpsConfig{HTTPAddr: first.Addr().String()},
		daemon.NewOpsRegistry(), nil, nil, nil, slog.New(slog.DiscardHandler))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "EXTWORKER_HTTP_ADDR="+first.Addr().String()+": ")
	assert.Contains(t, err.Error(), "address already in use")
	assert.Contains(t, err.Error(), "set EXTWORKER_HTTP_ADDR to a free address")
	assert.Contains(t, err.Error(), "EXTWORKER_HTTP_ADDR=off")
}
