package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/extworker/extworker/internal/digest"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/termsafe"
	"github.com/extworker/extworker/internal/testenv"
)

// inboxFixture is the command pointed at the test database, engine and broker, with a
// source and a queue of the test's own (declared with its retry and dead-letter queues,
// deleted at cleanup, like the source's inbox rows) and a process its messages start.
type inboxFixture struct {
	pool          *pgxpool.Pool
	engine        *admin.Client
	ch            *amqp.Channel
	source, queue string
	model         testenv.Model
}

func inboxEnv(t *testing.T) *inboxFixture {
	t.Helper()
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	t.Setenv("EXTWORKER_ENGINE_URL", testenv.EngineURL())
	t.Setenv("EXTWORKER_AMQP_URL", testenv.AMQPURL())
	t.Setenv("EXTWORKER_LOG_LEVEL", "warn")
	pool := testenv.DB(t) // skips (or fails in CI) without a database
	var out, errOut bytes.Buffer
	require.NoError(t, run([]string{"migrate"}, &out, &errOut), "migrate: %s %s", out.String(), errOut.String())
	f := &inboxFixture{pool: pool, engine: testenv.Engine(t), source: testenv.Unique("src"), queue: testenv.Unique("q")}
	conn := testenv.AMQP(t)
	ch, err := conn.Channel()
	require.NoError(t, err)
	f.ch = ch
	require.NoError(t, inbox.Declare(ch, inbox.Config{Source: f.source, Queue: f.queue}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if ch, err := conn.Channel(); err == nil { // a channel of its own: a failed test may have closed f.ch
			for _, q := range []string{f.queue, inbox.RetryQueue(f.queue), inbox.DeadLetterQueue(f.queue)} {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					t.Logf("cleanup: delete queue %s: %v", q, err)
				}
			}
			_ = ch.Close()
		}
		for _, table := range []string{"extworker_inbox", "extworker_inbox_conflicts", "extworker_inbox_starts"} {
			if _, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE source = $1`, f.source); err != nil {
				t.Logf("cleanup: delete source %s from %s: %v", f.source, table, err)
			}
		}
	})
	f.model = testenv.Deploy(t, f.engine, testenv.ModelOptions{NoMessageWait: true})
	return f
}

// testBody is what the fixture's Decide reads: start the process, or deliver its message.
type testBody struct {
	Do string `json:"do"` // "start" or "correlate"
	BK string `json:"bk"`
}

func (f *inboxFixture) decide(m inbox.Message) (inbox.Action, error) {
	var b testBody
	if err := json.Unmarshal(m.Body, &b); err != nil {
		return inbox.Action{}, fmt.Errorf("body is not JSON: %w", err)
	}
	switch b.Do {
	case "start":
		return inbox.Action{Start: &inbox.Start{ProcessKey: f.model.Key, BusinessKey: b.BK}}, nil
	case "correlate":
		return inbox.Action{Correlate: &inbox.Correlate{ProcessDefinitionKey: f.model.Key, MessageName: f.model.MessageName, BusinessKey: b.BK}}, nil
	}
	return inbox.Action{}, fmt.Errorf("unknown instruction %q", b.Do)
}

func jsonBody(do, bk string) []byte {
	b, _ := json.Marshal(testBody{Do: do, BK: bk})
	return b
}

// publish sends a message to the fixture's queue, as a producer would.
func (f *inboxFixture) publish(t *testing.T, id, typ string, body []byte) {
	t.Helper()
	require.NoError(t, f.ch.PublishWithContext(testenv.Context(t, 10*time.Second), "", f.queue, true, false, amqp.Publishing{
		MessageId: id, Type: typ, CorrelationId: "corr-" + id, DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: body}))
}

// consume runs a real consumer of the fixture's queue, against the real engine, until
// done says so; then stops it and waits for it to return.
func (f *inboxFixture) consume(t *testing.T, decide inbox.Decide, cfg inbox.Config, what string, done func() bool) {
	t.Helper()
	cfg.Source, cfg.Queue, cfg.Concurrency = f.source, f.queue, 1 // one at a time: in the order published
	c, err := inbox.NewConsumer(f.pool, f.engine, testenv.AMQPURL(), decide, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-stopped:
			assert.NoError(t, err)
		case <-time.After(time.Minute):
			t.Error("the consumer did not stop")
		}
	}()
	testenv.Eventually(t, time.Minute, what, func() (bool, error) { return done(), nil })
}

// depth is how many messages wait in a queue.
func (f *inboxFixture) depth(t *testing.T, queue string) int {
	t.Helper()
	q, err := f.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// row is the source's inbox row for id, read as the tables' owner.
func (f *inboxFixture) row(t *testing.T, id string) inbox.Record {
	t.Helper()
	rows, err := inbox.List(testenv.Context(t, 10*time.Second), f.pool, inbox.Filter{Source: f.source, MessageID: id})
	require.NoError(t, err)
	require.Len(t, rows, 1, "inbox row %s/%s", f.source, id)
	return rows[0]
}

// The parked messages seedParked leaves in the dead-letter queue, besides the conflicting
// copy of conflictID: each parked for one of the reasons operators see.
const (
	okID       = "ok-1"    // processed: started its instance
	conflictID = "c-1"     // processed, then came again with another body: that copy parked
	badID      = "bad-1"   // parked: the consumer could not read its body
	escID      = "bad-esc" // parked, unreadable, with escape sequences in its type and reason
	earlyID    = "early-1" // parked: no instance waited for it within the early window
)

// seedParked consumes messages with a real consumer until five copies are parked in the
// dead-letter queue: conflictID's second body, badID, escID, one without a message id,
// and earlyID. It returns the inbox id of the message without one.
func (f *inboxFixture) seedParked(t *testing.T) string {
	t.Helper()
	f.publish(t, okID, "order.placed", jsonBody("start", testenv.Unique("BK")))
	f.publish(t, conflictID, "order.placed", jsonBody("start", testenv.Unique("BK")))
	f.publish(t, conflictID, "order.placed", jsonBody("start", testenv.Unique("BK-other")))
	f.publish(t, badID, "order.placed", []byte("not json"))
	f.publish(t, escID, "evil\x1b]0;pwned\x07\x1b[2J", []byte("\x1b[31m{"))
	noID := []byte(`{"do":"start","bk":"no-id"}`)
	f.publish(t, "", "order.placed", noID)
	f.publish(t, earlyID, "invoice.paid", jsonBody("correlate", testenv.Unique("BK-nobody")))
	dlq := inbox.DeadLetterQueue(f.queue)
	f.consume(t, f.decide, inbox.Config{EarlyWindow: 300 * time.Millisecond, BackoffInitial: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond},
		"five messages parked in "+dlq, func() bool { return f.depth(t, dlq) == 5 })
	require.Equal(t, inbox.StateProcessed, f.row(t, okID).State)
	require.Equal(t, 1, f.row(t, conflictID).Conflicts)
	require.Equal(t, inbox.StateFailedFinal, f.row(t, earlyID).State)
	return "sha256:" + digest.Bytes(noID)
}

// inboxRun runs `extworker inbox args...` and returns its standard output.
func inboxRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(append([]string{"inbox"}, args...), &out, &errOut)
	return out.String(), err
}

func mustInbox(t *testing.T, args ...string) string {
	t.Helper()
	out, err := inboxRun(t, args...)
	require.NoError(t, err, "inbox %q; output:\n%s", args, out)
	return out
}

// inboxAs runs `extworker inbox args...` as one of the operator logins make up creates
// (members of extworker_operator, which has SELECT and UPDATE on the inbox).
func inboxAs(t *testing.T, login string, args ...string) (string, error) {
	t.Helper()
	testenv.DBAs(t, login) // fails in CI, skips elsewhere, without the login
	t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURLAs(login))
	defer t.Setenv("EXTWORKER_DATABASE_URL", testenv.DBURL())
	return inboxRun(t, args...)
}

func TestInboxUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"frobnicate"}} {
		_, err := inboxRun(t, args...)
		require.Error(t, err)
		for _, cmd := range []string{`list\s+\[--source S\] \[--parked\]`, `show\s+SOURCE MESSAGE_ID`, `replay\s+\(--queue Q \| --topic T\) \(--all \| MESSAGE_ID\.\.\.\)`, `reopen\s+SOURCE MESSAGE_ID\.\.\.`} {
			assert.Regexp(t, `(?m)^\s+`+cmd, err.Error())
		}
		assert.Contains(t, err.Error(), "states: received, processing, processed, failed_retryable, failed_final, ignored_duplicate, unknown")
	}
	_, err := inboxRun(t, "frobnicate")
	assert.ErrorContains(t, err, `unknown command "frobnicate"`)
	var out bytes.Buffer
	require.NoError(t, run(nil, &out, &bytes.Buffer{}))
	assert.Regexp(t, `(?m)^\s+inbox\s+list .*\| show SOURCE MESSAGE_ID \| replay --queue Q`, out.String())
}

func TestInboxList(t *testing.T) {
	f := inboxEnv(t)
	noID := f.seedParked(t)

	out := mustInbox(t, "list", "--source", f.source)
	assert.NotContains(t, out, "\x1b", "no escape sequence reaches the terminal")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 7, out)
	assert.Regexp(t, `^SOURCE\s+MESSAGE ID\s+TYPE\s+STATE\s+ACTION\s+BUSINESS KEY\s+DELIV/DUP/ATT\s+CONFLICTS\s+UPDATED\s+REASON$`, lines[0])
	line := func(id string) string {
		for _, l := range lines[1:] {
			if strings.Fields(l)[1] == cutCell(id, valueWidth) {
				return l
			}
		}
		t.Fatalf("no line for %s in:\n%s", id, out)
		return ""
	}
	assert.Regexp(t, `^`+f.source+`\s+ok-1\s+order\.placed\s+processed\s+start `+f.model.Key+`\s+BK-\w+\s+1/0/1\s+0\s+(just now|\d+s ago)\s+-$`, line(okID))
	assert.Regexp(t, `\sprocessed\s.*\s2/0/1\s+1\s`, line(conflictID), "two deliveries, one conflict")
	// The reason is cut to fit: the whole of it is in `inbox show`.
	assert.Regexp(t, `\sorder\.placed\s+failed_final\s+-\s+-\s+1/0/0\s+0\s+(just now|\d+s ago)\s+the consumer could not read the message: body is not JSON:…$`, line(badID))
	assert.Regexp(t, `\sfailed_final\s.*the message has no message id: it cannot be deduplicated, \S*…$`, line(noID))
	assert.Regexp(t, `\sinvoice\.paid\s+failed_final\s+correlate \S+\s+BK-nobody-\w+\s+\d+/0/\d+\s+0\s.*\searly for \S+, past the window of 300ms`, line(earlyID))
	assert.Regexp(t, `\sevil\\x1b\]0;pwned\\a\\x1b\[2J\s+failed_final\s`, line(escID), "the type as it is, its escapes shown")
	assert.Equal(t, strings.Index(line(badID), "failed_final"), strings.Index(line(escID), "failed_final"),
		"the columns stay aligned: escape sequences are escaped before the table is laid out")

	// --parked: parked, or with a conflicting copy parked.
	out = mustInbox(t, "list", "--source", f.source, "--parked")
	for _, id := range []string{conflictID, badID, escID, noID, earlyID} {
		assert.Contains(t, out, cutCell(id, valueWidth))
	}
	assert.Contains(t, out, noID[:39]+"…", "an id longer than the column is cut")
	assert.NotContains(t, out, okID)

	out = mustInbox(t, "list", "--source", f.source, "--state", "FAILED_FINAL") // the upper-case spelling of before
	assert.NotContains(t, out, okID)
	assert.NotContains(t, out, " "+conflictID+" ")
	assert.Contains(t, out, badID)
	out = mustInbox(t, "list", "--source", f.source, "--state", "processed", "--state", "Ignored_Duplicate") // any case, repeated
	assert.Contains(t, out, okID)
	assert.Contains(t, out, " "+conflictID+" ")
	assert.NotContains(t, out, badID)
	out = mustInbox(t, "list", "--source", f.source, "--state", "received,UNKNOWN_OUTCOME") // unknown, as it was spelled
	assert.Equal(t, "no inbox messages match\n", out)

	out = mustInbox(t, "list", "--source", f.source, "--limit", "2")
	assert.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 4, out)
	assert.Contains(t, out, "(first 2 shown; raise --limit or narrow the filter for more)")

	var got inboxListJSON
	require.NoError(t, json.Unmarshal([]byte(mustInbox(t, "list", "--source", f.source, "--parked", "--json")), &got))
	require.Len(t, got.Messages, 5)
	for _, m := range got.Messages {
		assert.Equal(t, f.source, m.Source)
		if m.MessageID == badID {
			assert.Equal(t, "failed_final", m.State)
			assert.Equal(t, digest.Bytes([]byte("not json")), m.BodyDigest)
			assert.Equal(t, "corr-"+badID, m.CorrelationID)
			assert.Contains(t, m.Reason, "body is not JSON: invalid character")
			assert.NotNil(t, m.ParkedAt)
		}
	}

	// An operator's login reads the inbox.
	out, err := inboxAs(t, testenv.AliceLogin, "list", "--source", f.source, "--parked")
	require.NoError(t, err, out)
	assert.Contains(t, out, badID)

	for _, bad := range [][]string{{"--state", "parked"}, {"--state", "PROCESSED,bogus"}, {"--state", "unknown-outcome"}} {
		_, err := inboxRun(t, append([]string{"list"}, bad...)...)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "valid states are received, processing, processed, failed_retryable, failed_final, ignored_duplicate, unknown")
	}
	_, err = inboxRun(t, "list", "--limit", "0")
	assert.ErrorContains(t, err, "--limit")
	_, err = inboxRun(t, "list", badID)
	assert.ErrorContains(t, err, "unexpected arguments")
}

func TestInboxShow(t *testing.T) {
	f := inboxEnv(t)
	f.seedParked(t)

	out := mustInbox(t, "show", f.source, badID)
	assert.Regexp(t, `(?m)^source\s+`+f.source+`$`, out)
	assert.Regexp(t, `(?m)^message id\s+bad-1$`, out)
	assert.Regexp(t, `(?m)^state\s+failed_final$`, out)
	assert.Regexp(t, `(?m)^reason\s+the consumer could not read the message: body is not JSON: invalid character 'o' in literal null \(expecting 'u'\)$`, out)
	assert.Regexp(t, `(?m)^body digest\s+`+digest.Bytes([]byte("not json"))+`$`, out)
	assert.Regexp(t, `(?m)^correlation id\s+corr-bad-1$`, out)
	assert.Regexp(t, `(?m)^deliveries\s+1$`, out)
	assert.Regexp(t, `(?m)^replays\s+0$`, out)
	assert.Regexp(t, `(?m)^parked\s+\d{4}-\d\d-\d\d `, out)
	assert.Regexp(t, `(?m)^queue\s+`+f.queue+`$`, out)
	assert.Contains(t, out, "extworker inbox replay --queue "+f.queue+" -- bad-1")

	out = mustInbox(t, "show", "--json", f.source, conflictID) // flags before or after
	var r inboxRecordJSON
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	assert.Equal(t, "processed", r.State)
	assert.Equal(t, 1, r.Conflicts)
	assert.Equal(t, 2, r.Deliveries)
	assert.Equal(t, "start "+f.model.Key, r.Action)
	assert.NotEmpty(t, r.ProcessInstanceID)
	assert.NotNil(t, r.ProcessedAt)
	assert.Nil(t, r.ParkedAt)

	out = mustInbox(t, "show", f.source, conflictID)
	assert.Regexp(t, `(?m)^conflicts\s+1$`, out)
	assert.Contains(t, out, "the producer must send them under a new message id")
	assert.NotContains(t, out, "inbox replay")

	out = mustInbox(t, "show", f.source, escID)
	assert.NotContains(t, out, "\x1b")
	assert.NotContains(t, out, "\x07")
	assert.Regexp(t, `(?m)^type\s+evil\\x1b\]0;pwned\\a\\x1b\[2J$`, out)

	_, err := inboxRun(t, "show", f.source, "nope")
	assert.ErrorContains(t, err, `no message "nope" from source "`+f.source+`" in the inbox`)
	for _, bad := range [][]string{{"show"}, {"show", f.source}, {"show", f.source, badID, "extra"}} {
		_, err := inboxRun(t, bad...)
		assert.ErrorContains(t, err, "SOURCE and MESSAGE_ID expected")
	}
}

// TestInboxShowPrintsAWorkingReplayCommand: `inbox show` of a parked message prints the
// replay command with the queue the row records, and that command works as printed; for
// a message a replay cannot help (one without a message id) it says why instead.
func TestInboxShowPrintsAWorkingReplayCommand(t *testing.T) {
	f := inboxEnv(t)
	noID := f.seedParked(t)

	out := mustInbox(t, "show", f.source, badID)
	assert.Regexp(t, `(?m)^queue\s+`+f.queue+`$`, out)
	cmd := "extworker inbox replay --queue " + f.queue + " -- " + badID
	require.Contains(t, out, "\n  "+cmd+"\n")
	replayed, err := inboxAs(t, testenv.AliceLogin, replayCommand(t, out)...)
	require.NoError(t, err, replayed)
	assert.Contains(t, replayed, "replayed 1 message(s)")
	assert.Equal(t, inbox.StateReceived, f.row(t, badID).State)

	out = mustInbox(t, "show", f.source, noID)
	assert.NotContains(t, out, "inbox replay --queue")
	assert.Contains(t, out, "no replay applies: the message came without a message id")
}

func TestReplayHint(t *testing.T) {
	parked := func(kind inbox.ParkKind, queue, id string) inbox.Record {
		return inbox.Record{State: inbox.StateFailedFinal, ParkKind: kind, Queue: queue, MessageID: id}
	}
	kafka := parked(inbox.ParkUnreadable, "payments", "evt-1")
	kafka.Source = inbox.KafkaSource("psp", "payments")
	callbackRow := parked(inbox.ParkUnreadable, inbox.CallbackChannel, "evt-2")
	callbackRow.Source = "psp"
	for _, tc := range []struct {
		r    inbox.Record
		want string
	}{
		{inbox.Record{State: inbox.StateProcessed, Queue: "q", MessageID: "m"}, ""},
		{parked(inbox.ParkEarly, "orders", "evt-1"), "parked: a copy waits in orders.dlq; once the reason is dealt with:\n  extworker inbox replay --queue orders -- evt-1"},
		{parked(inbox.ParkUnreadable, "orders", "it's \u202e"), `extworker inbox replay --queue orders -- 'it'\''s \u202e'`},
		{parked(inbox.ParkRefused, "orders", "a b"), `extworker inbox replay --queue orders -- 'a b'`},
		{parked(inbox.ParkRefused, "orders", "--all"), `extworker inbox replay --queue orders -- --all`},
		{parked(inbox.ParkRefused, "or\u202eders", `back\slash`), `extworker inbox replay --queue 'or\u202eders' -- 'back\\slash'`},
		{parked(inbox.ParkEarly, "", "evt-1"), "extworker inbox replay --queue QUEUE -- evt-1"},
		{parked(inbox.ParkNoID, "orders", "sha256:00"), "no replay applies: the message came without a message id"},
		{parked(inbox.ParkUnstorable, "orders", "hex:ff"), "no replay applies: the message's own id, type or correlation id"},
		{kafka, "parked: a copy waits in the Kafka topic payments.dlq; once the reason is dealt with:\n  extworker inbox replay --topic payments -- evt-1"},
		{callbackRow, "extworker inbox reopen -- psp evt-2"},
	} {
		got := replayHint(tc.r)
		if tc.want == "" {
			assert.Empty(t, got)
			continue
		}
		assert.Contains(t, got, tc.want)
	}
}

// TestShellQuote: what `inbox show` prints for a shell reads back, in bash, as the id;
// shellArg's, read by replay (termsafe.ParseValue), too.
func TestShellQuote(t *testing.T) {
	bash, err := exec.LookPath("bash")
	require.NoError(t, err, "bash")
	for _, id := range []string{"evt-1", "hex:6261642dff", "a b", "it's", `back\slash`, "bidi \u202e over", "esc \x1b[2J", "tab\tnl\n", "ü", "", "$(rm -rf /)", "`x`",
		"-rf", "--all", "zero\u200bwidth", "\xff"} {
		q := shellQuote(id)
		assert.True(t, printable(q), "%q quoted as %q", id, q)
		assert.NotContains(t, q, "\u202e")
		out, err := exec.Command(bash, "-c", "printf %s "+q).Output()
		require.NoError(t, err, "%q", q)
		assert.Equal(t, id, string(out), "%q quoted as %s", id, q)

		a := shellArg(id)
		assert.True(t, printable(a), "%q as an argument: %q", id, a)
		out, err = exec.Command(bash, "-c", "printf %s "+a).Output()
		require.NoError(t, err, "%q", a)
		back, err := termsafe.ParseValue(string(out))
		require.NoError(t, err)
		assert.Equal(t, id, back, "%q as an argument: %s", id, a)
	}
}

func TestCutEscaped(t *testing.T) {
	for _, tc := range []struct {
		v    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"eleven-char", 10, "eleven-ch…"},
		{"word and more", 10, "word and…"},
		{`abc\u202efdp.exe`, 9, "abc…"},
		{`abc\u202efdp.exe`, 10, `abc\u202e…`},
		{`abcd\u202efdp.exe`, 11, `abcd\u202e…`},
		{`a\\b\\c\\d\\e`, 6, `a\\b…`},
		{`\U000e0041xyz`, 12, `\U000e0041x…`},
		{"üüüüüüüüüüüü", 5, "üüüü…"},
	} {
		got := cutEscaped(tc.v, tc.n)
		assert.Equal(t, tc.want, got, "%q cut to %d", tc.v, tc.n)
		assert.LessOrEqual(t, utf8.RuneCountInString(got), tc.n)
		_, err := termsafe.ParseValue(strings.TrimSuffix(got, "…"))
		assert.NoError(t, err, "never inside an escape: %q", got)
	}
}

