package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/extworker/extworker/internal/digest"
	"github.com/extworker/extworker/internal/failpoint"
	"github.com/extworker/extworker/internal/kafkarec"
)

// The headers of a Kafka record the inbox reads (the outbox's KafkaPublisher writes
// them), beside the trace context's (HeaderTraceparent, HeaderTracestate) and those a
// consumer sets on its retry and dead-letter copies (HeaderSource, HeaderReason,
// HeaderAttempt, HeaderDigest, HeaderDue).
const (
	// HeaderMessageID is the message id, the inbox's key (with the source).
	HeaderMessageID = "message-id"
	// HeaderType is the message's type, e.g. "invoice.paid".
	HeaderType = "type"
	// HeaderCorrelationID is carried into the inbox row.
	HeaderCorrelationID = "correlation-id"
	// HeaderSchemaVersion is the version of the body's schema (Message.SchemaVersion).
	HeaderSchemaVersion = "schema-version"
	// HeaderReplay marks a record as a historical replay (Message.Replay) when its value
	// is "true".
	HeaderReplay = "x-extworker-replay"
	// HeaderDue is when a retry copy is due, in Unix milliseconds.
	HeaderDue = "x-extworker-due"
)

// KafkaConfig configures a KafkaConsumer's connection and group.
type KafkaConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Group is the consumer group. Required. Every consumer of a topic in one group
	// shares its partitions; each partition's offset is committed only once the inbox rows
	// of its records are settled.
	Group string
	// Replay says the group reads history on purpose (its offsets were reset to an older
	// position): every message is a historical replay (Message.Replay), which correlates
	// at most once and never starts a process.
	Replay bool
	// SessionTimeout is how long the group waits for a consumer that stopped
	// heartbeating (a process that died) before its partitions go to the others: until
	// then, their records wait. Default DefaultKafkaSessionTimeout; the broker bounds it
	// (group.min.session.timeout.ms, 6s by default).
	SessionTimeout time.Duration
	// Options are further franz-go options (TLS, SASL, client id), applied last.
	Options []kgo.Opt
}

// DefaultKafkaSessionTimeout is KafkaConfig.SessionTimeout's default: 10s, shorter than
// the Kafka client's 45s, so that a dead worker's partitions are taken over within
// seconds, as RabbitMQ redelivers a dead consumer's messages at once.
const DefaultKafkaSessionTimeout = 10 * time.Second

// commitTimeout bounds a commit of offsets: one that does not finish leaves its records
// to come again, which the inbox knows.
const commitTimeout = 10 * time.Second

// KafkaSource is the inbox source of messages from topic, for a consumer configured with
// source: the topic is part of the message's identity, so that ids from two channels
// cannot collide.
func KafkaSource(source, topic string) string { return source + kafkaMark + topic }

// kafkaMark joins a source and a topic in KafkaSource.
const kafkaMark = "@kafka:"

// ReservedSource reports whether source is a name KafkaSource makes (it holds "@kafka:"):
// no channel but a KafkaConsumer records messages under it, so that two channels' ids
// cannot collide.
func ReservedSource(source string) bool { return strings.Contains(source, kafkaMark) }

// KafkaConsumer consumes one Kafka topic into the inbox and the engine, with the same
// states, classification and guarantees as Consumer. Its companions are the topics
// RetryQueue(topic) (early messages and engine outages wait there, so that they do not
// block the topic's partitions) and DeadLetterQueue(topic) (parked messages, for
// ReplayKafka). Per partition, records are handled in order; partitions are handled side
// by side, Config.Concurrency at most. A partition's offset is committed only after the
// rows of the records below it are settled (and their retry or dead-letter copies
// written): a consumer that dies, or loses the partition, leaves them to be delivered
// again, and the inbox suppresses what it handled already. A rebalance waits until the
// records in hand are settled and committed (the group's rebalance timeout bounds it).
type KafkaConsumer struct {
	*Handler
	kc                 KafkaConfig
	topic, retry, dead string
}

