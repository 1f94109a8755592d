package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The pair streams (synchronously when asked), and a pool on its multi-host URL, opened
// before the failover, writes to the promoted standby after the primary's SIGKILL with
// no change of configuration and no new pool: its broken connections are dropped and new
// ones skip the dead host. A row the primary committed while the standby lagged
// (PauseReplication) is not on the promoted standby: asynchronous replication had
// acknowledged it, synchronous replication had not.
func TestPGPairFailover(t *testing.T) {
	for _, sync := range []bool{false, true} {
		name := "async"
		if sync {
			name = "sync"
		}
		t.Run(name, func(t *testing.T) {
			p := StartPGPair(t, sync)
			ctx := Context(t, 3*time.Minute)
			state, syncState, err := p.Replication(ctx)
			require.NoError(t, err)
			assert.Equal(t, "streaming", state)
			if sync {
				assert.Equal(t, "sync", syncState)
			} else {
				assert.Equal(t, "async", syncState)
			}

			pool, err := pgxpool.New(ctx, p.URL())
			require.NoError(t, err)
			defer pool.Close()
			require.NoError(t, pool.Ping(ctx))
			var port int
			require.NoError(t, pool.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port))
			assert.Equal(t, PGPairPrimaryPort, port, "the multi-host URL reaches the primary first")
			_, err = pool.Exec(ctx, "CREATE TABLE t (n int PRIMARY KEY)")
			require.NoError(t, err)
			_, err = pool.Exec(ctx, "INSERT INTO t VALUES (1)")
			require.NoError(t, err)

			standby, err := pgxpool.New(ctx, p.StandbyURL())
			require.NoError(t, err)
			defer standby.Close()
			Eventually(t, 30*time.Second, "the row on the standby", func() (bool, error) {
				var n int
				err := standby.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n)
				return n == 1, err
			})
			_, err = standby.Exec(ctx, "INSERT INTO t VALUES (2)")
			assert.Error(t, err, "the standby refuses writes before its promotion")

			// Replication lag on demand: what the primary commits now never reaches the
			// standby. Asynchronous replication acknowledges the commit all the same;
			// synchronous replication makes it wait for the standby, which never answers.
			p.PauseReplication()
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = pool.Exec(wctx, "INSERT INTO t VALUES (5)")
			cancel()
			if sync {
				assert.ErrorIs(t, err, context.DeadlineExceeded, "a synchronous commit waits for the standby")
			} else {
				assert.NoError(t, err, "an asynchronous commit does not wait for the standby")
			}

			p.KillPrimary()
			killed := time.Now()
			_, err = pool.Exec(ctx, "INSERT INTO t VALUES (3)")
			assert.Error(t, err, "no server accepts writes while the primary is down and the standby not promoted")
			took := p.Promote()
			var first error
			Eventually(t, 30*time.Second, "a write through the pool opened before the failover", func() (bool, error) {
				_, err := pool.Exec(ctx, "INSERT INTO t VALUES (4) ON CONFLICT DO NOTHING")
				if first == nil && err != nil {
					first = err
				}
				return err == nil, err
			})
			t.Logf("kill -> first write on the new primary: %v (promotion %v); first error after promotion: %v",
				time.Since(killed).Round(time.Millisecond), took.Round(time.Millisecond), first)
			require.NoError(t, pool.QueryRow(ctx, "SELECT inet_server_port()").Scan(&port))
			assert.Equal(t, PGPairStandbyPort, port, "the pool now reaches the promoted standby")
			var n int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM t WHERE n IN (1, 4)").Scan(&n))
			assert.Equal(t, 2, n, "the replicated row and the new one")
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM t WHERE n = 5").Scan(&n))
			assert.Zero(t, n, "the row committed while the standby lagged is gone with the old primary")
			assert.False(t, errors.Is(first, context.DeadlineExceeded))
		})
	}
}

// A host that accepts connections and never answers (a machine gone silent, packets
// dropped) is the first in a multi-host URL: without connect_timeout, pgx spends the
// whole of the caller's deadline on it and never tries the next host; with
// connect_timeout (per host), it moves on to the next host, which accepts writes.
func TestPGPairURLSilentFirstHost(t *testing.T) {
	p := StartPGPair(t, false)
	ctx := Context(t, time.Minute)
	primary := strings.TrimPrefix(p.PrimaryURL(), "postgres://extworker:extworker@")
	primary = primary[:strings.IndexByte(primary, '/')]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // accepted, never answered
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	}()
	url := fmt.Sprintf("postgres://extworker:extworker@%s,%s/extworker?target_session_attrs=read-write", ln.Addr(), primary)
	write := func(url string) error {
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		defer pool.Close()
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err = pool.Exec(wctx, "SELECT 1")
		return err
	}
	assert.Error(t, write(url), "without connect_timeout the silent host takes the whole deadline")
	began := time.Now()
	assert.NoError(t, write(url+"&connect_timeout=1"), "with connect_timeout the next host is tried")
	t.Logf("with connect_timeout=1: connected through the second host in %v", time.Since(began).Round(time.Millisecond))
}
