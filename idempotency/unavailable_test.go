package idempotency_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/failure"
	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/internal/testenv"
)

// cutProxy forwards TCP connections to the database until cut, then closes them and
// refuses new ones: the database gone from under the ledger (a failover, a network
// partition).
type cutProxy struct {
	ln    net.Listener
	to    string
	mu    sync.Mutex
	conns []net.Conn
}

func startCutProxy(t *testing.T, to string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, to: to}
	t.Cleanup(p.cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) cut() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// A ledger whose database cannot be reached defers the task: the failure keeps the
// task's retries (failure.Deferred), so a database outage longer than a handler's retry
// budget raises no incident; the task is tried again when its retry timeout ends. Before,
// such failures counted retries down, and an 8 s failover ended two of 150 instances in
// incidents.
func TestDatabaseUnreachableDefersTheTask(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second // the cut attempt's, which the next attempt waits out
	l, pool := newLedger(t, idempotency.Config{Lease: lease})
	proxied := func(t *testing.T) (*idempotency.Ledger, *cutProxy) {
		cfg, err := pgxpool.ParseConfig(pool.Config().ConnString())
		require.NoError(t, err)
		p := startCutProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, itoa(cfg.ConnConfig.Port)))
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(p.ln.Addr().(*net.TCPAddr).Port)
		cfg.ConnConfig.Fallbacks = nil // they name the database directly
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		pp, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pp.Close)
		pl, err := idempotency.New(pp, idempotency.Config{Namespace: l.Namespace(), Lease: lease})
		require.NoError(t, err)
		return pl, p
	}
	deferred := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		c := failure.Classify(err)
		assert.Equal(t, failure.KindRetryable, c.Kind, "%v", err)
		assert.True(t, c.KeepRetries, "the task's retries are kept while the database is away: %v", err)
	}

	t.Run("before the claim", func(t *testing.T) {
		pl, p := proxied(t)
		p.cut()
		_, err := pl.Do(testenv.Context(t, time.Minute), intent(testenv.Unique("inv"), 100), newProvider().effect())
		deferred(t, err)
	})
	t.Run("after the provider answered", func(t *testing.T) {
		pl, p := proxied(t)
		prov := newProvider()
		eff := prov.effect()
		dispatch := eff.Dispatch
		eff.Dispatch = func(ctx context.Context, key string) (idempotency.Result, error) {
			res, err := dispatch(ctx, key)
			p.cut() // the answer cannot be recorded
			return res, err
		}
		in := intent(testenv.Unique("inv"), 100)
		_, err := pl.Do(testenv.Context(t, time.Minute), in, eff)
		deferred(t, err)
		// The database back (the original pool): once the cut attempt's lease has ended,
		// the next attempt settles from the provider, without a second charge.
		var rec idempotency.Receipt
		testenv.Eventually(t, 30*time.Second, "the next attempt settles", func() (bool, error) {
			rec, err = l.Do(testenv.Context(t, time.Minute), in, prov.effect())
			if errors.Is(err, idempotency.ErrInProgress) {
				return false, nil
			}
			return true, err
		})
		assert.NotEmpty(t, rec.ProviderRef)
		_, effects := prov.stats()
		assert.Equal(t, 1, effects, "charged once")
	})
	t.Run("a refusal of the database is not an outage", func(t *testing.T) {
		_, err := l.Do(testenv.Context(t, time.Minute), idempotency.Intent{Scope: "payment.collect", Key: "bad\x00key", Request: invoice{"x", 1}}, newProvider().effect())
		require.Error(t, err)
		assert.False(t, failure.Classify(err).KeepRetries, "%v", err)
		assert.False(t, errors.Is(err, context.DeadlineExceeded))
	})
}

func itoa(n uint16) string { return (&net.TCPAddr{Port: int(n)}).String()[1:] }
