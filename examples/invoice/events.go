package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/kelseyhightower/envconfig"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/outbox"
)

// The demo's events: a paid invoice announces itself with an invoice.paid event, added
// through the outbox in the transaction that confirms the charge in the ledger; the
// shipping process is started from it through the inbox, once per invoice, whatever the
// broker or the producer delivers twice. The broker is RabbitMQ (the exchange
// extworker.demo, the queue extworker-demo.invoice-paid) or, with
// EXTWORKER_DEMO_EVENTS=kafka, Kafka (the topic invoice.paid, the event's routing key,
// consumed in the group extworker-demo.shipping).
const (
	demoExchange        = "extworker.demo"
	demoPaidType        = "invoice.paid"
	demoPaidQueue       = "extworker-demo.invoice-paid"
	demoPaidTopic       = demoPaidType // the KafkaPublisher's topic is the routing key
	demoShippingGroup   = "extworker-demo.shipping"
	demoShippingKey     = "extworker-demo-shipping"
	demoPaidEventSource = "extworker-demo.billing"
)

// The brokers EXTWORKER_DEMO_EVENTS names.
const (
	eventsAMQP  = "amqp"
	eventsKafka = "kafka"
)

// eventsConfig is the broker the demo's events go through, a setting of the demo's own
// (`invoice config` prints it beside the framework's): the framework knows no demo.
type eventsConfig struct {
	// Broker is amqp (RabbitMQ at EXTWORKER_AMQP_URL; no events without it) or kafka (the
	// brokers EXTWORKER_KAFKA_BROKERS, the relay publishing there:
	// EXTWORKER_OUTBOX_BROKER=kafka).
	Broker string `envconfig:"DEMO_EVENTS" default:"amqp"`
}

// loadEventsConfig reads EXTWORKER_DEMO_EVENTS and checks it against the framework's
// variables it relies on; every problem is a configuration error (exit status 78).
func loadEventsConfig() (eventsConfig, error) {
	var c eventsConfig
	if err := envconfig.Process("EXTWORKER", &c); err != nil {
		return c, extworker.ConfigError{Err: err}
	}
	c.Broker = cmp.Or(c.Broker, eventsAMQP) // set and empty: the default, as the framework's variables
	var errs []error
	switch c.Broker {
	case eventsAMQP:
	case eventsKafka:
		if kafkaBrokers() == "" {
			errs = append(errs, errors.New("EXTWORKER_DEMO_EVENTS=kafka needs EXTWORKER_KAFKA_BROKERS"))
		}
		if ob := os.Getenv("EXTWORKER_OUTBOX_BROKER"); ob != eventsKafka && (ob != "" || amqpURL() != "") {
			errs = append(errs, errors.New("EXTWORKER_DEMO_EVENTS=kafka publishes invoice.paid to Kafka: set EXTWORKER_OUTBOX_BROKER=kafka"))
		}
	default:
		errs = append(errs, fmt.Errorf("EXTWORKER_DEMO_EVENTS %q: want amqp or kafka", c.Broker))
	}
	if len(errs) > 0 {
		return c, extworker.ConfigError{Err: fmt.Errorf("the demo's events: %w", errors.Join(errs...))}
	}
	return c, nil
}

// on reports whether the demo's events run: always through Kafka, through RabbitMQ when
// EXTWORKER_AMQP_URL names it.
func (c eventsConfig) on() bool { return c.Broker == eventsKafka || amqpURL() != "" }

// name is the broker's name, for the demo's summary.
func (c eventsConfig) name() string {
	if c.Broker == eventsKafka {
		return "Kafka"
	}
	return "RabbitMQ"
}

// kafkaBrokers is EXTWORKER_KAFKA_BROKERS, as the worker reads it.
func kafkaBrokers() string { return os.Getenv("EXTWORKER_KAFKA_BROKERS") }

const demoShippingBPMN = `<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:camunda="http://camunda.org/schema/1.0/bpmn"
                  id="extworker-demo-shipping-definitions" targetNamespace="http://extworker.dev/demo">
  <bpmn:process id="` + demoShippingKey + `" name="extworker demo: shipping" isExecutable="true" camunda:historyTimeToLive="P1D">
    <bpmn:startEvent id="invoicePaid"/>
    <bpmn:sequenceFlow id="f1" sourceRef="invoicePaid" targetRef="shipped"/>
    <bpmn:endEvent id="shipped"/>
  </bpmn:process>
</bpmn:definitions>`