func TestCell(t *testing.T) {
	for v, want := range map[string]string{"": "-", "-": `\x2d`, "\u202e": `\u202e`, "a\tb": `a\tb`, "ok": "ok"} {
		assert.Equal(t, want, cell(v), "%q", v)
		if v != "" {
			back, err := termsafe.ParseValue(want)
			require.NoError(t, err)
			assert.Equal(t, v, back)
		}
	}
}

func TestSplitArgs(t *testing.T) {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.String("queue", "", "")
	fs.Bool("all", false, "")
	fs.Bool("json", false, "")
	for _, tc := range []struct{ args, flags, pos []string }{
		{[]string{"--queue", "q", "m1", "m2"}, []string{"--queue", "q"}, []string{"m1", "m2"}},
		{[]string{"m1", "--json", "--queue=q"}, []string{"--json", "--queue=q"}, []string{"m1"}},
		{[]string{"--queue", "q", "-rf", "--al"}, []string{"--queue", "q"}, []string{"-rf", "--al"}},
		{[]string{"--queue", "q", "--", "--all", "--json"}, []string{"--queue", "q"}, []string{"--all", "--json"}},
		{[]string{"--queue", "-q", "--all"}, []string{"--queue", "-q", "--all"}, nil},
		{[]string{"-all=false", "-h"}, []string{"-all=false", "-h"}, nil},
		{[]string{"-", "---all", "--queue"}, []string{"--queue"}, []string{"-", "---all"}},
	} {
		flags, pos := splitArgs(fs, tc.args)
		assert.Equal(t, tc.flags, flags, "%q", tc.args)
		assert.Equal(t, tc.pos, pos, "%q", tc.args)
	}
}

func TestInboxReplayArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "--all"}, "--queue Q or --topic T is required"},
		{[]string{"replay", "--queue", "q", "--topic", "t", "--all"}, "--queue or --topic, not both"},
		{[]string{"replay", "--queue", "q"}, "name the messages to replay (MESSAGE_ID...; extworker inbox list --parked lists them), or --all"},
		{[]string{"replay", "--queue", "q", "--all", "m1"}, "--all or MESSAGE_IDs, not both"},
		{[]string{"replay", "--queue", "q", ""}, "a MESSAGE_ID is empty"},
	} {
		_, err := inboxRun(t, tc.args...)
		assert.ErrorContains(t, err, tc.want, "%q", tc.args)
	}

	// Without the broker's URL: a configuration error (extworker exits 78), before
	// anything is opened.
	t.Setenv("EXTWORKER_AMQP_URL", "")
	_, err := inboxRun(t, "replay", "--queue", "q", "m1")
	var ce daemon.ConfigError
	require.ErrorAs(t, err, &ce)
	assert.ErrorContains(t, err, "EXTWORKER_AMQP_URL is not set")
	t.Setenv("EXTWORKER_KAFKA_BROKERS", "")
	_, err = inboxRun(t, "replay", "--topic", "t", "m1")
	require.ErrorAs(t, err, &ce)
	assert.ErrorContains(t, err, "EXTWORKER_KAFKA_BROKERS is not set")
}

