package idempotency_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// BenchmarkDoNewIntent is the ledger's cost for one side effect: record, mark dispatched,
// confirm, with a provider that answers at once. Besides the time it reports the network
// round trips to PostgreSQL per intent (roundtrips/op) and this process's CPU time per
// intent (cpu-ns/op: user plus system, the worker's side of the cost).
func BenchmarkDoNewIntent(b *testing.B) {
	l, trips := countingLedger(b)
	p := newProvider()
	ctx := context.Background()
	trips.Store(0)
	cpu := cpuTime()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := l.Do(ctx, intent(fmt.Sprintf("B-%d", i), 100), p.effect()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(trips.Load())/float64(b.N), "roundtrips/op")
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkDoReplay is a redelivered, already confirmed intent.
func BenchmarkDoReplay(b *testing.B) {
	l, trips := countingLedger(b)
	p := newProvider()
	ctx := context.Background()
	if _, err := l.Do(ctx, intent("B-replay", 100), p.effect()); err != nil {
		b.Fatal(err)
	}
	trips.Store(0)
	cpu := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		if _, err := l.Do(ctx, intent("B-replay", 100), p.effect()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(trips.Load())/float64(b.N), "roundtrips/op")
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
}

// countingLedger is a ledger in a fresh namespace on a pool of its own whose connections
// count their writes: pgx flushes once per round trip (a pipeline is one write), so the
// count is the number of round trips. The pool's connections are opened before the count
// starts.
func countingLedger(b *testing.B) (*idempotency.Ledger, *atomic.Int64) {
	b.Helper()
	newLedger(b, idempotency.Config{}) // checks the database and migrates it once
	pc, err := pgxpool.ParseConfig(testenv.DBURL())
	if err != nil {
		b.Fatal(err)
	}
	var trips atomic.Int64
	dial := pc.ConnConfig.DialFunc
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, writes: &trips}, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if err := pool.Ping(context.Background()); err != nil {
		b.Fatal(err)
	}
	l, err := idempotency.New(pool, idempotency.Config{Namespace: testenv.Unique("ns")})
	if err != nil {
		b.Fatal(err)
	}
	return l, &trips
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// cpuTime is this process's user plus system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
