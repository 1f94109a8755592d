package testenv

import (
	"os/exec"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A durable queue and a persistent message the broker confirmed survive a SIGKILL of the
// node and its restart.
func TestBrokerKeepsConfirmedMessagesAcrossKill(t *testing.T) {
	t.Parallel()
	b := StartBroker(t)
	ctx := Context(t, time.Minute)
	queue := Unique("durable")

	conn, err := amqp.Dial(b.URL())
	if err != nil {
		t.Fatalf("dial %s: %v", b.URL(), err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatalf("declare: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
		amqp.Publishing{MessageId: "m-1", DeliveryMode: amqp.Persistent, Body: []byte("kept")})
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if acked, err := dc.WaitContext(ctx); err != nil || !acked {
		t.Fatalf("confirm: acked %v, %v", acked, err)
	}
	// The queue's record is written to the node's metadata store (Mnesia) lazily: a
	// SIGKILL right after the declare can lose the queue, message and all (about one run
	// in six here). Sync the store's log first, so the kill tests what the test names.
	ctl := exec.CommandContext(ctx, b.n.ctl, "-q", "-n", b.n.node, "eval", "mnesia:sync_log().")
	ctl.Dir, ctl.Env = b.n.dir, b.n.env
	if out, err := ctl.CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl eval mnesia:sync_log(): %v\n%s", err, out)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	b.Kill(t)
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the client never saw its connection go")
	}
	if c, err := amqp.Dial(b.URL()); err == nil {
		c.Close()
		t.Fatal("the killed broker still accepts AMQP connections")
	}
	b.Restart(t)

	conn, err = amqp.Dial(b.URL())
	if err != nil {
		t.Fatalf("dial after the restart: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	d, ok, err := ch.Get(queue, true)
	if err != nil || !ok {
		t.Fatalf("get from %s after the restart: ok %v, %v", queue, ok, err)
	}
	if d.MessageId != "m-1" || string(d.Body) != "kept" || d.DeliveryMode != amqp.Persistent {
		t.Fatalf("got message %q %q (delivery mode %d), want m-1 \"kept\" persistent", d.MessageId, d.Body, d.DeliveryMode)
	}
}
