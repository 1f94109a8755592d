package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/extworkertest"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/inbox/inboxtest"
)

// The claims consumer's decision, without services: a parcel.damaged event starts one
// claim keyed by its shipment; a body that is not one is parked with a reason that
// names no secret.
func TestClaimsDecide(t *testing.T) {
	t.Setenv("COURIER_CLAIMS", "carrier.claims")
	t.Setenv("COURIER_CLAIM_PROCESS", "claim")
	cfg, decide := claims()
	assert.Equal(t, "carrier", cfg.Source)
	assert.Equal(t, "carrier.claims", cfg.Queue)

	act, err := decide(inbox.Message{ID: "m-1", Type: "parcel.damaged", Body: []byte(`{"shipment":"S-1","note":"crushed"}`)})
	require.NoError(t, err)
	require.NotNil(t, act.Start)
	assert.Equal(t, "claim", act.Start.ProcessKey)
	assert.Equal(t, "S-1", act.Start.BusinessKey, "the shipment is the claim's business key: one claim per shipment")
	assert.Equal(t, camunda7.Variables{"shipmentId": camunda7.StringVar("S-1")}, act.Start.Variables)

	for name, body := range map[string]string{
		"not JSON":      `parcel damaged`,
		"no shipment":   `{"note":"crushed"}`,
		"empty":         ``,
		"shipment null": `{"shipment":null}`,
	} {
		_, err := decide(inbox.Message{ID: "m-2", Body: []byte(body)})
		assert.EqualError(t, err, "not a parcel.damaged event with a shipment", name)
	}
}

// The claims consumer through the inbox (PostgreSQL at EXTWORKER_DATABASE_URL, migrated
// with `extworker migrate`; skipped without it, failed under CI=true) and an engine in
// memory: an event opens its claim once, its redelivery and a second event for the same
// shipment open nothing more, and an unreadable event is parked.
func TestClaimsOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, extworkertest.DatabaseURL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL at EXTWORKER_DATABASE_URL: %v", err)
		}
		t.Skipf("PostgreSQL at EXTWORKER_DATABASE_URL: %v", err)
	}

	run := extworkertest.Unique("claims")
	t.Setenv("COURIER_CLAIMS", run)
	t.Setenv("COURIER_CLAIM_PROCESS", "claim")
	cfg, decide := claims()
	cfg.Source = run // rows of their own: the inbox's key is the source and the message id
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DELETE FROM extworker_inbox WHERE source = $1`, run) })
	engine := inboxtest.New(0)
	engine.Deploy("claim")
	c, err := inbox.NewConsumer(pool, engine, "", decide, cfg)
	require.NoError(t, err)

	handle := func(id, body string) inbox.Handling {
		t.Helper()
		h, err := c.Handle(ctx, inbox.Message{ID: id, Type: "parcel.damaged", Body: []byte(body)})
		require.NoError(t, err)
		return h
	}
	shipment := run + "-S-1"
	first := handle("m-1", `{"shipment":"`+shipment+`"}`)
	assert.Equal(t, inbox.ClassStarted, first.Class)
	assert.Equal(t, inbox.Ack, first.Disposition)
	again := handle("m-1", `{"shipment":"`+shipment+`"}`) // the broker redelivers it
	assert.Equal(t, inbox.ClassDuplicate, again.Class)
	assert.Equal(t, inbox.Ack, again.Disposition)
	twin := handle("m-2", `{"shipment":"`+shipment+`","note":"reported twice"}`) // the carrier sends it twice
	assert.Equal(t, inbox.ClassIgnored, twin.Class, twin.Reason)
	assert.Equal(t, inbox.Ack, twin.Disposition)
	claimsOpened := engine.Instances("claim", shipment)
	require.Len(t, claimsOpened, 1, "one claim per shipment")
	assert.Equal(t, first.ProcessInstanceID, claimsOpened[0].ID)
	got, err := claimsOpened[0].Variables.String("shipmentId")
	require.NoError(t, err)
	assert.Equal(t, shipment, got)

	parked := handle("m-3", `parcel damaged`)
	assert.Equal(t, inbox.Park, parked.Disposition)
	assert.Contains(t, parked.Reason, "not a parcel.damaged event with a shipment")
}
