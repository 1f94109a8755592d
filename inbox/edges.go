package inbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/extworker/extworker/camunda7"
)

// The inbox's edges, as pure functions of values: what PostgreSQL can store of a
// message, what a Decide may ask, what an engine's error makes of a message.

// MaxBusinessKey is the longest business key, in characters, the engine stores (its
// BUSINESS_KEY_ column is a varchar(255)): a message with a longer one is parked at once.
const MaxBusinessKey = 255

// maxStoredID is the longest message id, in bytes, the inbox keeps as it is; maxHexed the
// longest it keeps in hex (longer ones by their digest).
const (
	maxStoredID = 1024
	maxHexed    = 512
)

// ParkKind says, in a word, why a message was parked (the row's park_kind): the log
// names it, and `extworker inbox show` tells by it whether a replay can help.
type ParkKind string

// The kinds of parked messages.
const (
	// ParkNoID: the message came without a message id. No replay: the producer must send
	// it with one.
	ParkNoID ParkKind = "no-id"
	// ParkUnstorable: the message's own id, type or correlation id is not text PostgreSQL
	// can store (invalid UTF-8, NUL bytes); it is recorded escaped. No replay: the
	// producer must send it anew.
	ParkUnstorable ParkKind = "unstorable"
	// ParkConflict: a copy whose id the inbox consumed with another body. Only the log
	// names it: the row keeps the state of the message consumed first.
	ParkConflict ParkKind = "conflict"
	// ParkUnreadable: the consumer's Decide returned an error.
	ParkUnreadable ParkKind = "unreadable"
	// ParkInvalidAction: Decide's action cannot be carried out: not one action, a key
	// missing, or a business key the engine cannot store (not text, too long).
	ParkInvalidAction ParkKind = "invalid-action"
	// ParkEarly: no process instance waited for it within Config.EarlyWindow.
	ParkEarly ParkKind = "early"
	// ParkRefused: the engine refused it (a 4xx answer).
	ParkRefused ParkKind = "refused"
	// ParkEngineFailing: the engine failed on it (5xx) Config.MaxEngineFailures times.
	ParkEngineFailing ParkKind = "engine-failing"
)

