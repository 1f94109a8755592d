package inboxtest_test

import (
	"testing"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/inbox/inboxtest"
)

// TestEngineConformanceInMemory runs the engine's behaviour suite against the engine in
// memory (package inbox runs it against the real one): no services.
func TestEngineConformanceInMemory(t *testing.T) {
	e := inboxtest.New(0)
	inboxtest.RunEngineSuite(t, inboxtest.Harness{Engine: e, Timeout: camunda7.DefaultTimeout,
		Deploy: func(_ *testing.T, key, message string) { e.Deploy(key, message) },
		End:    func(_ *testing.T, id string) { e.End(id) }})
}
