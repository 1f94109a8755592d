package soak

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/oracle"
	"github.com/extworker/extworker/outbox"
)

// The demo's events (examples/invoice/events.go): a paid invoice's invoice.paid goes out
// through the outbox, and the shipping process is started from it through the inbox.
const (
	eventsExchange = "extworker.demo"
	paidType       = "invoice.paid"
	shippingKey    = "extworker-demo-shipping"
	paidSource     = "extworker-demo.billing"
	// With Kafka (EXTWORKER_DEMO_EVENTS=kafka): the topic is the routing key, and the
	// workers consume it in this group.
	paidTopic     = paidType
	shippingGroup = "extworker-demo.shipping"
)

// Broker is the broker the workers' events go through, one the soak may kill (SIGKILL
// of the node, or of the JVM) and start again: RabbitMQ (URL is its amqp:// URL) or,
// with Config.Kafka, Kafka (URL is its bootstrap address, host:port).
type Broker interface {
	URL() string
	Kill() error
	Restart() error
}

// tap is the soak's own view of the events on the broker: it sees every invoice.paid the
// relays publish (the broker's side of "published at least once"), and the duplicator
// sends some of them again, byte for byte, as a producer's retry would. On RabbitMQ it is
// a queue of its own on the events' exchange; on Kafka a reader of the topic's partitions
// from the start, outside any group (kafka.go), which also watches the workers' group for
// rebalances.
type tap struct {
	url, queue string
	// kafka: url is Kafka's bootstrap address and queue unused.
	kafka bool
	// source is the inbox source the workers record the events under.
	source string
	// rebalances counts the changes of the workers' group's members the Kafka tap saw.
	rebalances atomic.Int64

	mu     sync.Mutex
	bodies map[string]string // message id -> body digest, first seen
	seen   map[string]int    // message id -> deliveries to the tap
	differ []string          // message ids seen with two bodies
	raw    map[string][]byte // message id -> body, for the duplicator

	dups atomic.Int64 // copies the duplicator sent
}

func newTap(url, queue string) *tap {
	return &tap{url: url, queue: queue, source: paidSource, bodies: map[string]string{}, seen: map[string]int{}, raw: map[string][]byte{}}
}

// brokerName is the events' broker, for the report.
func (t *tap) brokerName() string {
	if t.kafka {
		return "Kafka"
	}
	return "RabbitMQ"
}

// record notes one delivery of message id with body to the tap.
func (t *tap) record(id string, body []byte) {
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev, ok := t.bodies[id]; !ok {
		t.bodies[id] = digest
		t.raw[id] = body
	} else if prev != digest {
		t.differ = append(t.differ, id)
	}
	t.seen[id]++
}

// eventsDrainAllowed bounds how long the events may take to settle once the invoices
// have: a publish that failed while the broker was down waits up to the relay's backoff
// (1 min), a consumer reconnects within its own (1 min).
const eventsDrainAllowed = 3 * time.Minute

