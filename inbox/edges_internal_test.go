package inbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"

	"github.com/extworker/extworker/camunda7"
)

func TestStoredID(t *testing.T) {
	long := strings.Repeat("x", 1025)
	for _, tc := range []struct{ id, want string }{
		{"evt-1", "evt-1"},
		{"invoice.paid:INV-7", "invoice.paid:INV-7"},
		{"sha256:abc", "hex:7368613235363a616263"}, // never stored under the id of a message without one
		{"bad-\xff", "hex:6261642dff"},
		{"a\x00b", "hex:610062"},
		{"hex:41", "hex:6865783a3431"}, // never stored under another's escaped form
		{"\u202eevil", "\u202eevil"},   // text; `inbox show` and the logs escape it
		{strings.Repeat("y", 1024), strings.Repeat("y", 1024)},
		{long, "hex:sha256:" + digest.Bytes([]byte(long))},
	} {
		assert.Equal(t, tc.want, StoredID(tc.id), "%q", tc.id)
	}
}

func TestCleanTextAndTruncate(t *testing.T) {
	assert.Equal(t, "ok ü", cleanText("ok ü"))
	assert.Equal(t, `a\xffb\x00c`, cleanText("a\xffb\x00c"))
	assert.Equal(t, "\ufffd", cleanText("\ufffd"), "U+FFFD itself is text")
	assert.Equal(t, "ab…", truncate("abc", 2))
	assert.Equal(t, "a…", truncate("aü", 2), "never inside a character")
	assert.True(t, storable(truncate(strings.Repeat("ü", 1500), 2000)))
	assert.Equal(t, `"id-\u202e\x00"`, logID("id-\u202e\x00"))
}

func TestRecordOf(t *testing.T) {
	for _, tc := range []struct {
		m    Message
		kind ParkKind
		bad  string
	}{
		{Message{ID: "ok", Type: "t", CorrelationID: "c"}, "", ""},
		{Message{}, ParkNoID, ""},
		{Message{ID: "\xff"}, ParkUnstorable, "message id"},
		{Message{ID: "ok", Type: "\x00"}, ParkUnstorable, "type"},
		{Message{ID: "ok", CorrelationID: "\xc3"}, ParkUnstorable, "correlation id"},
		{Message{ID: "\xff", Type: "\x00", CorrelationID: "\xc3"}, ParkUnstorable, "message id, type, correlation id"},
	} {
		f := recordOf(tc.m, "d")
		kind, reason := f.parkReason()
		assert.Equal(t, tc.kind, kind, "%q", tc.m)
		assert.Contains(t, reason, tc.bad)
		for _, s := range []string{f.id, f.typ, f.corr} {
			assert.True(t, storable(s), "%q", s)
		}
		for _, s := range []string{f.ascii().id, f.ascii().typ, f.ascii().corr} {
			assert.NotContains(t, s, "\x00")
		}
	}
	assert.Equal(t, "sha256:d", recordOf(Message{}, "d").id)
	assert.Equal(t, recorded{id: "hex:c3bc", typ: "hex:74c3bc", corr: "c", digest: "d"},
		recorded{id: "ü", typ: "tü", corr: "c", digest: "d"}.ascii())
}

func TestCheckAction(t *testing.T) {
	start := func(pk, bk string) Action { return Action{Start: &Start{ProcessKey: pk, BusinessKey: bk}} }
	corr := func(def, name, bk string) Action {
		return Action{Correlate: &Correlate{ProcessDefinitionKey: def, MessageName: name, BusinessKey: bk}}
	}
	for _, tc := range []struct {
		a      Action
		reason string // "" when it can be carried out
	}{
		{start("p", "bk"), ""},
		{corr("p", "m", "bk"), ""},
		{Action{Ignore: "not ours"}, ""},
		{Action{}, "no single action"},
		{Action{Start: &Start{ProcessKey: "p", BusinessKey: "bk"}, Ignore: "x"}, "no single action"},
		{start("", "bk"), "Start needs a process key and a business key"},
		{corr("p", "", "bk"), "Correlate needs a message name and a business key"},
		{corr("", "m", "bk"), "Correlate needs a ProcessDefinitionKey"},
		{start("p", "A\x00B"), "the business key cannot be stored as text"},
		{corr("p", "m", "\xff"), "the business key cannot be stored as text"},
		{start("p", strings.Repeat("k", 255)), ""},
		{start("p", strings.Repeat("ü", 255)), ""},
		{start("p", strings.Repeat("k", 256)), "the business key is 256 characters long: the engine stores at most 255"},
		{start("p\x00", "bk"), "the process definition key"},
		{corr("p", "m\xff", "bk"), "the message name"},
	} {
		kind, reason := checkAction(tc.a)
		if tc.reason == "" {
			assert.Empty(t, reason)
			continue
		}
		assert.Contains(t, reason, tc.reason)
		assert.Equal(t, ParkInvalidAction, kind)
	}
}