// NewKafkaConsumer returns a consumer of the topic cfg.Queue (required), recording in
// pool's inbox under KafkaSource(cfg.Source, cfg.Queue) and acting through engine.
func NewKafkaConsumer(pool *pgxpool.Pool, engine Engine, decide Decide, cfg Config, kc KafkaConfig) (*KafkaConsumer, error) {
	if cfg.Queue == "" || cfg.Source == "" || len(kc.Brokers) == 0 || kc.Group == "" {
		return nil, errors.New("inbox: a Kafka consumer needs Config.Source, Config.Queue (the topic), KafkaConfig.Brokers and KafkaConfig.Group")
	}
	if ReservedSource(cfg.Source) {
		return nil, fmt.Errorf("inbox: Config.Source %q holds %q, which KafkaSource adds", cfg.Source, kafkaMark)
	}
	if err := checkTopic(cfg.Queue); err != nil {
		return nil, err
	}
	topic := cfg.Queue
	cfg.Source = KafkaSource(cfg.Source, topic)
	h, err := NewHandler(pool, engine, decide, cfg)
	if err != nil {
		return nil, err
	}
	h.system = "kafka"
	return &KafkaConsumer{Handler: h, kc: kc, topic: topic, retry: RetryQueue(topic), dead: DeadLetterQueue(topic)}, nil
}

// checkTopic refuses a topic Kafka would not take, with its retry and dead-letter
// companions: letters, digits, '.', '_' and '-', at most 249 characters in all.
func checkTopic(topic string) error {
	long := RetryQueue(topic)
	ok := len(long) <= 249 && topic != "." && topic != ".." && strings.IndexFunc(topic, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
	}) < 0
	if !ok {
		return fmt.Errorf("inbox: Config.Queue %q is not a Kafka topic name, or too long for its retry topic %q: "+
			"letters, digits, '.', '_' and '-', at most %d characters", topic, long, 249-len(".retry"))
	}
	return nil
}

// Run consumes until ctx ends. On return, the records in hand have been settled and
// committed (within HandleTimeout), or are left uncommitted, to be delivered again.
func (c *KafkaConsumer) Run(ctx context.Context) error {
	session := cmp.Or(c.kc.SessionTimeout, DefaultKafkaSessionTimeout)
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(c.kc.Brokers...),
		kgo.ConsumerGroup(c.kc.Group),
		kgo.ConsumeTopics(c.topic, c.retry),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.AllowAutoTopicCreation(),
		kgo.SessionTimeout(session),
		kgo.HeartbeatInterval(session / 5),
	}, c.kc.Options...)...)
	if err != nil {
		return fmt.Errorf("inbox: Kafka client: %w", err)
	}
	defer func() {
		// A rebalance blocked by the last poll would hold Close (leaving the group) forever.
		cl.AllowRebalance()
		cl.Close()
	}()
	for {
		fetches := cl.PollRecords(ctx, 4*c.cfg.Concurrency)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			c.cfg.Logger.Warn("inbox: fetching from Kafka failed; trying again", "topic", topic, "partition", partition, "error", err)
		})
		c.batch(ctx, cl, fetches)
		cl.AllowRebalance()
	}
}

// batch handles one poll's records: each partition's in order, partitions side by side,
// then commits what each partition settled.
func (c *KafkaConsumer) batch(ctx context.Context, cl *kgo.Client, fetches kgo.Fetches) {
	sem := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			c.partition(ctx, cl, p.Topic, p.Partition, p.Records)
		}()
	})
	wg.Wait()
}

// partition handles records of one partition in order until one cannot be settled now (a
// retry copy not due yet, or the inbox or the broker failing): the partition's position
// goes back to that record, and its fetching pauses until it is due, or for a backoff.
// What was settled is committed.
func (c *KafkaConsumer) partition(ctx context.Context, cl *kgo.Client, topic string, part int32, recs []*kgo.Record) {
	var settled *kgo.Record
	for i, r := range recs {
		wait := dueIn(r, time.Now())
		if wait <= 0 {
			if c.deliver(ctx, cl, r) {
				settled = r
				continue
			}
			wait = c.backoff(attempts(r) + 1)
		}
		c.pause(cl, topic, part, recs[i], wait)
		break
	}
	if settled == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	if err := cl.CommitRecords(cctx, settled); err != nil {
		// Lost the partition, or the group coordinator: the records come again, and the
		// inbox knows them.
		c.cfg.Logger.Warn("inbox: committing Kafka offsets failed; the records come again and the inbox knows them",
			"topic", topic, "partition", part, "error", err)
	}
}

