package inbox

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// HandleDelivery is what Run does with a delivery, without the broker: the message and
// the trace context it carries, handled (for the fuzz targets).
func (c *Consumer) HandleDelivery(ctx context.Context, d amqp.Delivery) (Handling, error) {
	return c.Handle(deliveryContext(ctx, d), messageOf(d))
}
