package inbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/inbox"
	"github.com/extworker/extworker/internal/testenv"
)

// TestReadParked: a message the consumer cannot read is parked and counted, with its age;
// copies of its id with another body count as conflicts, a message retried later as
// retrying; another source's counts are its own.
func TestReadParked(t *testing.T) {
	e := newEnv(t)
	c := e.consumer(t, inbox.Config{BackoffInitial: 100 * time.Millisecond})
	ctx := testenv.Context(t, 30*time.Second)
	read := func(source string) inbox.Parked {
		t.Helper()
		p, err := inbox.ReadParked(ctx, e.pool, source)
		require.NoError(t, err)
		return p
	}
	assert.Equal(t, inbox.Parked{}, read(e.source), "nothing parked yet")

	out, err := c.Handle(ctx, inbox.Message{ID: "bad-1", Body: []byte("not json")})
	require.NoError(t, err)
	require.Equal(t, inbox.Park, out.Disposition)
	require.Equal(t, inbox.StateFailedFinal, out.State)
	time.Sleep(50 * time.Millisecond)
	p := read(e.source)
	assert.Equal(t, 1, p.Messages)
	assert.Equal(t, 0, p.Conflicts)
	assert.Equal(t, 0, p.Retrying)
	assert.GreaterOrEqual(t, p.OldestAge, 50*time.Millisecond)
	assert.Less(t, p.OldestAge, time.Minute)

	// A redelivery of the parked message is a duplicate: still one parked message.
	out, err = c.Handle(ctx, inbox.Message{ID: "bad-1", Body: []byte("not json")})
	require.NoError(t, err)
	require.Equal(t, inbox.ClassDuplicate, out.Class)
	// Its id with another body, delivered twice: two conflicting copies, parked.
	for range 2 {
		out, err = c.Handle(ctx, inbox.Message{ID: "bad-1", Body: []byte("not json either")})
		require.NoError(t, err)
		require.Equal(t, inbox.ClassConflict, out.Class)
		require.Equal(t, inbox.Park, out.Disposition)
	}
	// A payment nothing waits for yet: retried, not parked.
	out, err = c.Handle(ctx, msg("early-1", payload{Do: "correlate", BusinessKey: testenv.Unique("INV")}))
	require.NoError(t, err)
	require.Equal(t, inbox.Retry, out.Disposition)

	p = read(e.source)
	assert.Equal(t, 1, p.Messages)
	assert.Equal(t, 2, p.Conflicts)
	assert.Equal(t, 1, p.Retrying)
	assert.GreaterOrEqual(t, p.OldestAge, 50*time.Millisecond)

	st := c.Stats()
	assert.Equal(t, int64(5), st.Received.Load())
	assert.Equal(t, int64(3), st.Parked.Load(), "the unreadable message and its two conflicting copies")
	assert.Equal(t, int64(2), st.Conflicts.Load())
	assert.Equal(t, int64(1), st.Duplicates.Load())
	assert.Equal(t, int64(1), st.Retried.Load())

	assert.Equal(t, inbox.Parked{}, read(testenv.Unique("src")), "another source has nothing parked")
	all := read("")
	assert.GreaterOrEqual(t, all.Messages, p.Messages, "all sources")
	assert.GreaterOrEqual(t, all.Conflicts, p.Conflicts)
	assert.GreaterOrEqual(t, all.Retrying, p.Retrying)
	assert.GreaterOrEqual(t, all.OldestAge, p.OldestAge)
}
