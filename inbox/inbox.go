// Package inbox consumes events from RabbitMQ and acts on them in the engine exactly
// once: it records each message in an inbox table, keyed by its source and message id,
// before it acts, then either correlates it to a waiting process instance or starts a
// process instance, and acknowledges the delivery only once the inbox row and the engine
// agree.
//
// What a Consumer guarantees, whatever the broker redelivers and whenever a consumer dies:
//
//   - a message is acted on at most once: a redelivery, a replay or a second consumer
//     that gets the same message finds the inbox row and acknowledges it as a duplicate;
//     a consumer that died between the engine's answer and its own record is found out
//     by asking the engine (Reconciliation below) before anything is sent again;
//   - a process is never started twice for one business key: the business key, the
//     inbox row and the start's claim decide, not the message id alone;
//   - a message is acknowledged only after its row says what became of it;
//   - a message that cannot be acted on is parked, never dropped: it goes to the queue's
//     dead-letter queue with the reason, its row says why, and an operator replays it
//     (Replay, `extworker inbox replay`).
//
// How a message is classified (each delivery gets one Class, which the inbox's log
// records and metrics name):
//
//   - already consumed (processed, ignored_duplicate, or parked), or waiting in the retry
//     queue already: acknowledged, counted as a duplicate, nothing sent to the engine;
//   - the same message id with another body: a conflict, never acted on, parked;
//   - fields PostgreSQL or the engine cannot store: parked at once;
//   - no process instance of its process definition waits for it yet (early): retried
//     with backoff, through the queue's retry queue, for Config.EarlyWindow from its first
//     delivery, then parked;
//   - the process instance moved past the wait state, or ended (late): recorded as
//     ignored_duplicate with the reason, acknowledged;
//   - the engine unreachable, or its answer lost: retried with backoff for as long as it
//     takes (an engine restart parks nothing); a lost answer is reconciled first;
//   - the engine failing on it (5xx) Config.MaxEngineFailures times: parked.
//
// Reconciliation: a correlation sets one process variable on the instance it reaches,
// extworkerMessage_<message name>, to "source/message id", in the engine's transaction;
// a start sets extworkerStartedBy (StartMarkVariable) the same way, and is found by its
// process definition key and business key. Correlations therefore need a business key,
// and both name their process definition: every lookup in the engine is scoped to it.
// An attempt whose outcome is unknown is remembered (must_reconcile) through retries,
// parking and replays, until the engine has been asked.
//
// One start per process definition and business key, across messages: a start that
// another message sent, and whose answer was lost, may still land; a message for the
// same key waits until it can no longer (Config.InFlightWindow, which must exceed the
// engine client's timeout), then asks the engine before it starts anything (the table
// extworker_inbox_starts). A request that reaches the engine later than that (a proxy
// held it) can still start a second instance; a start that finds more than one instance
// of its definition with its business key logs a WARN and counts it
// (Stats.DuplicateStarts), and cancels nothing.
//
// At its edges: a message whose id, type or correlation id PostgreSQL cannot store as
// text (invalid UTF-8, NUL bytes), or whose business key the engine cannot store (not
// text, longer than MaxBusinessKey), is parked at once with the reason, its id escaped
// (StoredID); a data exception from PostgreSQL (SQLSTATE class 22) is the message's
// fault, never an outage. An id that begins with "hex:" or "sha256:" is recorded escaped
// too, so that no message is taken for another (a message without an id is recorded
// under "sha256:" and its body's digest). An engine that keeps failing on a message (5xx)
// parks it after Config.MaxEngineFailures answers. Each park is a WARN record, without
// reason, body or business key. Copies of a message waiting in the retry queue share its
// one retry chain: another copy delivered meanwhile is acknowledged as a duplicate.
//
// The tables are extworker_inbox, extworker_inbox_conflicts and extworker_inbox_starts,
// in the ledger's database (package migrations). Bodies are never stored, only their
// SHA-256 digests.
package inbox

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/camunda7"
)

// State is an inbox row's state.
type State string

