package taskstest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: every worker, handler
// and long poll that Run starts must end when it returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