// TestInboxReplay replays parked messages as an operator's login: named ones, then all;
// a conflicting copy stays parked, and a name not in the dead-letter queue fails.
func TestInboxReplay(t *testing.T) {
	f := inboxEnv(t)
	noID := f.seedParked(t)
	dlq := inbox.DeadLetterQueue(f.queue)

	out, err := inboxAs(t, testenv.AliceLogin, "replay", "--queue", f.queue, badID, conflictID)
	require.NoError(t, err, out)
	assert.Contains(t, out, fmt.Sprintf("replayed 1 message(s) from %s to %s", dlq, f.queue))
	assert.Contains(t, out, "\n  bad-1\n")
	assert.Contains(t, out, fmt.Sprintf("left 1 message(s) in %s: the inbox consumed their message id with another body", dlq))
	assert.Contains(t, out, "the producer must send them under a new message id:\n  c-1\n")
	assert.Contains(t, out, fmt.Sprintf("kept 3 other message(s) in %s (not selected, or, in a Kafka topic, no longer parked)", dlq))

	// The message left the dead-letter queue for the queue, without its parking headers.
	assert.Equal(t, 4, f.depth(t, dlq), "the conflicting copy and the three not named stay parked")
	assert.Equal(t, 1, f.depth(t, f.queue))
	d, ok, err := f.ch.Get(f.queue, false)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, badID, d.MessageId)
	assert.Equal(t, "not json", string(d.Body))
	assert.Equal(t, f.source, d.Headers[inbox.HeaderSource])
	assert.NotContains(t, d.Headers, inbox.HeaderReason)
	require.NoError(t, d.Nack(false, true)) // back for the consumer below

	r := f.row(t, badID)
	assert.Equal(t, inbox.StateReceived, r.State)
	assert.Equal(t, 1, r.Replays)
	assert.Equal(t, 0, r.Attempts)
	assert.Nil(t, r.ParkedAt)
	assert.Contains(t, r.Reason, "replayed by "+testenv.AliceLogin+" (was: the consumer could not read the message")
	c := f.row(t, conflictID)
	assert.Equal(t, inbox.StateProcessed, c.State, "the consumed message's row is untouched")
	assert.Equal(t, 0, c.Replays)

	// A name that is not (or no longer) in the dead-letter queue: exit non-zero, saying so.
	out, err = inboxAs(t, testenv.AliceLogin, "replay", "--queue", f.queue, "nope", badID)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf(`not in the dead-letter queue %s: "nope", "bad-1"`, dlq))
	assert.Contains(t, out, "replayed nothing from "+dlq)
	assert.Contains(t, out, "kept 4 other message(s)")
	assert.Equal(t, 4, f.depth(t, dlq))

	// --all: what can be replayed is; the conflicting copy, and the one without a message
	// id, stay.
	out, err = inboxAs(t, testenv.AliceLogin, "replay", "--queue", f.queue, "--all", "--json")
	require.NoError(t, err, out)
	var rep inboxReplayJSON
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Equal(t, f.queue, rep.Queue)
	assert.Equal(t, dlq, rep.DeadLetterQueue)
	assert.ElementsMatch(t, []string{escID, earlyID}, rep.Replayed)
	assert.Equal(t, []string{conflictID}, rep.Conflicts)
	assert.Equal(t, []string{""}, rep.Unreplayable, "the message without an id")
	assert.Zero(t, rep.Kept)
	assert.Empty(t, rep.NotFound)
	assert.Equal(t, 2, f.depth(t, dlq))
	assert.Equal(t, 3, f.depth(t, f.queue))
	for _, id := range []string{escID, earlyID} {
		r := f.row(t, id)
		assert.Equal(t, inbox.StateReceived, r.State, id)
		assert.Equal(t, 1, r.Replays, id)
	}
	assert.Equal(t, inbox.StateFailedFinal, f.row(t, noID).State)

	out = mustInbox(t, "replay", "--queue", f.queue, "--all")
	assert.Contains(t, out, "left 1 message(s) in "+dlq+": the inbox consumed their message id with another body")
	assert.Contains(t, out, "\n  c-1\n")
	assert.Contains(t, out, "left 1 message(s) in "+dlq+" that a replay cannot help")
	assert.Contains(t, out, "\n  (no message id: the producer must send it with one)\n")

	// The cause fixed (a consumer that now ignores them), the replayed messages are acted
	// on like new ones.
	f.consume(t, func(inbox.Message) (inbox.Action, error) { return inbox.Action{Ignore: "fixed"}, nil }, inbox.Config{},
		"the replayed messages processed", func() bool {
			for _, id := range []string{badID, escID, earlyID} {
				if f.row(t, id).State != inbox.StateProcessed {
					return false
				}
			}
			return true
		})
	assert.Equal(t, 0, f.depth(t, f.queue))
	assert.Equal(t, 2, f.depth(t, dlq))

	// No dead-letter queue by that name.
	_, err = inboxAs(t, testenv.AliceLogin, "replay", "--queue", testenv.Unique("no-such-queue"), "--all")
	assert.ErrorContains(t, err, "no dead-letter queue")
	assert.False(t, errors.As(err, new(daemon.ConfigError)))
}