// declare declares the tap once, before the workers start.
func (t *tap) declare() error {
	if t.kafka {
		return t.declareKafka()
	}
	conn, err := amqp.Dial(t.url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return declareTap(ch, t.queue)
}

// run consumes the tap queue until ctx ends, connecting again after the broker dies.
func (t *tap) run(ctx context.Context) {
	if t.kafka {
		t.runKafka(ctx)
		return
	}
	for ctx.Err() == nil {
		_ = t.session(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (t *tap) session(ctx context.Context) error {
	conn, err := amqp.Dial(t.url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := declareTap(ch, t.queue); err != nil {
		return err
	}
	ds, err := ch.ConsumeWithContext(ctx, t.queue, "", true, false, false, false, nil)
	if err != nil {
		return err
	}
	for d := range ds {
		t.record(d.MessageId, d.Body)
	}
	return nil
}

// declareTap declares the events' exchange and the tap queue (durable: it outlives
// broker restarts) bound to invoice.paid.
func declareTap(ch *amqp.Channel, queue string) error {
	if err := ch.ExchangeDeclare(eventsExchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return err
	}
	return ch.QueueBind(queue, paidType, eventsExchange, false, nil)
}

// duplicate sends, every ~every, one event the tap has seen again to the exchange or the
// topic (so to the workers' consumers and the tap), with its ordering key, until ctx ends.
func (t *tap) duplicate(ctx context.Context, rng *rand.Rand, every time.Duration) {
	var pub interface {
		outbox.Publisher
		Close() error
	}
	if t.kafka {
		kp, err := outbox.NewKafkaPublisher([]string{t.url}) // its client reconnects after the broker dies
		if err != nil {
			return
		}
		pub = kp
	} else {
		pub = outbox.NewAMQPPublisher(t.url) // reconnects after the broker dies
	}
	defer pub.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every/2 + time.Duration(rng.Int64N(int64(every)))):
		}
		t.mu.Lock()
		ids := slices.Sorted(maps.Keys(t.raw)) // sorted: the seeded generator picks, not the map's order
		var id string
		var body []byte
		if len(ids) > 0 {
			id = ids[rng.IntN(len(ids))]
			body = t.raw[id]
		}
		t.mu.Unlock()
		if id == "" {
			continue
		}
		err := pub.Publish(ctx, outbox.Event{MessageID: id, Type: paidType, Exchange: eventsExchange, RoutingKey: paidType,
			OrderingKey: strings.TrimPrefix(id, paidType+":"), Body: body})
		if err == nil {
			t.dups.Add(1)
		}
	}
}

// eventCounts is what the events did in a run.
type eventCounts struct {
	// Events is the outbox's invoice.paid events of the run; Unpublished those never
	// confirmed by the broker.
	Events, Unpublished int
	// Tapped is how many of them reached the broker's tap; TapDeliveries counts every
	// copy (republished by a relay that died before its mark, or by the duplicator).
	Tapped, TapDeliveries int
	// DuplicatesSent is the duplicator's copies.
	DuplicatesSent int
	// Inbox rows of the run, by state; deliveries and duplicates summed over them.
	InboxStates                     map[string]int
	Deliveries, Duplicates, Reconcd int
	// Shipping instances of the run, and the business keys with more than one.
	Shipping, ShippedTwice int
	// BrokerRestarts is how many times the broker was killed and started again.
	BrokerRestarts int
	// Broker is the events' broker: RabbitMQ or Kafka. Rebalances (Kafka) counts the
	// changes of the workers' consumer group's members the tap saw.
	Broker     string
	Rebalances int
	// Drain is how long the events took to settle after the invoices had.
	Drain time.Duration
}

func (n eventCounts) inboxRows() int {
	total := 0
	for _, k := range n.InboxStates {
		total += k
	}
	return total
}

// eventsSettled reports whether the run's events have all been published and acted on:
// the outbox is empty and every event's inbox row (under source) is settled.
func eventsSettled(ctx context.Context, pool *pgxpool.Pool, ns, source, run string) (bool, error) {
	var unpublished, events, settled int
	err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NULL), count(*) FROM extworker_outbox
		WHERE namespace = $1 AND message_id LIKE $2`, ns, paidType+":"+run+"%").Scan(&unpublished, &events)
	if err != nil {
		return false, err
	}
	err = pool.QueryRow(ctx, `SELECT count(*) FROM extworker_inbox WHERE source = $1 AND message_id LIKE $2
		AND state = ANY($3)`, source, paidType+":"+run+"%",
		[]string{string(inbox.StateProcessed), string(inbox.StateIgnoredDuplicate), string(inbox.StateFailedFinal)}).Scan(&settled)
	if err != nil {
		return false, err
	}
	return unpublished == 0 && settled >= events, nil
}

// checkEvents is I10 and I11 over the run's events.
//
//	I10 (outbox): every invoice whose charge the ledger confirmed has exactly one
//	    invoice.paid in the outbox, published (confirmed by the broker) and seen by the
//	    broker's tap at least once, every copy with the same body.
//	I11 (inbox): every event was acted on exactly once: one shipping instance per event's
//	    invoice, none for anything else, no message parked.
//
// It reads the outbox, the inbox and the shipping instances; checkOutbox, checkInbox
// and checkShipping decide.
func checkEvents(ctx context.Context, c *admin.Client, pool *pgxpool.Pool, t *tap, ns, run string, paid map[string]bool, violate func(string, ...any)) eventCounts {
	var n eventCounts
	report := func(v []string) {
		for _, s := range v {
			violate("%s", s)
		}
	}
	prefix := paidType + ":" + run
	events, ok := readOutbox(ctx, pool, ns, prefix, violate)
	if !ok {
		return n
	}
	t.mu.Lock()
	report(checkOutbox(events, t.seen, t.differ, paid, &n))
	t.mu.Unlock()
	n.DuplicatesSent = int(t.dups.Load())
	n.Broker, n.Rebalances = t.brokerName(), int(t.rebalances.Load())
	inbox, ok := readInbox(ctx, pool, t.source, prefix, violate)
	if !ok {
		return n
	}
	report(checkInbox(inbox, events, &n))
	his, err := oracle.AllPages(ctx, url.Values{"processDefinitionKey": {shippingKey}, "processInstanceBusinessKeyLike": {run + "%"}},
		c.HistoricProcessInstances)
	if err != nil {
		violate("run: read the shipping instances: %v", err)
		return n
	}
	report(checkShipping(his, events, &n))
	return n
}

// readOutbox reads the run's invoice.paid events from the outbox: whether each was
// published, by message id. false: the outbox could not be read at all.
func readOutbox(ctx context.Context, pool *pgxpool.Pool, ns, prefix string, violate func(string, ...any)) (map[string]bool, bool) {
	rows, err := pool.Query(ctx, `SELECT message_id, published_at IS NOT NULL FROM extworker_outbox WHERE namespace = $1 AND message_id LIKE $2`, ns, prefix+"%")
	if err != nil {
		violate("run: read the outbox: %v", err)
		return nil, false
	}
	defer rows.Close()
	events := map[string]bool{}
	for rows.Next() {
		var id string
		var published bool
		if err := rows.Scan(&id, &published); err != nil {
			violate("run: read the outbox: %v", err)
			break
		}
		events[id] = published
	}
	return events, true
}

// checkOutbox is I10 over the outbox's events (published or not, by message id), what
// the tap saw (deliveries by message id; ids seen with two bodies) and the invoices the
// ledger confirmed as charged (paid). It counts into n.
func checkOutbox(events map[string]bool, seen map[string]int, differ []string, paid map[string]bool, n *eventCounts) []string {
	var v []string
	n.Events = len(events)
	for id, published := range events {
		if !published {
			n.Unpublished++
			v = append(v, fmt.Sprintf("I10: %s was never published (the broker never confirmed it)", id))
		}
		if seen[id] == 0 {
			v = append(v, fmt.Sprintf("I10: %s never reached the broker's tap", id))
		} else {
			n.Tapped++
		}
	}
	for _, k := range seen {
		n.TapDeliveries += k
	}
	for _, id := range differ {
		v = append(v, fmt.Sprintf("I10: %s was delivered with two different bodies", id))
	}
	for inv := range paid {
		if _, ok := events[paidType+":"+inv]; !ok {
			v = append(v, fmt.Sprintf("I10: invoice %s was charged (the ledger confirmed it) but has no invoice.paid in the outbox", inv))
		}
	}
	for id := range events {
		if !paid[strings.TrimPrefix(id, paidType+":")] {
			v = append(v, fmt.Sprintf("I10: %s announces an invoice the ledger did not confirm as charged", id))
		}
	}
	return v
}

// inboxRow is one inbox row of the run's events.
type inboxRow struct {
	id, state, reason      string
	deliveries, duplicates int
}

// readInbox reads the inbox rows of the run's events, recorded under source. false: the
// inbox could not be read at all.
func readInbox(ctx context.Context, pool *pgxpool.Pool, source, prefix string, violate func(string, ...any)) ([]inboxRow, bool) {
	rows, err := pool.Query(ctx, `SELECT message_id, state, deliveries, duplicates, coalesce(reason, '') FROM extworker_inbox
		WHERE source = $1 AND message_id LIKE $2`, source, prefix+"%")
	if err != nil {
		violate("run: read the inbox: %v", err)
		return nil, false
	}
	defer rows.Close()
	var out []inboxRow
	for rows.Next() {
		var r inboxRow
		if err := rows.Scan(&r.id, &r.state, &r.deliveries, &r.duplicates, &r.reason); err != nil {
			violate("run: read the inbox: %v", err)
			break
		}
		out = append(out, r)
	}
	return out, true
}

// checkInbox is I11's inbox half over the run's inbox rows and the outbox's events:
// every event reached the inbox and was processed (or recognised as a duplicate), none
// parked or left unsettled. It counts into n.
func checkInbox(rows []inboxRow, events map[string]bool, n *eventCounts) []string {
	var v []string
	n.InboxStates = map[string]int{}
	inboxed := map[string]bool{}
	for _, r := range rows {
		inboxed[r.id] = true
		n.InboxStates[r.state]++
		n.Deliveries += r.deliveries
		n.Duplicates += r.duplicates
		if strings.HasPrefix(r.reason, "reconciled") {
			n.Reconcd++
		}
		switch inbox.State(r.state) {
		case inbox.StateProcessed, inbox.StateIgnoredDuplicate:
		case inbox.StateFailedFinal:
			v = append(v, fmt.Sprintf("I11: %s was parked: %s", r.id, r.reason))
		default:
			v = append(v, fmt.Sprintf("I11: %s was left %s: %s", r.id, r.state, r.reason))
		}
	}
	for id := range events {
		if !inboxed[id] {
			v = append(v, fmt.Sprintf("I11: %s never reached the inbox", id))
		}
	}
	return v
}

// checkShipping is I11's engine half over the run's shipping instances and the outbox's
// events: one shipping instance per event's invoice, none for anything else. It counts
// into n.
func checkShipping(his []admin.HistoricProcessInstance, events map[string]bool, n *eventCounts) []string {
	var v []string
	per := map[string]int{}
	for _, h := range his {
		per[h.BusinessKey]++
	}
	n.Shipping = len(his)
	for bk, k := range per {
		if k > 1 {
			n.ShippedTwice++
			v = append(v, fmt.Sprintf("I11: invoice %s was shipped %d times (one event acted on more than once)", bk, k))
		}
		if _, ok := events[paidType+":"+bk]; !ok {
			v = append(v, fmt.Sprintf("I11: invoice %s was shipped without an invoice.paid event", bk))
		}
	}
	for id := range events {
		if per[strings.TrimPrefix(id, paidType+":")] == 0 {
			v = append(v, fmt.Sprintf("I11: %s started no shipping instance (an event lost)", id))
		}
	}
	return v
}
