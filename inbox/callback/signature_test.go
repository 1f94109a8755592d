package callback_test

import (
	"crypto/rand"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/inbox/callback"
)

// newSecret returns a fresh secret as a provider writes it, and parsed.
func newSecret(t testing.TB) (string, callback.Secret) {
	t.Helper()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	text := "whsec_" + base64.StdEncoding.EncodeToString(key)
	s, err := callback.ParseSecret(text)
	require.NoError(t, err)
	return text, s
}

// TestVerify: each way a signature header can be, and what Verify says of it.
func TestVerify(t *testing.T) {
	_, oldKey := newSecret(t)
	_, newKey := newSecret(t)
	_, stranger := newSecret(t)
	now := time.Unix(1_750_000_000, 0)
	body := []byte(`{"type":"invoice.paid","data":{"invoice":"INV-1"}}`)
	ts := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	signed := func(s callback.Secret, stamp string) callback.Headers {
		return callback.Headers{ID: "msg_1", Timestamp: stamp, Signature: callback.Sign(s, "msg_1", stamp, body)}
	}
	tamper := func(h callback.Headers, f func(*callback.Headers)) callback.Headers { f(&h); return h }
	secrets := []callback.Secret{oldKey, newKey}

	for _, tc := range []struct {
		name string
		h    callback.Headers
		body []byte
		want error
	}{
		{"signed with the new secret", signed(newKey, ts(0)), body, nil},
		{"signed with the old secret, still listed", signed(oldKey, ts(0)), body, nil},
		{"both signatures, as a sender mid-rotation sends", tamper(signed(oldKey, ts(0)), func(h *callback.Headers) {
			h.Signature += " " + callback.Sign(newKey, h.ID, h.Timestamp, body)
		}), body, nil},
		{"an unknown version before a good one", tamper(signed(newKey, ts(0)), func(h *callback.Headers) {
			h.Signature = "v1a,AAAA " + h.Signature
		}), body, nil},
		{"at the edge of the window, past", signed(newKey, ts(-5*time.Minute)), body, nil},
		{"at the edge of the window, ahead", signed(newKey, ts(5*time.Minute)), body, nil},
		{"a secret the source does not have", signed(stranger, ts(0)), body, callback.ErrNoMatch},
		{"another body", signed(newKey, ts(0)), append([]byte(nil), body[:len(body)-1]...), callback.ErrNoMatch},
		{"another id", tamper(signed(newKey, ts(0)), func(h *callback.Headers) { h.ID = "msg_2" }), body, callback.ErrNoMatch},
		{"another timestamp, still fresh", tamper(signed(newKey, ts(0)), func(h *callback.Headers) { h.Timestamp = ts(time.Second) }), body, callback.ErrNoMatch},
		{"stale: a replay six minutes later", signed(newKey, ts(-6*time.Minute)), body, callback.ErrStale},
		{"ahead by six minutes", signed(newKey, ts(6*time.Minute)), body, callback.ErrStale},
		{"timestamp in milliseconds", signed(newKey, strconv.FormatInt(now.UnixMilli(), 10)), body, callback.ErrStale},
		{"timestamp not a number", signed(newKey, "yesterday"), body, callback.ErrMalformed},
		{"no id", tamper(signed(newKey, ts(0)), func(h *callback.Headers) { h.ID = "" }), body, callback.ErrMissingHeaders},
		{"no timestamp", tamper(signed(newKey, ts(0)), func(h *callback.Headers) { h.Timestamp = "" }), body, callback.ErrMissingHeaders},
		{"no signature", tamper(signed(newKey, ts(0)), func(h *callback.Headers) { h.Signature = "" }), body, callback.ErrMissingHeaders},
		{"the version left out", tamper(signed(newKey, ts(0)), func(h *callback.Headers) {
			h.Signature = strings.TrimPrefix(h.Signature, "v1,")
		}), body, callback.ErrNoMatch},
		{"not base64", tamper(signed(newKey, ts(0)), func(h *callback.Headers) { h.Signature = "v1,!!!" }), body, callback.ErrNoMatch},
		{"the right MAC truncated", tamper(signed(newKey, ts(0)), func(h *callback.Headers) { h.Signature = h.Signature[:20] }), body, callback.ErrNoMatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, callback.Verify(secrets, tc.h, tc.body, now, callback.DefaultTolerance))
		})
	}
}

// TestSignKnownAnswer pins Sign to the scheme's own test vector
// (standard-webhooks/libraries, the reference implementations' tests).
func TestSignKnownAnswer(t *testing.T) {
	s, err := callback.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	require.NoError(t, err)
	got := callback.Sign(s, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", []byte(`{"test": 2432232314}`))
	assert.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", got)
}

func TestParseSecret(t *testing.T) {
	text, _ := newSecret(t)
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"whsec_ and base64", text, true},
		{"without the prefix", strings.TrimPrefix(text, "whsec_"), true},
		{"not base64", "whsec_not base64!", false},
		{"a short key", "whsec_" + base64.StdEncoding.EncodeToString([]byte("short")), false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := callback.ParseSecret(tc.in)
			assert.Equal(t, tc.ok, err == nil, "%v", err)
			if tc.ok {
				assert.NotContains(t, s.String(), strings.TrimPrefix(text, "whsec_"), "String hides the key")
			}
		})
	}
}