// paidEvent is the body of invoice.paid.
type paidEvent struct {
	Invoice     string `json:"invoice"`
	AmountCents int64  `json:"amountCents"`
	PaymentRef  string `json:"paymentRef"`
}

// addPaidEvent adds invoice.paid to the outbox in tx, the transaction that confirms the
// charge (idempotency.Effect.Local): published if and only if the charge is recorded.
func addPaidEvent(ctx context.Context, tx pgx.Tx, namespace, invoice string, amount int64, ref string) error {
	return outbox.Add(ctx, tx, namespace, paidEventFor(paidEvent{Invoice: invoice, AmountCents: amount, PaymentRef: ref}))
}

// paidEventFor is invoice.paid for p, as the outbox publishes it.
func paidEventFor(p paidEvent) outbox.Event {
	body, _ := json.Marshal(p) // a struct of strings and an integer
	return outbox.Event{MessageID: demoPaidType + ":" + p.Invoice, Type: demoPaidType,
		Exchange: demoExchange, RoutingKey: demoPaidType, OrderingKey: p.Invoice, CorrelationID: p.Invoice, Body: body}
}

// shippingConsumer is the inbox's configuration for invoice.paid from RabbitMQ.
func shippingConsumer(logger *slog.Logger) inbox.Config {
	return inbox.Config{Source: demoPaidEventSource, Queue: demoPaidQueue, Logger: logger,
		Bindings: []inbox.Binding{{Exchange: demoExchange, RoutingKey: demoPaidType}}}
}

// shippingKafkaConsumer is the inbox's configuration for invoice.paid from Kafka: the
// topic in place of the queue (the inbox records its messages under
// inbox.KafkaSource(demoPaidEventSource, demoPaidTopic)).
func shippingKafkaConsumer(logger *slog.Logger) inbox.Config {
	return inbox.Config{Source: demoPaidEventSource, Queue: demoPaidTopic, Logger: logger}
}

// consumeShipping registers the invoice.paid consumer on app, on the broker ec names.
func consumeShipping(app *extworker.App, ec eventsConfig) error {
	if ec.Broker == eventsKafka {
		return app.ConsumeKafka(shippingKafkaConsumer(app.Logger()), demoShippingGroup, startShipping)
	}
	return app.Consume(shippingConsumer(app.Logger()), startShipping)
}

// startShipping starts the shipping process for a paid invoice, its business key the
// invoice's id.
func startShipping(m inbox.Message) (inbox.Action, error) {
	if m.Type != demoPaidType {
		return inbox.Action{Ignore: "not an " + demoPaidType + " event: " + m.Type}, nil
	}
	var e paidEvent
	if err := json.Unmarshal(m.Body, &e); err != nil {
		return inbox.Action{}, fmt.Errorf("invoice.paid body: %w", err)
	}
	if e.Invoice == "" {
		return inbox.Action{}, fmt.Errorf("invoice.paid without an invoice")
	}
	return inbox.Action{Start: &inbox.Start{ProcessKey: demoShippingKey, BusinessKey: e.Invoice, Variables: camunda7.Variables{
		"invoiceId": camunda7.StringVar(e.Invoice), "paymentRef": camunda7.StringVar(e.PaymentRef)}}}, nil
}

// demoEvents is the relay and the consumer the demo runs in its own process.
type demoEvents struct {
	relay  *outbox.Relay
	pub    publisher
	stats  *inbox.Stats
	pool   *pgxpool.Pool
	ns     string
	broker string // its name, for the summary
	stop   func()
	// published counts the relay's publishes, for the progress line.
	published atomic.Int64
}

// countPublished is the relay's observer: it counts publishes in n.
type countPublished struct{ n *atomic.Int64 }

func (c countPublished) Published()     { c.n.Add(1) }
func (c countPublished) PublishFailed() {}

// publisher is what the demo publishes through: the relay's publisher, which the demo
// also sends its deliberate copies with.
type publisher interface {
	outbox.Publisher
	Close() error
}