// storable reports whether PostgreSQL can store s as text: valid UTF-8, without NUL.
func storable(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// escaped is the stored form of s when it cannot be stored as it is: "hex:" and its
// bytes in hex, or for more than maxHexed bytes "hex:sha256:" and the hex SHA-256 of them.
func escaped(s string) string {
	if len(s) > maxHexed {
		sum := sha256.Sum256([]byte(s))
		return "hex:sha256:" + hex.EncodeToString(sum[:])
	}
	return "hex:" + hex.EncodeToString([]byte(s))
}

// StoredID is the message id an inbox row is keyed by, and the one `extworker inbox`
// shows and replays by: the id itself, or its escaped form ("hex:" and its bytes in hex;
// "hex:sha256:" and their digest past 512 bytes) when PostgreSQL cannot store it (invalid
// UTF-8, NUL bytes), when it is longer than 1024 bytes, or when it begins with "hex:" or
// "sha256:" (reservedID: so that no id is recorded under another's escaped form, or under
// the id of a message without one). A message without an id is recorded under "sha256:"
// and its body's digest.
func StoredID(id string) string {
	if storable(id) && len(id) <= maxStoredID && !reservedID(id) {
		return id
	}
	return escaped(id)
}

// reservedID reports whether id begins as the inbox's own ids do: "hex:" (an escaped id)
// or "sha256:" (the id of a message without one).
func reservedID(id string) bool {
	return strings.HasPrefix(id, "hex:") || strings.HasPrefix(id, "sha256:")
}

// storedText is a field's stored form: s itself when ok, else escaped(s).
func storedText(s string) (stored string, ok bool) {
	if storable(s) {
		return s, true
	}
	return escaped(s), false
}

// cleanText makes free text (a reason, an action) storable: each byte that is not part of
// valid UTF-8, and each NUL, is written as \xHH.
func cleanText(s string) string {
	if storable(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || r == 0 {
			fmt.Fprintf(&b, `\x%02x`, s[i])
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// truncate cuts s to at most n bytes, on a character's boundary, ending in "…" when cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// logID is a stored message id as a log shows it: quoted, with whatever a terminal would
// act on (control characters, bidirectional overrides) escaped.
func logID(id string) string { return strconv.QuoteToASCII(id) }

// recorded is what the inbox stores of a message's own fields, and which of them could
// not be stored as they came.
type recorded struct {
	id, typ, corr string
	digest        string   // the body's
	bad           []string // the fields stored escaped
	noID          bool
}

func recordOf(m Message, digest string) recorded {
	f := recorded{id: StoredID(m.ID), digest: digest, noID: m.ID == ""}
	if f.noID {
		f.id = "sha256:" + digest
	}
	if !storable(m.ID) {
		f.bad = append(f.bad, "message id")
	}
	var ok bool
	if f.typ, ok = storedText(m.Type); !ok {
		f.bad = append(f.bad, "type")
	}
	if f.corr, ok = storedText(m.CorrelationID); !ok {
		f.bad = append(f.bad, "correlation id")
	}
	return f
}

// parkReason says why the message is parked before it is decided on: no id, or fields
// PostgreSQL cannot store; "" when neither.
func (f recorded) parkReason() (ParkKind, string) {
	switch {
	case f.noID:
		return ParkNoID, "the message has no message id: it cannot be deduplicated, so it is not acted on"
	case len(f.bad) > 0:
		return ParkUnstorable, fmt.Sprintf("the message's %s cannot be stored as text (invalid UTF-8 or NUL bytes): recorded escaped "+
			"(hex: and its bytes in hex); not acted on, and a replay cannot help: the producer must send it anew", strings.Join(f.bad, ", "))
	}
	return "", ""
}

// ascii is f with every field that is not plain ASCII escaped: what any database
// encoding stores, for a database that refused f.
func (f recorded) ascii() recorded {
	for _, p := range []*string{&f.id, &f.typ, &f.corr} {
		for i := 0; i < len(*p); i++ {
			if (*p)[i] >= utf8.RuneSelf || (*p)[i] == 0 {
				*p = escaped(*p)
				break
			}
		}
	}
	return f
}

// checkAction says why a message with Decide's action a is parked before the engine is
// asked; "" when a can be carried out.
func checkAction(a Action) (ParkKind, string) {
	n := 0
	for _, set := range []bool{a.Start != nil, a.Correlate != nil, a.Ignore != ""} {
		if set {
			n++
		}
	}
	switch {
	case n != 1:
		return ParkInvalidAction, "the consumer's Decide returned no single action (one of Start, Correlate, Ignore)"
	case a.Start != nil && (a.Start.ProcessKey == "" || a.Start.BusinessKey == ""):
		return ParkInvalidAction, "Start needs a process key and a business key"
	case a.Start != nil:
		return checkKeys(a.Start.ProcessKey, a.Start.BusinessKey, "")
	case a.Correlate != nil && (a.Correlate.MessageName == "" || a.Correlate.BusinessKey == ""):
		return ParkInvalidAction, "Correlate needs a message name and a business key"
	case a.Correlate != nil && a.Correlate.ProcessDefinitionKey == "":
		return ParkInvalidAction, "Correlate needs a ProcessDefinitionKey: the process definition whose instance waits for the message " +
			"(the engine is asked about that definition's instances only)"
	case a.Correlate != nil:
		return checkKeys(a.Correlate.ProcessDefinitionKey, a.Correlate.BusinessKey, a.Correlate.MessageName)
	}
	return "", ""
}

// checkKeys parks keys that neither the inbox nor the engine can store.
func checkKeys(processKey, businessKey, messageName string) (ParkKind, string) {
	switch {
	case !storable(businessKey):
		return ParkInvalidAction, "the business key cannot be stored as text (invalid UTF-8 or NUL bytes; recorded as " +
			truncate(escaped(businessKey), 80) + "): neither the inbox nor the engine can keep it"
	case utf8.RuneCountInString(businessKey) > MaxBusinessKey:
		return ParkInvalidAction, fmt.Sprintf("the business key is %d characters long: the engine stores at most %d",
			utf8.RuneCountInString(businessKey), MaxBusinessKey)
	case !storable(processKey) || len(processKey) > 255:
		return ParkInvalidAction, "the process definition key is not text of at most 255 bytes the engine can have (invalid UTF-8, NUL bytes, or too long)"
	case !storable(messageName):
		return ParkInvalidAction, "the message name cannot be stored as text (invalid UTF-8 or NUL bytes)"
	}
	return "", ""
}

// businessKeyOf is the business key a's row records: escaped when it cannot be stored,
// cut when it is longer than the engine's.
func businessKeyOf(a Action) string {
	bk := ""
	switch {
	case a.Start != nil:
		bk = a.Start.BusinessKey
	case a.Correlate != nil:
		bk = a.Correlate.BusinessKey
	}
	s, _ := storedText(bk)
	return truncate(s, 4*MaxBusinessKey)
}

// dataException reports whether err is PostgreSQL refusing a value (SQLSTATE class 22,
// a data exception, or 54000, a value too large for an index): the message's fault, not
// an outage, and the code.
func dataException(err error) (string, bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "22") || pe.Code == "54000") {
		return pe.Code, true
	}
	return "", false
}

// engineVerdict is what an engine call's error (not the engine's verdict on the message)
// makes of it.
type engineVerdict int

const (
	// retryLater: not sent, refused for now (throttled, credentials, a concurrent
	// modification), or the answer lost.
	retryLater engineVerdict = iota
	// engineFailed: the engine failed on it (5xx): retried, counted.
	engineFailed
	// parkFailing: the engine failed on it too often: parked.
	parkFailing
	// parkRefused: the engine refused it (4xx): parked.
	parkRefused
)

// judgeEngineError maps an engine call's error; failures counts the engine's failures on
// the message before this one, limit is Config.MaxEngineFailures.
func judgeEngineError(err error, failures, limit int) engineVerdict {
	var ee *camunda7.Error
	switch {
	case errors.Is(err, camunda7.ErrNotSent), errors.Is(err, camunda7.ErrThrottled), errors.Is(err, camunda7.ErrUnauthorized),
		errors.Is(err, camunda7.ErrOptimisticLock):
		return retryLater
	case errors.As(err, &ee) && ee.StatusCode >= 500 && failures+1 >= limit:
		return parkFailing
	case errors.As(err, &ee) && ee.StatusCode >= 500:
		return engineFailed
	case errors.As(err, &ee):
		return parkRefused
	}
	return retryLater // sent, answer lost or unreadable
}

// outcomeUnknown reports whether a request that changes the engine, failing with err,
// may have taken effect there: its answer lost or unreadable, or the engine's own failure
// (its transaction rolled back, but the next attempt asks anyway). An answer that refused
// it, and a request never sent, leave nothing to reconcile.
func outcomeUnknown(err error) bool {
	var ee *camunda7.Error
	switch {
	case err == nil, errors.Is(err, camunda7.ErrNotSent), errors.Is(err, camunda7.ErrThrottled),
		errors.Is(err, camunda7.ErrUnauthorized), errors.Is(err, camunda7.ErrOptimisticLock):
		return false
	case errors.As(err, &ee):
		return ee.StatusCode >= 500
	}
	return true
}

// mismatchError reports whether err is the engine's answer to a message nothing waits
// for (pinned by TestEngineCorrelationMismatchMessage).
func mismatchError(err error) bool {
	var ee *camunda7.Error
	return errors.As(err, &ee) && ee.StatusCode == http.StatusBadRequest && mismatch.MatchString(ee.Message)
}

// claim is what extworker_inbox_starts holds for a start's process definition and
// business key, as one message sees it.
type claim struct {
	held    bool          // a start was sent for the key
	mine    bool          // by this message
	pending bool          // its outcome unknown
	since   time.Duration // how long ago it was sent, on the database's clock
}

// claimWait is how long a message must wait before it may ask the engine about a start
// of its key: until another message's start, whose outcome is unknown, can no longer
// land. Its own start is the in-flight window's business (act).
func claimWait(c claim, window time.Duration) time.Duration {
	if !c.held || c.mine || !c.pending || c.since >= window {
		return 0
	}
	return window - c.since
}

// earlyExpired reports whether a message first seen since ago (on the database's clock)
// has been early for longer than window.
func earlyExpired(since, window time.Duration) bool { return since > window }

// suppressSlack is how long past its due time a retry copy of a waiting message is
// still taken to be on its way: RabbitMQ expires copies only at the head of the retry
// queue (up to BackoffMax late), and one in hand may take HandleTimeout.
func suppressSlack(cfg Config) time.Duration { return cfg.BackoffMax + cfg.HandleTimeout }
