package testenv

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/failpoint"
)

// FreeAddr is a loopback address (127.0.0.1:port) nothing listens on now, for a server
// the test starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// NeedFailpoints fails the test in CI, and skips it elsewhere, when the build has no
// failpoints (the crash rows need -tags failpoints, as make test builds them).
func NeedFailpoints(t testing.TB) {
	t.Helper()
	if failpoint.Enabled {
		return
	}
	const msg = "the crash rows need a build with -tags failpoints (make test)"
	if InCI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}
