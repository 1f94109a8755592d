// Package kafkarec holds what the outbox, the inbox and their tests do alike with Kafka
// records: write one and wait for its acknowledgement within a context, and read a
// header.
package kafkarec

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Produce writes r and waits for the broker's acknowledgement, or for ctx to end: the
// idempotent producer does not give up on a record it has sent until it learns what
// became of it (the broker may have written it), so ProduceSync would wait out a broker's
// outage whatever ctx says. A record given up on here may still be written, ahead of
// anything later on its partition.
func Produce(ctx context.Context, cl *kgo.Client, r *kgo.Record) error {
	done := make(chan error, 1)
	cl.Produce(ctx, r, func(_ *kgo.Record, err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Header is the value of r's last header named key ("" without one).
func Header(r *kgo.Record, key string) string {
	v := ""
	for _, h := range r.Headers {
		if h.Key == key {
			v = string(h.Value)
		}
	}
	return v
}
