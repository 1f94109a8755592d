package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/internal/testenv"
	"github.com/extworker/extworker/outbox"
)

// The order in which events of one ordering key are published is the order in which
// their Add calls ran, even across transactions that commit the other way round.
// Transaction A adds K-1; transaction B then adds K-2 and tries to commit before A does.
// The relay used to publish K-2 as soon as B committed (it cannot see A's uncommitted
// K-1), then K-1: commit order. Now B's Add waits for A to end (A holds the key), so B
// cannot commit first, and a relay running meanwhile publishes nothing of the key; once A
// commits, B goes on, and the consumer receives K-1, then K-2. If A rolls back instead,
// B's event is published alone.
func TestOrderPerKeyIsAddOrderAcrossTransactions(t *testing.T) {
	t.Parallel()
	for _, commitA := range []bool{true, false} {
		name := "A commits"
		if !commitA {
			name = "A rolls back"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := testenv.Context(t, time.Minute)
			relay := outbox.NewRelay(e.pool, e.pub, outbox.RelayConfig{Namespace: e.ns})

			txA, err := e.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = txA.Rollback(ctx) }()
			require.NoError(t, outbox.Add(ctx, txA, e.ns, e.event("K-1", "K")), "A adds first")

			txB, err := e.pool.Begin(ctx)
			require.NoError(t, err)
			pidB := txB.Conn().PgConn().PID()
			bDone := make(chan error, 1)
			go func() { bDone <- addAndCommit(ctx, txB, e.ns, e.event("K-2", "K")) }()

			// B either committed already (the defect) or waits for A's transaction.
			var bErr error
			bEnded := false
			testenv.Eventually(t, 20*time.Second, "B to commit, or to wait for A", func() (bool, error) {
				select {
				case bErr = <-bDone:
					bEnded = true
					return true, nil
				default:
				}
				var waiting bool
				err := e.pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pidB).Scan(&waiting)
				return waiting, err
			})
			// B's event id is drawn only once B holds the key: after any id drawn now.
			var drawnMeanwhile int64
			require.NoError(t, e.pool.QueryRow(ctx, `SELECT nextval('extworker_outbox_id_seq')`).Scan(&drawnMeanwhile))
			// A relay pass while A is open publishes whatever is committed by now.
			_, err = relay.PublishPending(ctx)
			require.NoError(t, err)

			if commitA {
				require.NoError(t, txA.Commit(ctx))
			} else {
				require.NoError(t, txA.Rollback(ctx))
			}
			if !bEnded {
				select {
				case bErr = <-bDone:
				case <-ctx.Done():
					t.Fatal("B's transaction never ended")
				}
			}
			require.NoError(t, bErr)
			var idB int64
			require.NoError(t, e.pool.QueryRow(ctx, `SELECT id FROM extworker_outbox WHERE namespace = $1 AND message_id = 'K-2'`, e.ns).Scan(&idB))
			assert.Greater(t, idB, drawnMeanwhile, "B's id drawn once it held the key, not while it waited")

			want := []string{"K-1", "K-2"}
			if !commitA {
				want = []string{"K-2"}
			}
			testenv.Eventually(t, 20*time.Second, "every event published", func() (bool, error) {
				_, err := relay.PublishPending(ctx)
				b, berr := relay.Backlog(ctx)
				return err == nil && berr == nil && b.Unpublished == 0, err
			})
			var got []string
			for _, d := range e.received(t, len(want)) {
				got = append(got, d.MessageId)
			}
			assert.Equal(t, want, got, "published in the order the events were added")
		})
	}
}

// addAndCommit adds ev in tx and commits it.
func addAndCommit(ctx context.Context, tx pgx.Tx, ns string, ev outbox.Event) error {
	if err := outbox.Add(ctx, tx, ns, ev); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return tx.Commit(ctx)
}