// parkUnreadable publishes a message the fixture's Decide cannot read under each id, and
// consumes them until all are parked.
func (f *inboxFixture) parkUnreadable(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		f.publish(t, id, "order.placed", []byte("not json"))
	}
	dlq := inbox.DeadLetterQueue(f.queue)
	f.consume(t, f.decide, inbox.Config{}, fmt.Sprintf("%d messages parked in %s", len(ids), dlq),
		func() bool { return f.depth(t, dlq) == len(ids) })
}

// shellWords splits a command line as bash does.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	out, err := exec.Command("bash", "-c", `set -- `+line+`; printf '%s\0' "$@"`).Output()
	require.NoError(t, err, line)
	return strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
}

// replayCommand is the replay command `inbox show` printed, as bash splits it, from
// "replay" on.
func replayCommand(t *testing.T, show string) []string {
	t.Helper()
	for _, l := range strings.Split(show, "\n") {
		if strings.HasPrefix(l, "  extworker inbox replay ") {
			w := shellWords(t, strings.TrimSpace(l))
			require.Equal(t, []string{"extworker", "inbox", "replay"}, w[:3])
			return w[2:] // replay ...
		}
	}
	t.Fatalf("no replay command in:\n%s", show)
	return nil
}

// TestInboxIDsThatLookLikeFlags: ids that begin with "-" are shown as they are (after
// "--" or not), and the replay command `show` prints replays that one message, never
// every message of the queue.
func TestInboxIDsThatLookLikeFlags(t *testing.T) {
	f := inboxEnv(t)
	f.parkUnreadable(t, "--all", "-rf", "other-1")
	dlq := inbox.DeadLetterQueue(f.queue)

	out := mustInbox(t, "show", f.source, "-rf")
	assert.Regexp(t, `(?m)^message id\s+-rf$`, out)
	out = mustInbox(t, "show", f.source, "--", "-rf")
	assert.Regexp(t, `(?m)^message id\s+-rf$`, out)
	var r inboxRecordJSON
	require.NoError(t, json.Unmarshal([]byte(mustInbox(t, "show", "--json", f.source, "--", "--all")), &r))
	assert.Equal(t, "--all", r.MessageID)

	for i, id := range []string{"--all", "-rf"} {
		out := mustInbox(t, "show", f.source, "--", id)
		args := replayCommand(t, out)
		assert.Equal(t, []string{"--", id}, args[len(args)-2:], "the id after --")
		replayed, err := inboxAs(t, testenv.AliceLogin, args...)
		require.NoError(t, err, replayed)
		assert.Contains(t, replayed, "replayed 1 message(s)")
		assert.Equal(t, inbox.StateReceived, f.row(t, id).State, id)
		assert.Equal(t, 2-i, f.depth(t, dlq), "only %s left the dead-letter queue", id)
	}
	assert.Equal(t, inbox.StateFailedFinal, f.row(t, "other-1").State, "not replayed")

	_, err := inboxRun(t, "replay", "--queue", f.queue, "--", "--all")
	assert.ErrorContains(t, err, `not in the dead-letter queue`, "an id after --, not the flag")
	assert.Equal(t, 1, f.depth(t, dlq))
}

