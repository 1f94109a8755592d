package inbox

import (
	"context"
	"net/url"
	"reflect"
	"time"

	"github.com/extworker/extworker/camunda7/admin"
)

// Engine is what a Consumer asks of the engine: start a process, correlate a message to
// an instance, and look up instances and the variables its marks set (StartMarkVariable,
// extworkerMessage_<name>). An *admin.Client (admin.New of the engine's
// *camunda7.Client) is the Engine of production consumers; package inboxtest holds one
// in memory, for tests of a Decide and of the inbox's handling without an engine.
//
// Errors are the engine client's (package camunda7): ErrNotSent, ErrThrottled,
// ErrUnauthorized, ErrOptimisticLock, ErrNotFound, and a *camunda7.Error for an answer
// that refused the request; any other error is an answer lost (an unknown outcome).
type Engine interface {
	// StartProcess starts the latest version of the process with key (ErrNotFound: it is
	// not deployed).
	StartProcess(ctx context.Context, key string, r admin.StartProcessRequest) (*admin.ProcessInstance, error)
	// CorrelateMessageResult delivers a message to the instance r.ProcessInstanceID; an
	// instance that does not wait for it is a *camunda7.Error, 400 "Cannot correlate
	// message ...".
	CorrelateMessageResult(ctx context.Context, r admin.MessageCorrelation) ([]admin.CorrelationResult, error)
	// ProcessInstances lists the running instances; the inbox asks by
	// processDefinitionKey and businessKey.
	ProcessInstances(ctx context.Context, q url.Values) ([]admin.ProcessInstance, error)
	// HistoricProcessInstances lists instances, running and ended; the inbox asks by
	// processDefinitionKey and processInstanceBusinessKey.
	HistoricProcessInstances(ctx context.Context, q url.Values) ([]admin.HistoricProcessInstance, error)
	// HistoricVariableInstances lists variables; the inbox asks by variableName and
	// processInstanceIdIn (comma-separated).
	HistoricVariableInstances(ctx context.Context, q url.Values) ([]admin.HistoricVariableInstance, error)
	// LongPollTimeout is how long the client waits for an answer (the inbox asks for
	// LongPollTimeout(0): ClientTimeout).
	LongPollTimeout(asyncResponseTimeout time.Duration) time.Duration
}

// *admin.Client is the Engine of production consumers.
var _ Engine = (*admin.Client)(nil)

// isNil reports whether e is nil, or an interface holding a nil pointer (a nil
// *admin.Client passed to NewConsumer).
func isNil(e Engine) bool {
	if e == nil {
		return true
	}
	v := reflect.ValueOf(e)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