// pause rewinds the partition to r and stops fetching it for wait.
func (c *KafkaConsumer) pause(cl *kgo.Client, topic string, part int32, r *kgo.Record, wait time.Duration) {
	tp := map[string][]int32{topic: {part}}
	cl.PauseFetchPartitions(tp)
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{topic: {part: {Epoch: r.LeaderEpoch, Offset: r.Offset}}})
	time.AfterFunc(wait, func() { cl.ResumeFetchPartitions(tp) })
}

// deliver handles one record and writes its retry or dead-letter copy, if any. It
// reports whether the record is settled (its offset may be committed).
func (c *KafkaConsumer) deliver(ctx context.Context, cl *kgo.Client, r *kgo.Record) bool {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HandleTimeout)
	defer cancel()
	m := kafkaMessage(r, c.kc.Replay)
	out, err := c.Handle(recordContext(hctx, r), m)
	id := logID(StoredID(m.ID))
	if err != nil {
		c.cfg.Logger.Warn("inbox: recording a message failed; it comes back", "message_id", id, "error", err)
		return false
	}
	reason := truncate(cleanText(out.Reason), 500)
	switch out.Disposition {
	case Retry:
		err = c.copyTo(hctx, cl, c.retry, r, map[string]string{HeaderSource: c.cfg.Source, HeaderReason: reason,
			HeaderAttempt: strconv.Itoa(attempts(r) + 1), HeaderDue: strconv.FormatInt(time.Now().Add(out.Delay).UnixMilli(), 10)})
	case Park:
		err = c.copyTo(hctx, cl, c.dead, r, map[string]string{HeaderSource: c.cfg.Source, HeaderReason: reason,
			HeaderDigest: digest.Bytes(r.Value)})
	}
	if err != nil {
		c.cfg.Logger.Warn("inbox: could not write a message to its retry or dead-letter topic; it comes back", "message_id", id, "error", err)
		return false
	}
	failpoint.Inject(failpoint.InboxAfterAck)
	return true
}

// copyTo writes a copy of r to topic, with r's key, value and headers, extra replacing
// any of the same name, and waits for the broker's acknowledgement.
func (c *KafkaConsumer) copyTo(ctx context.Context, cl *kgo.Client, topic string, r *kgo.Record, extra map[string]string) error {
	return kafkarec.Produce(ctx, cl, &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: withHeaders(r.Headers, extra)})
}

// withHeaders is hs with extra's values replacing (or added to) those of the same key;
// headers whose value extra sets to "" are dropped.
func withHeaders(hs []kgo.RecordHeader, extra map[string]string) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, 0, len(hs)+len(extra))
	for _, h := range hs {
		if _, ok := extra[h.Key]; !ok {
			out = append(out, h)
		}
	}
	for k, v := range extra {
		if v != "" {
			out = append(out, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	return out
}

// kafkaMessage is the message a record carries. The consumer keeps no retry chain (a
// record consumed again after a crash cannot be told from a fresh one): every copy is
// handled, and the inbox's row decides.
func kafkaMessage(r *kgo.Record, replay bool) Message {
	return Message{ID: kafkarec.Header(r, HeaderMessageID), Type: kafkarec.Header(r, HeaderType), CorrelationID: kafkarec.Header(r, HeaderCorrelationID),
		Body: r.Value, SchemaVersion: kafkarec.Header(r, HeaderSchemaVersion), Replay: replay || kafkarec.Header(r, HeaderReplay) == "true"}
}

// attempts is how many times the record went through the retry topic.
func attempts(r *kgo.Record) int {
	n, err := strconv.Atoi(kafkarec.Header(r, HeaderAttempt))
	if err != nil {
		return 0
	}
	return min(max(n, 0), 1<<30)
}

// dueIn is how long until a retry copy is due (0 or less: due, as is any other record).
func dueIn(r *kgo.Record, now time.Time) time.Duration {
	ms, err := strconv.ParseInt(kafkarec.Header(r, HeaderDue), 10, 64)
	if err != nil {
		return 0
	}
	return min(time.UnixMilli(ms).Sub(now), time.Hour)
}

// recordContext is deliveryContext for a Kafka record: ctx with the record's W3C trace
// context as the remote parent, or no span at all.
func recordContext(ctx context.Context, r *kgo.Record) context.Context {
	ctx = trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	tp := kafkarec.Header(r, HeaderTraceparent)
	if tp == "" {
		return ctx
	}
	return otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier{HeaderTraceparent: tp, HeaderTracestate: kafkarec.Header(r, HeaderTracestate)})
}
