package outbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
)

// AMQPPublisher publishes to RabbitMQ (AMQP 0-9-1) with publisher confirms: Publish
// returns once the broker has confirmed the message, persistent and mandatory (a message
// no queue would receive is ErrUnroutable). It connects on first use and again after the
// connection or channel fails. It is safe for concurrent use; publishes go one at a time.
type AMQPPublisher struct {
	url string

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

// NewAMQPPublisher returns a publisher for the broker at url
// (amqp://user:password@host:5672/vhost, or amqps:// for TLS, verified).
func NewAMQPPublisher(url string) *AMQPPublisher { return &AMQPPublisher{url: url} }

// Publish sends e and waits for the broker's confirm. The message carries the W3C trace
// context of ctx's span, if any, in the traceparent and tracestate headers (with the
// global propagator: none while traces are off).
func (p *AMQPPublisher) Publish(ctx context.Context, e Event) error {
	var headers amqp.Table
	if trace.SpanContextFromContext(ctx).IsValid() {
		headers = amqp.Table{}
		injectTraceContext(ctx, headers)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, err := p.channel(ctx)
	if err != nil {
		return err
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, e.Exchange, e.RoutingKey, true, false, amqp.Publishing{
		MessageId: e.MessageID, Type: e.Type, CorrelationId: e.CorrelationID, ContentType: "application/json",
		DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Headers: headers, Body: e.Body,
	})
	if err != nil {
		p.reset()
		return fmt.Errorf("outbox: publish %s: %w", e.MessageID, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		p.reset() // the confirm may still come on this channel: a fresh one next time
		return fmt.Errorf("outbox: publish %s: waiting for the broker's confirm: %w", e.MessageID, err)
	}
	if !acked {
		if ch.IsClosed() {
			// The channel went down before the confirm came (the library then settles every
			// pending confirm as a nack): the broker may well have the message, and the
			// next publish repeats it, with the same message id.
			p.reset()
			return fmt.Errorf("outbox: publish %s: the connection to the broker was lost before its confirm", e.MessageID)
		}
		return fmt.Errorf("outbox: publish %s: the broker refused it (nack)", e.MessageID)
	}
	// A mandatory message the broker could not route comes back before its confirm.
	for {
		select {
		case r := <-p.returns:
			if r.MessageId == e.MessageID {
				return fmt.Errorf("%w: %s to exchange %q with routing key %q: %s", ErrUnroutable, e.MessageID, e.Exchange, e.RoutingKey, r.ReplyText)
			}
			continue
		default:
		}
		return nil
	}
}

// channel returns the confirm-mode channel, connecting first if needed.
func (p *AMQPPublisher) channel(ctx context.Context) (*amqp.Channel, error) {
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	p.reset()
	conn, err := amqp.DialConfig(p.url, amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: 10 * time.Second}
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// As amqp.DefaultDial does: a deadline for the TLS and AMQP handshakes, which
			// nothing else bounds (heartbeats start after them): a broker that accepts
			// the connection and never answers would hold Publish past its context. The
			// library clears it once the connection is open.
			deadline := time.Now().Add(10 * time.Second)
			if cd, ok := ctx.Deadline(); ok && cd.Before(deadline) {
				deadline = cd
			}
			if err := conn.SetDeadline(deadline); err != nil {
				_ = conn.Close()
				return nil, err
			}
			return conn, nil
		}})
	if err != nil {
		return nil, fmt.Errorf("outbox: connect to %s: %w", redact(p.url), err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("outbox: open a confirm channel on %s: %w", redact(p.url), err)
	}
	p.conn, p.ch = conn, ch
	p.returns = ch.NotifyReturn(make(chan amqp.Return, 16))
	return ch, nil
}

// reset drops the connection, for the next publish to open a new one.
func (p *AMQPPublisher) reset() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.ch, p.returns = nil, nil, nil
}

// messagingSystem names the broker on the relay's spans (messaging.system).
func (p *AMQPPublisher) messagingSystem() string { return "rabbitmq" }

// Close closes the connection.
func (p *AMQPPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	err := p.conn.Close()
	p.conn, p.ch, p.returns = nil, nil, nil
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}

// redact hides the password of a broker URL.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the broker"
	}
	return u.Redacted()
}