// startDemoEvents runs the outbox relay and the invoice.paid consumer until stop, on the
// App's engine client and database (a pool of the consumer's own: each message in hand
// holds a connection across the engine's calls), on the broker ec names.
func startDemoEvents(ctx context.Context, app *extworker.App, ec eventsConfig) (*demoEvents, error) {
	engine := admin.New(app.Client())
	ccfg := shippingConsumer(app.Logger())
	if ec.Broker == eventsKafka {
		ccfg = shippingKafkaConsumer(app.Logger())
	}
	ccfg, err := ccfg.WithDefaults(engine) // its Concurrency sizes the pool
	if err != nil {
		return nil, err
	}
	pcfg := app.Pool().Config()
	pcfg.MaxConns, pcfg.MinConns = int32(ccfg.Concurrency), 0
	inboxPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	var (
		run      func(context.Context) error
		declared <-chan struct{} // closed once the relay may publish
		pub      publisher
		stats    *inbox.Stats
	)
	if ec.Broker == eventsKafka {
		brokers := strings.Split(kafkaBrokers(), ",")
		cons, err := inbox.NewKafkaConsumer(inboxPool, engine, startShipping, ccfg, inbox.KafkaConfig{Brokers: brokers, Group: demoShippingGroup})
		if err == nil {
			pub, err = outbox.NewKafkaPublisher(brokers)
		}
		if err != nil {
			inboxPool.Close()
			return nil, err
		}
		// A topic keeps what was published before its consumers joined: the relay need
		// not wait for them.
		ready := make(chan struct{})
		close(ready)
		run, declared, stats = cons.Run, ready, cons.Stats()
	} else {
		cons, err := inbox.NewConsumer(inboxPool, engine, amqpURL(), startShipping, ccfg)
		if err != nil {
			inboxPool.Close()
			return nil, err
		}
		// RabbitMQ routes an event only to the queues bound when it is published: the
		// relay publishes once the consumer's queue is bound.
		run, declared, stats, pub = cons.Run, cons.Declared(), cons.Stats(), outbox.NewAMQPPublisher(amqpURL())
	}
	pool, ns, logger := app.Pool(), app.Ledger().Namespace(), app.Logger()
	ev := &demoEvents{pub: pub, stats: stats, pool: pool, ns: ns, broker: ec.name()}
	ev.relay = outbox.NewRelay(pool, pub, outbox.RelayConfig{Namespace: ns, Logger: logger, PollInterval: 200 * time.Millisecond,
		Observer: countPublished{&ev.published}})
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = run(ctx); done <- struct{}{} }()
	go func() {
		select {
		case <-declared:
			_ = ev.relay.Run(ctx)
		case <-ctx.Done():
		}
		done <- struct{}{}
	}()
	ev.stop = func() {
		cancel()
		<-done
		<-done
		_ = pub.Close()
		inboxPool.Close()
	}
	return ev, nil
}

// redeliver publishes the events with these message ids a second time, as a producer
// that retried or a broker that redelivered would: the inbox must take each once.
func (ev *demoEvents) redeliver(ctx context.Context, ids []string, invoices map[string]paidEvent) error {
	for _, id := range ids {
		if err := ev.pub.Publish(ctx, paidEventFor(invoices[id])); err != nil {
			return fmt.Errorf("redeliver %s: %w", id, err)
		}
	}
	return nil
}

// report waits until every paid invoice of the run has its shipping instance and the
// redelivered events have been answered, then prints the events' summary.
func (ev *demoEvents) report(ctx context.Context, out io.Writer, c *admin.Client, run string, paid, redelivered int) error {
	st := ev.stats
	started := 0
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := c.HistoricProcessInstanceCount(ctx, url.Values{"processDefinitionKey": {demoShippingKey}, "processInstanceBusinessKeyLike": {"%" + run + "%"}})
		if err != nil {
			return err
		}
		started = n
		if (started >= paid && st.Duplicates.Load()+st.Ignored.Load() >= int64(redelivered)) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	backlog, err := outbox.ReadBacklog(ctx, ev.pool, ev.ns)
	if err != nil {
		return err
	}
	var published int
	if err := ev.pool.QueryRow(ctx, `SELECT count(*) FROM extworker_outbox WHERE namespace = $1 AND message_id LIKE $2 AND published_at IS NOT NULL`,
		ev.ns, demoPaidType+":%"+run+"%").Scan(&published); err != nil {
		return err
	}
	fmt.Fprintf(out, "events: %d invoice.paid published through the outbox to %s (%d waiting), %d deliveries consumed, %d of them sent twice on purpose: %d duplicates suppressed by the inbox, %d parked\n",
		published, ev.broker, backlog.Unpublished, st.Received.Load(), redelivered, st.Duplicates.Load()+st.Ignored.Load(), st.Parked.Load())
	fmt.Fprintf(out, "shipping: %d instances started for %d paid invoices\n", started, paid)
	if started != paid || published != paid {
		return fmt.Errorf("demo: %d invoice.paid events published and %d shipping instances started for %d paid invoices", published, started, paid)
	}
	return nil
}
