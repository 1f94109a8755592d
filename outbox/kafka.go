package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/extworker/extworker/internal/kafkarec"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The headers of the Kafka records KafkaPublisher writes (package inbox's KafkaConsumer
// reads them), beside traceparent and tracestate.
const (
	KafkaHeaderMessageID     = "message-id"
	KafkaHeaderType          = "type"
	KafkaHeaderCorrelationID = "correlation-id"
)

// KafkaPublisher publishes to Kafka with the idempotent producer (acknowledged by all
// in-sync replicas; a retried produce is written once per partition). An event becomes
// a record on the topic Event.RoutingKey names (Event.Exchange is not used), keyed by its
// ordering key, so that the events of one key land on one partition, in the order the
// relay publishes them; the message id, type, correlation id and the W3C trace context
// travel as headers. Publish returns once the record is acknowledged. It is safe for
// concurrent use.
type KafkaPublisher struct {
	cl *kgo.Client
}

// NewKafkaPublisher returns a publisher to the brokers (host:port seeds); opts are
// further franz-go options (TLS, SASL, client id), applied last.
func NewKafkaPublisher(brokers []string, opts ...kgo.Opt) (*KafkaPublisher, error) {
	if len(brokers) == 0 {
		return nil, errors.New("outbox: a Kafka publisher needs brokers")
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.AllowAutoTopicCreation(),
		// One record in flight per partition: a record retried after a broker's failure
		// cannot overtake the next one of its key.
		kgo.MaxProduceRequestsInflightPerBroker(1),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: Kafka client: %w", err)
	}
	return &KafkaPublisher{cl: cl}, nil
}

// Publish sends e and waits for the broker's acknowledgement, or for ctx to end: a record
// given up on may still be written, and the relay publishes the event again, with its id.
func (p *KafkaPublisher) Publish(ctx context.Context, e Event) error {
	if e.RoutingKey == "" {
		return fmt.Errorf("outbox: publish %s: no topic (Event.RoutingKey)", e.MessageID)
	}
	key := e.OrderingKey
	if key == "" {
		key = e.MessageID
	}
	r := &kgo.Record{Topic: e.RoutingKey, Key: []byte(key), Value: e.Body, Headers: []kgo.RecordHeader{
		{Key: KafkaHeaderMessageID, Value: []byte(e.MessageID)}, {Key: KafkaHeaderType, Value: []byte(e.Type)}}}
	if e.CorrelationID != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: KafkaHeaderCorrelationID, Value: []byte(e.CorrelationID)})
	}
	for k, v := range w3c(ctx) {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	if err := kafkarec.Produce(ctx, p.cl, r); err != nil {
		return fmt.Errorf("outbox: publish %s: %w", e.MessageID, err)
	}
	return nil
}

func (p *KafkaPublisher) messagingSystem() string { return "kafka" }

// Close flushes nothing (Publish waits for each record) and closes the client.
func (p *KafkaPublisher) Close() error {
	p.cl.Close()
	return nil
}
