package fakeprovider

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func start(t *testing.T) (*Server, *Client) {
	t.Helper()
	s, err := Start(10_000)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s, &Client{BaseURL: s.URL()}
}

func TestIdempotentCharge(t *testing.T) {
	s, c := start(t)
	ctx := context.Background()
	a, err := c.Charge(ctx, "k1", "INV-1", 500)
	require.NoError(t, err)
	b, err := c.Charge(ctx, "k1", "INV-1", 500)
	require.NoError(t, err)
	assert.Equal(t, a, b, "the same key replays the stored answer")
	assert.Len(t, s.Charges(), 1)
	assert.EqualValues(t, 2, s.Requests())
	_, err = c.Charge(ctx, "k1", "INV-1", 999)
	require.Error(t, err, "same key, different body")
	assert.Len(t, s.Charges(), 1)
	got, err := c.Lookup(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, a, got)
	_, err = c.Lookup(ctx, "nope")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.Zero(t, s.DoubleCharges())
}

func TestDecline(t *testing.T) {
	s, c := start(t)
	_, err := c.Charge(context.Background(), "k", "INV-2", 50_000)
	var d *DeclineError
	require.ErrorAs(t, err, &d)
	assert.Equal(t, "card_declined", d.Code)
	assert.Empty(t, s.Charges())
}

func TestScriptedFaults(t *testing.T) {
	s, c := start(t)
	ctx := context.Background()
	s.Script("INV-3", LoseAnswer)
	_, err := c.Charge(ctx, "k3", "INV-3", 100)
	assert.ErrorIs(t, err, ErrUnknownOutcome)
	assert.Len(t, s.Charges(), 1, "charged, answer lost")
	_, err = c.Lookup(ctx, "k3")
	require.NoError(t, err)

	// On a reused connection net/http itself resends a request carrying an
	// Idempotency-Key that got no answer; a fresh connection shows the drop.
	fresh := &Client{BaseURL: s.URL(), HTTP: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	s.Script("INV-4", DropBeforeAccept)
	_, err = fresh.Charge(ctx, "k4", "INV-4", 100)
	assert.ErrorIs(t, err, ErrUnknownOutcome, "the client cannot tell a drop before accept from a lost answer")
	_, err = c.Lookup(ctx, "k4")
	assert.ErrorIs(t, err, ErrNotFound)
	ch, err := c.Charge(ctx, "k4", "INV-4", 100)
	require.NoError(t, err)
	assert.Equal(t, "INV-4", ch.Invoice)
	assert.Zero(t, s.DoubleCharges())
}

func TestUnreachableIsNotSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	c := &Client{BaseURL: "http://" + addr}
	_, err = c.Charge(context.Background(), "k", "INV-5", 1)
	assert.True(t, errors.Is(err, ErrNotSent), err)
}
