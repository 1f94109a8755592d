package main

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/tasks/taskstest"
)

// The handler's unit tests, without services: taskstest runs the handler through the
// real worker over an in-memory engine, and the ledger keeps its intents in memory.

func bookingTask(shipment, postcode string) taskstest.Task {
	return taskstest.Task{Topic: bookTopic, BusinessKey: shipment, Variables: camunda7.Variables{
		"shipmentId": camunda7.StringVar(shipment), "postcode": camunda7.StringVar(postcode)}}
}

// A shipment is booked once, whatever the engine redelivers: the second delivery is
// completed from the ledger with the same booking, without a second request.
func TestBookCourierBooksOnce(t *testing.T) {
	prov, c := startCourier(t)
	h := bookCourier(idempotency.NewInMemory(idempotency.Config{}), c)

	first := taskstest.Run(t, h, bookingTask("S-1", "10115"), bookOptions)
	require.NotNil(t, first.Completed, "outcome %s: %+v", first.Outcome, first.Failure)
	id, err := first.Completed.Variables.String("bookingId")
	require.NoError(t, err)
	assert.Equal(t, "bk_1", id)

	again := taskstest.Run(t, h, bookingTask("S-1", "10115"), bookOptions)
	require.NotNil(t, again.Completed, "outcome %s: %+v", again.Outcome, again.Failure)
	assert.Equal(t, first.Completed.Variables, again.Completed.Variables)
	assert.Equal(t, 1, prov.posts, "the redelivery is answered from the ledger")
	assert.Equal(t, 1, prov.booked())
}

// An address the courier refuses is the process's ADDRESS_REJECTED error, not a retry.
func TestBookCourierRefusedAddress(t *testing.T) {
	_, c := startCourier(t)
	res := taskstest.Run(t, bookCourier(idempotency.NewInMemory(idempotency.Config{}), c), bookingTask("S-3", "00000"), bookOptions)
	require.NotNil(t, res.BPMNError, "outcome %s: %+v", res.Outcome, res.Failure)
	assert.Equal(t, "ADDRESS_REJECTED", res.BPMNError.Code)
}

// A task without its shipment is an incident naming the variable, and the courier is
// not called.
func TestBookCourierWithoutShipment(t *testing.T) {
	prov, c := startCourier(t)
	task := bookingTask("S-4", "10115")
	delete(task.Variables, "shipmentId")
	res := taskstest.Run(t, bookCourier(idempotency.NewInMemory(idempotency.Config{}), c), task, bookOptions)
	require.NotNil(t, res.Failure, "outcome %s", res.Outcome)
	assert.True(t, res.Failure.Incident(), res.Failure.Message)
	assert.Contains(t, res.Failure.Message, "shipmentId")
	assert.Zero(t, prov.posts)
}

func decode(r *http.Request, v any) error { return json.NewDecoder(r.Body).Decode(v) }
