package inboxtest_test

import (
	"context"
	"fmt"
	"net/url"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox/inboxtest"
)

// An engine in memory holds what a test of a consumer needs: a deployed process whose
// instances wait for a message, and one started outside the inbox. A test hands it to
// inbox.NewConsumer in place of admin.New(client), then reads what the inbox did.
func ExampleEngine() {
	ctx := context.Background()
	engine := inboxtest.New(0)
	engine.Deploy("order", "paid")
	id := engine.Run("order", "A-1", "paid")

	_, err := engine.CorrelateMessageResult(ctx, admin.MessageCorrelation{MessageName: "paid", BusinessKey: "A-1", ProcessInstanceID: id})
	fmt.Println("first payment:", err == nil)
	_, err = engine.CorrelateMessageResult(ctx, admin.MessageCorrelation{MessageName: "paid", BusinessKey: "A-1", ProcessInstanceID: id})
	fmt.Println("second payment:", err)
	running, _ := engine.ProcessInstances(ctx, url.Values{"processDefinitionKey": {"order"}, "businessKey": {"A-1"}})
	fmt.Println("running:", len(running))
	// Output:
	// first payment: true
	// second payment: correlate message paid: engine answered 400 RestException: Cannot correlate message 'paid': No process definition or execution matches the parameters
	// running: 1
}
