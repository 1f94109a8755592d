package taskstest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/tasks"
	"github.com/extworker/extworker/tasks/taskstest"
)

// A handler run against three tasks, without an engine: through the real worker, so the
// outcomes are the engine calls production would make. In a test, taskstest.Run(t, ...)
// does the same and fails the test if the task cannot be handled at all.
func Example() {
	type input struct {
		InvoiceID string `var:"invoiceId"`
		Amount    int64  `var:"amountCents"`
	}
	collect := func(ctx context.Context, t *tasks.Task) (camunda7.Variables, error) {
		var in input
		if err := t.Bind(&in); err != nil {
			return nil, err // a permanent error: an incident, no retries
		}
		switch {
		case in.Amount > 100_000:
			return nil, failure.BPMNError("NEEDS_APPROVAL", "amount over the limit", map[string]any{"limit": 100_000})
		case in.Amount == 0:
			return nil, errors.New("provider unavailable") // retryable
		}
		return camunda7.Variables{"paymentRef": camunda7.StringVar("pay-" + in.InvoiceID)}, nil
	}
	reg := tasks.NewRegistry()
	err := reg.Register("collect-payment", collect, tasks.TopicOptions{
		Variables: tasks.VariablesOf[input](), // fetch exactly what the handler binds
		Retry:     failure.RetryPolicy{MaxAttempts: 3, InitialDelay: 10 * time.Second},
	})
	if err != nil {
		panic(err)
	}
	task := func(amount int64) taskstest.Task {
		return taskstest.Task{Topic: "collect-payment", BusinessKey: "order-7", Variables: camunda7.Variables{
			"invoiceId": camunda7.StringVar("INV-1"), "amountCents": camunda7.LongVar(amount), "secret": camunda7.StringVar("x"),
		}}
	}

	res, err := taskstest.Handle(context.Background(), reg, task(1200))
	if err != nil {
		panic(err)
	}
	ref, _ := res.Completed.Variables.String("paymentRef")
	fmt.Println(res.Outcome, ref, "read:", res.Fetch.Variables, "not fetched: secret =", res.Fetched.Has("secret"))

	res, _ = taskstest.Handle(context.Background(), reg, task(250_000))
	fmt.Println(res.Outcome, res.BPMNError.Code, res.BPMNError.Message)

	res, _ = taskstest.Handle(context.Background(), reg, task(0))
	fmt.Println(res.Outcome, res.Failure.Retries, res.Failure.RetryTimeout)
	fmt.Println(res.Failure.Message)

	bad := task(0)
	delete(bad.Variables, "amountCents")
	res, _ = taskstest.Handle(context.Background(), reg, bad)
	fmt.Println(res.Outcome, res.Classification, res.Failure.Incident())
	fmt.Println(res.Failure.Message)

	// Output:
	// completed pay-INV-1 read: [invoiceId amountCents] not fetched: secret = false
	// bpmn-error NEEDS_APPROVAL amount over the limit
	// retryable 2 10s
	// retryable: provider unavailable (attempt 1 of 3, retrying in 10s)
	// incident permanent true
	// permanent: tasks: bind task variables to taskstest_test.input: field Amount: camunda7: variable "amountCents": missing
}