// TestInboxPrintsWhatIsStored: ids that differ only in characters a terminal hides or
// acts on print apart, as escapes, and what is printed finds the message again in show
// and replay.
func TestInboxPrintsWhatIsStored(t *testing.T) {
	f := inboxEnv(t)
	printed := map[string]string{
		"abc\u202efdp.exe": `abc\u202efdp.exe`,
		"abcfdp.exe":       "abcfdp.exe",
		"\u202e":           `\u202e`,
		"zero\u200bwidth":  `zero\u200bwidth`,
		"zerowidth":        "zerowidth",
		"esc\x1b[2J":       `esc\x1b[2J`,
		`back\slash`:       `back\\slash`,
		"tab\tin":          `tab\tin`,
	}
	var ids []string
	for id := range printed {
		ids = append(ids, id)
	}
	f.parkUnreadable(t, ids...)

	out := mustInbox(t, "list", "--source", f.source)
	for _, bad := range []string{"\u202e", "\u200b", "\x1b", "\t"} {
		assert.NotContains(t, out, bad)
	}
	cells := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		cells[strings.Fields(l)[1]] = true
	}
	for id, want := range printed {
		assert.True(t, cells[want], "list prints %q as %s:\n%s", id, want, out)
		show := mustInbox(t, "show", f.source, want)
		assert.Regexp(t, `(?m)^message id\s+`+regexp.QuoteMeta(want)+`$`, show)
		var r inboxRecordJSON
		require.NoError(t, json.Unmarshal([]byte(mustInbox(t, "show", "--json", f.source, want)), &r))
		assert.Equal(t, id, r.MessageID, "show %s finds the message it printed", want)
	}

	show := mustInbox(t, "show", f.source, `abc\u202efdp.exe`)
	replayed, err := inboxAs(t, testenv.AliceLogin, replayCommand(t, show)...)
	require.NoError(t, err, replayed)
	assert.Contains(t, replayed, "replayed 1 message(s)")
	assert.Contains(t, replayed, "\n  abc\\u202efdp.exe\n")
	assert.Equal(t, inbox.StateReceived, f.row(t, "abc\u202efdp.exe").State)
	assert.Equal(t, inbox.StateFailedFinal, f.row(t, "abcfdp.exe").State)
	replayed, err = inboxAs(t, testenv.AliceLogin, "replay", "--queue", f.queue, `zero\u200bwidth`)
	require.NoError(t, err, replayed)
	assert.Equal(t, inbox.StateReceived, f.row(t, "zero\u200bwidth").State)
	assert.Equal(t, inbox.StateFailedFinal, f.row(t, "zerowidth").State)
}