// The states of an inbox row, what `extworker inbox list --state` takes and the
// extworker_inbox table stores: lower-case snake_case, like the ledger's
// (idempotency.State).
const (
	// StateReceived: recorded, not yet acted on.
	StateReceived State = "received"
	// StateProcessing: a consumer is acting on it, or died doing so (then the next
	// delivery reconciles with the engine before acting).
	StateProcessing State = "processing"
	// StateProcessed: the engine did what the message asked.
	StateProcessed State = "processed"
	// StateFailedRetryable: not acted on yet (early, or the engine unreachable); a copy
	// waits in the retry queue.
	StateFailedRetryable State = "failed_retryable"
	// StateFailedFinal: parked in the dead-letter queue for an operator; the reason says why.
	StateFailedFinal State = "failed_final"
	// StateIgnoredDuplicate: nothing to do: the process moved past the wait state, or an
	// instance with the business key exists already.
	StateIgnoredDuplicate State = "ignored_duplicate"
	// StateUnknown: an attempt's outcome at the engine is unknown (its answer was lost, or
	// it may still be in flight); the next delivery reconciles. The ledger's word
	// (idempotency.StateUnknown).
	StateUnknown State = "unknown"
)

// States lists the inbox's states, in lifecycle order.
func States() []State {
	return []State{StateReceived, StateProcessing, StateProcessed, StateFailedRetryable, StateFailedFinal, StateIgnoredDuplicate, StateUnknown}
}

// ParseState reads a state as `extworker inbox` takes it: in any case, and in the
// spellings the inbox stored before migration 00011 as well (upper case, and
// UNKNOWN_OUTCOME for what is now StateUnknown).
func ParseState(s string) (State, bool) {
	low := strings.ToLower(strings.TrimSpace(s))
	if low == "unknown_outcome" {
		return StateUnknown, true
	}
	if slices.Contains(States(), State(low)) {
		return State(low), true
	}
	return "", false
}

// Message is one delivery, as the inbox sees it.
type Message struct {
	// ID is the message id the producer set (outbox.Event.MessageID): the inbox's key
	// (StoredID says how it is recorded).
	ID string
	// Type is the message's type (the AMQP type property), e.g. "invoice.paid".
	Type string
	// CorrelationID is carried into the inbox row and every copy of the message.
	CorrelationID string
	// Body is the payload.
	Body []byte
	// SchemaVersion is the version of the body's schema the producer declared (the
	// schema-version header), for Decide; "" when none was.
	SchemaVersion string
	// Replay: the message is a historical replay (a consumer reading old offsets on
	// purpose, KafkaConfig.Replay, or a message marked with HeaderReplay), not a live
	// command: it may still correlate (once, as any message), but it never starts a
	// process: a Start is recorded as ignored, with the reason.
	Replay bool

	// chained: the transport (Run) keeps the message's retry chain, a copy in the retry
	// queue for each Retry. fresh: this delivery is not one of that chain's copies, nor a
	// redelivery of one the transport did not settle. A fresh copy of a chained message
	// that waits in the retry queue is a duplicate.
	chained, fresh bool
}

// Action is what a message asks of the engine: exactly one of Start, Correlate or Ignore.
type Action struct {
	Start     *Start
	Correlate *Correlate
	// Ignore records the message as processed without acting, with this reason (a type
	// the consumer does not act on, say).
	Ignore string
}

// Start starts the latest version of a process, once per business key.
type Start struct {
	ProcessKey  string
	BusinessKey string
	Variables   camunda7.Variables
}

// Correlate delivers a BPMN message to the process instance of ProcessDefinitionKey with
// BusinessKey that waits for it. The engine's lookups (the running instances, the history
// that says a message is late) are scoped to the process definition; the message goes to
// an instance found there, by its id (the engine's /message takes no process definition).
// Message start events are not used: a message that starts a process is a Start.
type Correlate struct {
	// ProcessDefinitionKey is the process whose instance waits for the message. Required:
	// a Correlate without it is parked.
	ProcessDefinitionKey string
	MessageName          string
	BusinessKey          string
	CorrelationKeys      camunda7.Variables
	Variables            camunda7.Variables
}

// Decide maps a message to its action. An error parks the message (a body it cannot
// read, say); the error's text becomes the parked reason, so it must not carry secrets.
type Decide func(Message) (Action, error)

// Disposition is what the transport does with a delivery once the inbox has handled it.
type Disposition int

const (
	// Ack: acknowledge; the row records the outcome.
	Ack Disposition = iota
	// Retry: send a copy to the retry queue to come back after Handling.Delay, then acknowledge.
	Retry
	// Park: send a copy to the dead-letter queue with Handling.Reason, then acknowledge.
	Park
)

func (d Disposition) String() string {
	switch d {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Park:
		return "park"
	}
	return fmt.Sprintf("Disposition(%d)", int(d))
}

// DefaultConcurrency is Config.Concurrency's default.
const DefaultConcurrency = 4

