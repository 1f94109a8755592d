package testenv

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultAMQPURL is the broker services/rabbit-up.sh starts (make up): its own user and
// virtual host.
const DefaultAMQPURL = "amqp://extworker:extworker@127.0.0.1:5672/extworker"

// AMQPURL is EXTWORKER_TEST_AMQP_URL or the local broker.
func AMQPURL() string { return env("EXTWORKER_TEST_AMQP_URL", DefaultAMQPURL) }

// AMQP returns a connection to the broker under test (closed at cleanup), or fails (in
// CI) or skips when it is not there.
func AMQP(t testing.TB) *amqp.Connection {
	t.Helper()
	needServices(t, "RabbitMQ at "+AMQPURL())
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		unavailable(t, "RabbitMQ at "+AMQPURL(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Queue declares a queue of its own for the test (exclusive to its connection, deleted
// with it) and returns its name, which the default exchange routes to.
func Queue(t testing.TB, conn *amqp.Connection) (string, *amqp.Channel) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	q, err := ch.QueueDeclare(Unique("q"), false, true, true, false, nil)
	if err != nil {
		t.Fatalf("declare queue: %v", err)
	}
	return q.Name, ch
}
