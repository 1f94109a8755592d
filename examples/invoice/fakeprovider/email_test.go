package fakeprovider

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const canaryTo = "canary+pii@example.invalid"

// TestEmailsDeduped: with dedupe on, a key sends one email and replays it; the address
// is in the Email record and nowhere else (history, answers).
func TestEmailsDeduped(t *testing.T) {
	s, c := startTCP(t, Options{})
	ctx := t.Context()
	a, err := c.Email(ctx, "e1", "INV-1", canaryTo, "receipt")
	require.NoError(t, err)
	b, err := c.Email(ctx, "e1", "INV-1", canaryTo, "receipt")
	require.NoError(t, err)
	assert.Equal(t, a, b)
	assert.Equal(t, canaryTo, a.To)
	require.Len(t, s.Emails(), 1)
	assert.Equal(t, Email{ID: a.ID, Key: "e1", Invoice: "INV-1", To: canaryTo, Template: "receipt", Digest: a.Digest, At: a.At}, s.Emails()[0])

	_, err = c.Email(ctx, "e1", "INV-1", "other@example.invalid", "receipt")
	assert.ErrorIs(t, err, ErrKeyMismatch, "the address is part of the digest")
	_, err = c.Email(ctx, "", "INV-1", canaryTo, "receipt")
	require.NoError(t, err, "no key: no dedupe")
	assert.Len(t, s.Emails(), 2)

	ans := send(t, c, http.MethodPost, "/v1/emails", "e1", `{"to":"`+canaryTo+`","template":"receipt","invoice":"INV-1"}`)
	assert.Equal(t, http.StatusOK, ans.status)
	assert.Equal(t, "true", ans.header.Get("Idempotent-Replayed"))
	assert.NotContains(t, ans.body, canaryTo)
	var hist bytes.Buffer
	require.NoError(t, s.WriteHistory(&hist))
	assert.NotContains(t, hist.String(), canaryTo)
	assert.NotContains(t, hist.String(), "other@example.invalid")

	// Faults apply to emails too; the invoice rule matches the email's invoice.
	s.Script("INV-2", Unavailable)
	_, err = c.Email(ctx, "e2", "INV-2", canaryTo, "receipt")
	assert.ErrorIs(t, err, ErrUnknownOutcome)
	assert.Len(t, s.Emails(), 2)
	assert.Len(t, s.Charges(), 0)
}

// TestEmailsDedupeOff (row N1): a non-idempotent channel sends again under the same key.
func TestEmailsDedupeOff(t *testing.T) {
	s, c := startTCP(t, Options{EmailDedupeOff: true})
	ctx := t.Context()
	s.ScriptKey("e1", LoseAnswer)
	_, err := c.Email(ctx, "e1", "INV-1", canaryTo, "receipt")
	assert.ErrorIs(t, err, ErrUnknownOutcome)
	_, err = c.Email(ctx, "e1", "INV-1", canaryTo, "receipt")
	require.NoError(t, err)
	require.Len(t, s.Emails(), 2, "the retry sent a second email")
	assert.NotEqual(t, s.Emails()[0].ID, s.Emails()[1].ID)
	assert.Equal(t, "e1", s.Emails()[1].Key)
	for _, r := range s.Log() {
		assert.Equal(t, outCreated, r.Outcome)
	}
	_, err = c.Charge(ctx, "e1", "INV-1", 100)
	require.NoError(t, err, "the key store never saw the emails' key")
}
