package fakeprovider

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAdmin: a process outside the test scripts faults, moves the clock and reads the
// effects and the history over HTTP, and sees what the Go API sees.
func TestAdmin(t *testing.T) {
	s, c := startTCP(t, Options{})
	ctx := t.Context()
	post := func(path, body string) raw {
		t.Helper()
		return send(t, c, http.MethodPost, path, "", body)
	}

	assert.Equal(t, http.StatusNoContent, post("/_admin/script", `{"invoice":"INV-1","faults":["decline"]}`).status)
	assert.Equal(t, http.StatusNoContent, post("/_admin/script", `{"key":"k2","faults":["stored_500","unavailable"]}`).status)
	assert.Equal(t, http.StatusNoContent, post("/_admin/script", `{"nth":4,"faults":["rate_limited"]}`).status)
	assert.Equal(t, http.StatusNoContent, post("/_admin/script", `{"probability":1,"faults":["drop_before_accept"]}`).status)
	for _, bad := range []string{
		`{"faults":["decline"]}`,
		`{"invoice":"I","key":"k","faults":["decline"]}`,
		`{"invoice":"I","faults":["explode"]}`,
		`{"nth":2,"faults":["decline","hold"]}`,
		`{"probability":2,"faults":["decline"]}`,
		`{"invoice":"I"}`,
		`{"clear":true,"invoice":"I"}`,
	} {
		assert.Equal(t, http.StatusBadRequest, post("/_admin/script", bad).status, bad)
	}

	_, err := c.Charge(ctx, "k1", "INV-1", 500)
	var d *DeclineError
	assert.ErrorAs(t, err, &d)
	_, err = c.Charge(ctx, "k2", "INV-2", 500)
	assert.ErrorIs(t, err, ErrUnknownOutcome)
	_, err = c.Charge(ctx, "k2", "INV-2", 500)
	assert.ErrorIs(t, err, ErrUnknownOutcome, "the stored 500 replays; the key's second fault waits")
	_, err = c.Charge(ctx, "k4", "INV-4", 500)
	assert.ErrorIs(t, err, ErrNotSent, "fourth charge request: 429")
	_, err = c.Charge(ctx, "k5", "INV-5", 500)
	assert.ErrorIs(t, err, ErrUnknownOutcome, "random: dropped")
	assert.Equal(t, http.StatusNoContent, post("/_admin/script", `{"clear":true}`).status)
	ch, err := c.Charge(ctx, "k5", "INV-5", 500)
	require.NoError(t, err)
	assert.Equal(t, []string{"decline", "stored_500", "unavailable", "rate_limited", "drop_before_accept", ""}, faultsOf(s))

	before := s.Now()
	a := post("/_admin/clock?advance=25h", "")
	require.Equal(t, http.StatusOK, a.status)
	var clock struct{ Now time.Time }
	require.NoError(t, json.Unmarshal([]byte(a.body), &clock))
	assert.WithinDuration(t, before.Add(25*time.Hour), clock.Now, time.Minute)
	assert.Equal(t, http.StatusBadRequest, post("/_admin/clock?advance=soon", "").status)
	_, err = c.Lookup(ctx, "k5")
	assert.ErrorIs(t, err, ErrNotFound, "the clock moved past the retention")

	a = send(t, c, http.MethodGet, "/_admin/effects", "", "")
	require.Equal(t, http.StatusOK, a.status)
	var effects struct {
		Charges []Charge
		Emails  []Email
	}
	require.NoError(t, json.Unmarshal([]byte(a.body), &effects))
	assert.Equal(t, []Charge{ch}, effects.Charges)
	assert.Equal(t, []Email{}, effects.Emails)

	a = send(t, c, http.MethodGet, "/_admin/log", "", "")
	require.Equal(t, http.StatusOK, a.status)
	var lines []Request
	sc := bufio.NewScanner(strings.NewReader(a.body))
	for sc.Scan() {
		var r Request
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r))
		lines = append(lines, r)
	}
	assert.Equal(t, s.Log(), lines, "admin requests are not part of the history")
}