// DefaultMaxEngineFailures is Config.MaxEngineFailures's default.
const DefaultMaxEngineFailures = 5

// CallbackChannel is the channel (Config.Queue) the entry point records provider
// callbacks under (package inbox/callback): they keep no copy for a replay, and a parked
// one is reopened (Reopen) for its provider to send again.
const CallbackChannel = "http"

// Config configures a Consumer. Zero values take the documented defaults.
type Config struct {
	// Source names where the messages come from (the producing system): the inbox key is
	// (Source, message id). Required.
	Source string
	// Queue is the channel consumed: for a Consumer, the RabbitMQ queue (required; the
	// consumer declares it, durable, its retry queue Queue+".retry" and its dead-letter
	// queue Queue+".dlq"); for a KafkaConsumer, the topic. Recorded with each row.
	Queue string
	// Bindings bind Queue to exchanges (declared as durable topic exchanges).
	Bindings []Binding
	// Concurrency is how many messages are handled at once. Default DefaultConcurrency.
	// Each holds one of the pool's connections meanwhile: give the consumer a pool of
	// its own, of at least this size.
	Concurrency int
	// EarlyWindow is how long a message no process instance waits for is retried before
	// it is parked, from its first delivery (or its replay), on the database's clock.
	// Default 10m.
	EarlyWindow time.Duration
	// BackoffInitial and BackoffMax bound the wait before a retried message comes back,
	// doubling per attempt. Defaults 1s and 1m.
	BackoffInitial, BackoffMax time.Duration
	// InFlightWindow is how long after an attempt began asking the engine a request of
	// it may still land there, when nobody recorded its end (its consumer died, or gave
	// up waiting for the answer): until then the next attempt does not look, and waits.
	// It must exceed the engine client's timeout (ClientTimeout): NewConsumer refuses a
	// window that does not. Default the longer of 1m and twice the client's timeout.
	//
	// A request that reaches the engine later than this (a proxy or load balancer that
	// holds it, an engine that takes it up only after a long pause) is not waited for: a
	// start it carries can still start a second instance of the business key. The
	// inbox cannot prevent that; a start that finds more than one instance says so
	// (Stats.DuplicateStarts, a WARN record). Give the window room for the slowest path
	// to the engine.
	InFlightWindow time.Duration
	// MaxEngineFailures is how many failures of its own (5xx answers) the engine may give
	// to one message before it is parked: an answer such as "an exception occurred in the
	// persistence layer" comes again each time. Counted from the first delivery, or the
	// last replay. Default DefaultMaxEngineFailures (5). An engine that cannot be reached,
	// or whose answer is lost, counts nothing: those are retried for as long as it takes.
	MaxEngineFailures int
	// HandleTimeout bounds the handling of one message, the engine's calls included; a
	// consumer stopping lets the messages in hand finish within it. Default 1m.
	HandleTimeout time.Duration
	// Logger receives retries (INFO) and parked messages (WARN), by message id (escaped)
	// and kind, never a reason, a business key or a body. Default discard.
	Logger *slog.Logger
}

// Binding binds the queue to an exchange with a routing key (a topic pattern).
type Binding struct {
	Exchange   string
	RoutingKey string
}

// ClientTimeout is how long engine waits for the answer to a request that does not
// long-poll, which Config.InFlightWindow must exceed: for the engine's client, its
// Timeout (camunda7.Config.Timeout), or its LongPollMargin when that is longer
// (Client.LongPollTimeout(0), the client's one exported account of it).
func ClientTimeout(engine Engine) time.Duration { return engine.LongPollTimeout(0) }

// inFlightWindow is the window for a client whose requests time out after timeout: the
// one configured, which must exceed timeout, or by default the longer of a minute and
// twice timeout.
func inFlightWindow(configured, timeout time.Duration) (time.Duration, error) {
	switch {
	case configured <= 0:
		return max(time.Minute, 2*timeout), nil
	case configured <= timeout:
		return 0, fmt.Errorf("inbox: Config.InFlightWindow %v must exceed the engine client's timeout %v (camunda7.Config.Timeout, "+
			"or its LongPollMargin when longer): a request the client gave up on may land at the engine until then", configured, timeout)
	}
	return configured, nil
}