// TestInboxListCutsLongValues: a long business key or id is cut in list, like a reason,
// so that one message does not widen every line; show has all of it, and finds the
// message by the id list printed.
func TestInboxListCutsLongValues(t *testing.T) {
	f := inboxEnv(t)
	id, bk := "evt-"+strings.Repeat("i", 200), "BK-"+strings.Repeat("k", 252)
	f.publish(t, id, "order.placed", jsonBody("start", bk))
	f.publish(t, "short-1", "order.placed", []byte("not json"))
	f.consume(t, f.decide, inbox.Config{}, "both handled", func() bool {
		rows, err := inbox.List(context.Background(), f.pool, inbox.Filter{Source: f.source, States: []inbox.State{inbox.StateProcessed, inbox.StateFailedFinal}})
		return err == nil && len(rows) == 2
	})
	out := mustInbox(t, "list", "--source", f.source)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines {
		assert.Less(t, utf8.RuneCountInString(l), 300, "a line as wide as the business key:\n%s", out)
	}
	var cut string
	for _, l := range lines[1:] {
		if fs := strings.Fields(l); strings.HasPrefix(fs[1], "evt-") {
			cut = fs[1]
			assert.Regexp(t, `\sBK-k+…\s`, l)
		}
	}
	require.True(t, strings.HasSuffix(cut, "…"), "the id cut: %q", cut)
	show := mustInbox(t, "show", f.source, cut)
	assert.Regexp(t, `(?m)^message id\s+`+id+`$`, show)
	assert.Regexp(t, `(?m)^business key\s+`+bk+`$`, show)
	_, err := inboxRun(t, "show", f.source, "nope…")
	assert.ErrorContains(t, err, "no message")
}