func TestJudgeEngineError(t *testing.T) {
	e := func(status int) error { return &camunda7.Error{StatusCode: status, Message: "x"} }
	notSent := &camunda7.TransportError{Op: "x", Sent: false, Err: errors.New("refused")}
	lost := &camunda7.TransportError{Op: "x", Sent: true, Err: errors.New("timeout")}
	for _, tc := range []struct {
		err      error
		failures int
		want     engineVerdict
		unknown  bool
	}{
		{notSent, 0, retryLater, false},
		{lost, 0, retryLater, true},
		{&camunda7.ResponseError{StatusCode: 429, Err: errors.New("throttled")}, 0, retryLater, false},
		{e(500), 0, engineFailed, true},
		{e(500), 3, engineFailed, true},
		{e(500), 4, parkFailing, true},
		{e(503), 9, parkFailing, true},
		{e(400), 0, parkRefused, false},
		{e(404), 0, parkRefused, false},
		{&camunda7.ResponseError{StatusCode: 502, Err: errors.New("html")}, 0, retryLater, true},
	} {
		assert.Equal(t, tc.want, judgeEngineError(tc.err, tc.failures, 5), "%v after %d", tc.err, tc.failures)
		assert.Equal(t, tc.unknown, outcomeUnknown(tc.err), "%v", tc.err)
	}
	assert.False(t, outcomeUnknown(nil))
}

func TestClaimWait(t *testing.T) {
	w := time.Minute
	for _, tc := range []struct {
		c    claim
		want time.Duration
	}{
		{claim{}, 0},
		{claim{held: true, pending: true, since: 10 * time.Second}, 50 * time.Second},
		{claim{held: true, pending: true, mine: true, since: 10 * time.Second}, 0},
		{claim{held: true, pending: false, since: 10 * time.Second}, 0},
		{claim{held: true, pending: true, since: 2 * time.Minute}, 0},
	} {
		assert.Equal(t, tc.want, claimWait(tc.c, w), "%+v", tc.c)
	}
	assert.False(t, earlyExpired(-time.Hour, time.Minute))
	assert.True(t, earlyExpired(2*time.Minute, time.Minute))
	assert.True(t, startedByThis(false, "s/m", "s/m"))
	assert.True(t, startedByThis(true, "", "s/m"))
	assert.False(t, startedByThis(false, "", "s/m"))
	assert.False(t, startedByThis(true, "s/other", "s/m"))
}

func TestDataException(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code string
		ok   bool
	}{
		{&pgconn.PgError{Code: "22021"}, "22021", true},
		{fmt.Errorf("inbox: record: %w", &pgconn.PgError{Code: "22P05"}), "22P05", true},
		{&pgconn.PgError{Code: "54000"}, "54000", true},
		{&pgconn.PgError{Code: "08006"}, "", false},
		{&pgconn.PgError{Code: "40001"}, "", false},
		{errors.New("connection refused"), "", false},
		{nil, "", false},
	} {
		code, ok := dataException(tc.err)
		assert.Equal(t, tc.ok, ok, "%v", tc.err)
		assert.Equal(t, tc.code, code)
	}
}

func TestMessageOf(t *testing.T) {
	for _, tc := range []struct {
		d     amqp.Delivery
		fresh bool
	}{
		{amqp.Delivery{MessageId: "m"}, true},
		{amqp.Delivery{MessageId: "m", Redelivered: true}, false},
		{amqp.Delivery{MessageId: "m", Headers: amqp.Table{HeaderAttempt: int32(1)}}, false},
		{amqp.Delivery{MessageId: "m", Headers: amqp.Table{HeaderAttempt: int64(-3)}}, true},
		{amqp.Delivery{MessageId: "m", Headers: amqp.Table{HeaderAttempt: "1"}}, true},
	} {
		m := messageOf(tc.d)
		assert.True(t, m.chained)
		assert.Equal(t, tc.fresh, m.fresh, "%+v", tc.d.Headers)
	}
	assert.Equal(t, int32(1<<30), attempt(amqp.Delivery{Headers: amqp.Table{HeaderAttempt: int32(1<<31 - 1)}}))
}

func TestInFlightWindow(t *testing.T) {
	for _, tc := range []struct {
		configured, timeout, want time.Duration
		refused                   bool
	}{
		{0, 30 * time.Second, time.Minute, false},
		{0, 45 * time.Second, 90 * time.Second, false},
		{0, 10 * time.Minute, 20 * time.Minute, false},
		{31 * time.Second, 30 * time.Second, 31 * time.Second, false},
		{30 * time.Second, 30 * time.Second, 0, true},
		{time.Millisecond, 30 * time.Second, 0, true},
		{time.Minute, 2 * time.Minute, 0, true},
	} {
		got, err := inFlightWindow(tc.configured, tc.timeout)
		if tc.refused {
			assert.ErrorContains(t, err, fmt.Sprintf("InFlightWindow %v must exceed the engine client's timeout %v", tc.configured, tc.timeout))
			continue
		}
		assert.NoError(t, err)
		assert.Equal(t, tc.want, got, "%v with a client timeout of %v", tc.configured, tc.timeout)
	}
}
