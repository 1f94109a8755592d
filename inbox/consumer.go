package inbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/extworker/extworker/internal/digest"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/extworker/extworker/internal/failpoint"
)

// Headers a consumer sets on the copies it sends to the retry and dead-letter queues.
const (
	HeaderSource  = "x-extworker-source"
	HeaderReason  = "x-extworker-reason"
	HeaderAttempt = "x-extworker-attempt"
	HeaderDigest  = "x-extworker-digest"
)

// RetryQueue and DeadLetterQueue name a queue's companions.
func RetryQueue(queue string) string      { return queue + ".retry" }
func DeadLetterQueue(queue string) string { return queue + ".dlq" }

// Run consumes until ctx ends: it connects, declares the queues, and handles deliveries,
// Concurrency at a time; after a lost connection it connects again with backoff. On
// return, the messages in hand have been handled (within HandleTimeout) or handed back
// to the broker unacknowledged.
func (c *Consumer) Run(ctx context.Context) error {
	wait := c.cfg.BackoffInitial
	for {
		connected, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if connected {
			wait = c.cfg.BackoffInitial
		}
		c.cfg.Logger.Warn("inbox: consumer lost the broker; connecting again", "queue", c.cfg.Queue, "wait", wait, "error", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		wait = min(2*wait, c.cfg.BackoffMax)
	}
}

// Declare declares the queue, its retry and dead-letter queues, and its bindings on ch.
func Declare(ch *amqp.Channel, cfg Config) error {
	if _, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("inbox: declare %s: %w", cfg.Queue, err)
	}
	if _, err := ch.QueueDeclare(RetryQueue(cfg.Queue), true, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": cfg.Queue}); err != nil {
		return fmt.Errorf("inbox: declare %s: %w", RetryQueue(cfg.Queue), err)
	}
	if _, err := ch.QueueDeclare(DeadLetterQueue(cfg.Queue), true, false, false, false, nil); err != nil {
		return fmt.Errorf("inbox: declare %s: %w", DeadLetterQueue(cfg.Queue), err)
	}
	for _, b := range cfg.Bindings {
		if b.Exchange == "" {
			continue // the default exchange routes by queue name
		}
		if err := ch.ExchangeDeclare(b.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("inbox: declare exchange %s: %w", b.Exchange, err)
		}
		if err := ch.QueueBind(cfg.Queue, b.RoutingKey, b.Exchange, false, nil); err != nil {
			return fmt.Errorf("inbox: bind %s to %s: %w", cfg.Queue, b.Exchange, err)
		}
	}
	return nil
}

// session is one connection's life. It reports whether it got as far as consuming.
func (c *Consumer) session(ctx context.Context) (bool, error) {
	conn, err := dial(ctx, c.amqpURL)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	if err := Declare(ch, c.cfg); err != nil {
		return false, err
	}
	c.declaredOnce.Do(func() { close(c.declared) })
	if err := ch.Qos(c.cfg.Concurrency, 0, false); err != nil {
		return false, err
	}
	pub, err := newConfirmer(conn)
	if err != nil {
		return false, err
	}
	deliveries, err := ch.ConsumeWithContext(ctx, c.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return false, err
	}
	sem := make(chan struct{}, c.cfg.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return true, nil
		case d, ok := <-deliveries:
			if !ok {
				return true, errors.New("the broker closed the channel")
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				c.deliver(ctx, pub, d)
			}()
		}
	}
}