// A value no inbox row can hold (bytes that are not UTF-8, a NUL) is a usage error that
// says how such ids are stored, before the database is asked: an outside tester's
// `inbox reopen SRC $'a\xffb'` got PostgreSQL's "invalid byte sequence" and exit 1.
func TestInboxRefusesValuesNoRowHolds(t *testing.T) {
	for _, args := range [][]string{
		{"reopen", "src", "a\xffb"},
		{"reopen", "src", `a\xffb`}, // as list would print it, read back
		{"reopen", "src", "pk7\x00"},
		{"reopen", "s\xff", "id"},
		{"show", "src", "a\xffb"},
		{"replay", "--queue", "q", "a\xffb"},
		// and the flags read the same way (a second outside tester's)
		{"list", "--source", "s\xff"},
		{"list", "--source", `s\x00`},
		{"replay", "--queue", "q\xff", "x"},
		{"replay", "--topic", `t\x00`, "--all"},
	} {
		_, err := inboxRun(t, args...)
		require.Error(t, err, "%q", args)
		assert.Equal(t, exitUsage, exitCode(err), "%q: %v", args, err)
		assert.Contains(t, err.Error(), "hex:", "%q", args)
		assert.NotContains(t, err.Error(), "\xff", "%q", args)
		assert.NotContains(t, err.Error(), "SQLSTATE", "%q", args)
	}
}