// WithDefaults is c with the documented defaults in its zero fields, for a consumer
// acting through engine (InFlightWindow's default, and its check, depend on the engine
// client's timeout), or an error saying what is wrong with c. NewConsumer applies it; a
// caller that sizes something by c (the pool, by Concurrency) applies it first. The one
// place the inbox's defaults are set.
func (c Config) WithDefaults(engine Engine) (Config, error) {
	if c.Source == "" {
		return c, errors.New("inbox: Config needs Source")
	}
	if !storable(c.Source) || !storable(c.Queue) {
		return c, errors.New("inbox: Config.Source and Config.Queue must be valid UTF-8 text without NUL bytes (PostgreSQL stores them)")
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.EarlyWindow <= 0 {
		c.EarlyWindow = 10 * time.Minute
	}
	if c.BackoffInitial <= 0 {
		c.BackoffInitial = time.Second
	}
	if c.BackoffMax < c.BackoffInitial {
		c.BackoffMax = max(time.Minute, c.BackoffInitial)
	}
	var err error
	if c.InFlightWindow, err = inFlightWindow(c.InFlightWindow, ClientTimeout(engine)); err != nil {
		return c, err
	}
	if c.MaxEngineFailures <= 0 {
		c.MaxEngineFailures = DefaultMaxEngineFailures
	}
	if c.HandleTimeout <= 0 {
		c.HandleTimeout = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// Handler records messages in the inbox and acts on them in the engine: the inbox
// without a transport. A transport (Consumer for RabbitMQ, KafkaConsumer for Kafka, an
// HTTP endpoint for callbacks) calls Handle for each message and does what the returned
// Handling's Disposition says. Any number of handlers, in any number of processes, may
// handle the messages of one source.
type Handler struct {
	pool   *pgxpool.Pool
	engine Engine
	decide Decide
	cfg    Config
	stats  Stats
	// system is the transport's messaging.system on the handling's spans ("rabbitmq",
	// "kafka"; none for others).
	system string
}

// NewHandler returns a handler that records in pool's inbox and acts through engine:
// admin.New of the engine's client, or a test's (package inboxtest). cfg.Queue is
// optional here: it names the channel the messages come from (a topic, say), recorded
// with each row.
func NewHandler(pool *pgxpool.Pool, engine Engine, decide Decide, cfg Config) (*Handler, error) {
	if pool == nil || isNil(engine) || decide == nil {
		return nil, errors.New("inbox: a handler needs a pool, an engine and a Decide")
	}
	cfg, err := cfg.WithDefaults(engine)
	if err != nil {
		return nil, err
	}
	return &Handler{pool: pool, engine: engine, decide: decide, cfg: cfg}, nil
}

// Config returns the handler's configuration, its defaults applied.
func (c *Handler) Config() Config { return c.cfg }

// Consumer consumes one RabbitMQ queue into the inbox and the engine. Any number of
// consumers may consume the same queue, in any number of processes.
type Consumer struct {
	*Handler
	amqpURL string

	declared     chan struct{} // closed once the queues are declared the first time
	declaredOnce sync.Once
}

// NewConsumer returns a consumer of cfg.Queue (required) on the broker at amqpURL that
// records in pool's inbox and acts through engine: admin.New of the engine's client, or
// a test's (package inboxtest).
func NewConsumer(pool *pgxpool.Pool, engine Engine, amqpURL string, decide Decide, cfg Config) (*Consumer, error) {
	if cfg.Queue == "" {
		return nil, errors.New("inbox: Config needs Source and Queue")
	}
	if ReservedSource(cfg.Source) {
		return nil, fmt.Errorf("inbox: Config.Source %q holds %q, which KafkaSource adds: a RabbitMQ consumer's messages would share a Kafka topic's ids", cfg.Source, kafkaMark)
	}
	h, err := NewHandler(pool, engine, decide, cfg)
	if err != nil {
		return nil, err
	}
	h.system = "rabbitmq"
	return &Consumer{Handler: h, amqpURL: amqpURL, declared: make(chan struct{})}, nil
}

// Declared is closed once Run has declared the queue and its bindings the first time.
// RabbitMQ routes a message only to the queues bound when it is published: a publisher
// in the same process (the outbox's relay) waits for it, so that nothing it publishes
// passes this consumer by. A publisher elsewhere needs the queue declared before its
// first publish (Declare, at deployment).
func (c *Consumer) Declared() <-chan struct{} { return c.declared }

// Stats returns the consumer's counts since it was made.
func (c *Handler) Stats() *Stats { return &c.stats }

func (c *Handler) backoff(attempt int) time.Duration {
	d := c.cfg.BackoffInitial << min(max(attempt-1, 0), 20)
	if d <= 0 || d > c.cfg.BackoffMax {
		d = c.cfg.BackoffMax
	}
	return d
}
