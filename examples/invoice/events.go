package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/camunda7/admin"
	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/outbox"
)

// The demo's events: a paid invoice announces itself with an invoice.paid event, added
// through the outbox in the transaction that confirms the charge in the ledger; the
// shipping process is started from it through the inbox, once per invoice, whatever the
// broker or the producer delivers twice.
const (
	demoExchange        = "extworker.demo"
	demoPaidType        = "invoice.paid"
	demoPaidQueue       = "extworker-demo.invoice-paid"
	demoShippingKey     = "extworker-demo-shipping"
	demoPaidEventSource = "extworker-demo.billing"
)

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

// shippingConsumer is the inbox's configuration for invoice.paid.
func shippingConsumer(logger *slog.Logger) inbox.Config {
	return inbox.Config{Source: demoPaidEventSource, Queue: demoPaidQueue, Logger: logger,
		Bindings: []inbox.Binding{{Exchange: demoExchange, RoutingKey: demoPaidType}}}
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
	relay    *outbox.Relay
	pub      *outbox.AMQPPublisher
	consumer *inbox.Consumer
	pool     *pgxpool.Pool
	ns       string
	stop     func()
}

// startDemoEvents runs the outbox relay and the invoice.paid consumer until stop, on the
// App's engine client and database (a pool of the consumer's own: each message in hand
// holds a connection across the engine's calls).
func startDemoEvents(ctx context.Context, app *extworker.App) (*demoEvents, error) {
	engine := admin.New(app.Client())
	ccfg, err := shippingConsumer(app.Logger()).WithDefaults(engine) // its Concurrency sizes the pool
	if err != nil {
		return nil, err
	}
	pcfg := app.Pool().Config()
	pcfg.MaxConns, pcfg.MinConns = int32(ccfg.Concurrency), 0
	inboxPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	cons, err := inbox.NewConsumer(inboxPool, engine, amqpURL(), startShipping, ccfg)
	if err != nil {
		inboxPool.Close()
		return nil, err
	}
	pool, ns, logger := app.Pool(), app.Ledger().Namespace(), app.Logger()
	pub := outbox.NewAMQPPublisher(amqpURL())
	ev := &demoEvents{relay: outbox.NewRelay(pool, pub, outbox.RelayConfig{Namespace: ns, Logger: logger, PollInterval: 200 * time.Millisecond}),
		pub: pub, consumer: cons, pool: pool, ns: ns}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = cons.Run(ctx); done <- struct{}{} }()
	go func() {
		// The relay publishes once the consumer's queue is bound: RabbitMQ routes an
		// event only to the queues bound when it is published.
		select {
		case <-cons.Declared():
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
	st := ev.consumer.Stats()
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
	fmt.Fprintf(out, "events: %d invoice.paid published through the outbox (%d waiting), %d deliveries consumed, %d of them sent twice on purpose: %d duplicates suppressed by the inbox, %d parked\n",
		published, backlog.Unpublished, st.Received.Load(), redelivered, st.Duplicates.Load()+st.Ignored.Load(), st.Parked.Load())
	fmt.Fprintf(out, "shipping: %d instances started for %d paid invoices\n", started, paid)
	if started != paid || published != paid {
		return fmt.Errorf("demo: %d invoice.paid events published and %d shipping instances started for %d paid invoices", published, started, paid)
	}
	return nil
}