// deliver handles one delivery and settles it with the broker.
func (c *Consumer) deliver(ctx context.Context, pub *confirmer, d amqp.Delivery) {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.HandleTimeout)
	defer cancel()
	// The handling continues the trace the message carries. Its copies to the retry and
	// dead-letter queues keep the headers, so a retried (or replayed) message's next
	// handling continues the same trace.
	out, err := c.Handle(deliveryContext(hctx, d), messageOf(d))
	id := logID(StoredID(d.MessageId))
	if err != nil {
		// The inbox could not record it: hand it back to come again after a pause.
		c.cfg.Logger.Warn("inbox: recording a message failed; it comes back", "message_id", id, "error", err)
		out = Handling{Disposition: Retry, Class: ClassFailed, Delay: c.backoff(int(attempt(d)) + 1), Reason: err.Error()}
	}
	reason := truncate(cleanText(out.Reason), 500)
	switch out.Disposition {
	case Retry:
		err = pub.publish(hctx, RetryQueue(c.cfg.Queue), d, amqp.Table{HeaderSource: c.cfg.Source, HeaderReason: reason,
			HeaderAttempt: attempt(d) + 1}, out.Delay)
	case Park:
		err = pub.publish(hctx, DeadLetterQueue(c.cfg.Queue), d, amqp.Table{HeaderSource: c.cfg.Source, HeaderReason: reason,
			HeaderDigest: digest.Bytes(d.Body)}, 0)
	}
	if err != nil {
		c.cfg.Logger.Warn("inbox: could not hand a message to its retry or dead-letter queue; the broker delivers it again",
			"message_id", id, "error", err)
		_ = d.Nack(false, true)
		return
	}
	if err := d.Ack(false); err != nil {
		c.cfg.Logger.Warn("inbox: acknowledging failed; the broker delivers it again and the inbox knows it", "message_id", id, "error", err)
		return
	}
	failpoint.Inject(failpoint.InboxAfterAck)
}

// messageOf is the message a delivery carries. The consumer keeps its retry chain: a
// copy from the retry queue (one with an attempt header), or a delivery the broker
// redelivers (its consumer did not settle it), is the chain's; any other is fresh.
func messageOf(d amqp.Delivery) Message {
	return Message{ID: d.MessageId, Type: d.Type, CorrelationID: d.CorrelationId, Body: d.Body,
		chained: true, fresh: attempt(d) <= 0 && !d.Redelivered}
}

// attempt is the delivery's attempt header: how many times it went through the retry
// queue (0 without one, or with one that is not a number).
func attempt(d amqp.Delivery) int32 {
	switch v := d.Headers[HeaderAttempt].(type) {
	case int32:
		return min(max(v, 0), 1<<30)
	case int64:
		return int32(min(max(v, 0), 1<<30))
	}
	return 0
}

// confirmer publishes copies of deliveries on a confirm-mode channel, one at a time.
type confirmer struct {
	mu sync.Mutex
	ch *amqp.Channel
}

func newConfirmer(conn *amqp.Connection) (*confirmer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	return &confirmer{ch: ch}, nil
}

// publish sends a copy of d to queue (through the default exchange) with extra headers,
// expiring after ttl when ttl > 0, and waits for the broker's confirm.
func (p *confirmer) publish(ctx context.Context, queue string, d amqp.Delivery, extra amqp.Table, ttl time.Duration) error {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	for k, v := range extra {
		headers[k] = v
	}
	msg := amqp.Publishing{Headers: headers, ContentType: d.ContentType, DeliveryMode: amqp.Persistent, CorrelationId: d.CorrelationId,
		MessageId: d.MessageId, Type: d.Type, Timestamp: d.Timestamp, AppId: d.AppId, Body: d.Body}
	if ttl > 0 {
		msg.Expiration = strconv.FormatInt(max(ttl.Milliseconds(), 1), 10)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, msg)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return err
	case !ok && p.ch.IsClosed():
		return fmt.Errorf("the connection to the broker was lost before it confirmed the copy for %s", queue)
	case !ok:
		return fmt.Errorf("the broker refused the copy for %s (nack)", queue)
	}
	return nil
}

func dial(ctx context.Context, raw string) (*amqp.Connection, error) {
	conn, err := amqp.DialConfig(raw, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: 10 * time.Second}
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// A deadline for the TLS and AMQP handshakes, as amqp.DefaultDial sets: a
			// broker that accepts the connection and never answers would hold the
			// consumer. The library clears it once the connection is open.
			if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
				_ = conn.Close()
				return nil, err
			}
			return conn, nil
		}})
	if err != nil {
		return nil, fmt.Errorf("inbox: connect to %s: %w", redact(raw), err)
	}
	return conn, nil
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the broker"
	}
	return u.Redacted()
}
