package callback

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/extworker/extworker/inbox"
)

// keep holds or lets go of a callback's body after the inbox handled it as h, the
// taken-th time Run took it (0: a delivery): a row that settled lets go of it, a row that
// waits holds it until nextDue, and a conflicting copy leaves the held body (the first
// one's) as it is.
func (s *Server) keep(ctx context.Context, src *source, m inbox.Message, h inbox.Handling, taken int) error {
	name := src.h.Config().Source
	switch {
	case h.Class == inbox.ClassConflict:
		return nil
	case settled(h.State):
		return s.release(ctx, name, m.ID)
	}
	delay := h.Delay
	if h.Class == inbox.ClassEarly {
		// The inbox's delay grows with its row's attempts, which every copy the provider
		// sends adds to (50 copies at once put the next try a minute away): an early
		// callback's own backoff counts the times Run took it.
		delay = 0
	}
	return s.hold(ctx, name, m, nextDue(delay, taken, src.h.Config()), taken == 0)
}

// nextDue is how long a held callback waits before Run takes it again, after the
// taken-th time: the inbox's delay (an in-flight window to wait out, say), or the
// backoff for the times Run took it (doubling from cfg.BackoffInitial up to
// cfg.BackoffMax), whichever is longer.
func nextDue(delay time.Duration, taken int, cfg inbox.Config) time.Duration {
	backoff := cfg.BackoffInitial
	for i := 1; i < taken && backoff < cfg.BackoffMax; i++ {
		backoff *= 2
	}
	return max(delay, min(backoff, cfg.BackoffMax))
}

// hold records the body of a callback whose row waits, due again after delay: only while
// the row still waits (a Run that settled it meanwhile has let go of it). A copy the
// provider sent (delivery) never puts a held callback's next try later than it was.
func (s *Server) hold(ctx context.Context, name string, m inbox.Message, delay time.Duration, delivery bool) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO extworker_inbox_callbacks (source, message_id, type, body, due_at)
		SELECT $1, $2, $3, $4, now() + $5::bigint * interval '1 microsecond'
		WHERE EXISTS (SELECT FROM extworker_inbox WHERE source = $1 AND message_id = $6
			AND state NOT IN ('processed', 'ignored_duplicate', 'failed_final'))
		ON CONFLICT (source, message_id) DO UPDATE SET due_at = CASE WHEN $7
			THEN least(extworker_inbox_callbacks.due_at, EXCLUDED.due_at) ELSE EXCLUDED.due_at END`,
		name, m.ID, m.Type, m.Body, delay.Microseconds(), inbox.StoredID(m.ID), delivery)
	if err != nil {
		return fmt.Errorf("callback: hold %s: %w", inbox.StoredID(m.ID), err)
	}
	return nil
}

// release deletes a held body: its row has settled. A callback whose id PostgreSQL
// cannot store as text was parked at once and never held: there is nothing to delete (and
// the raw id in a query would be refused).
func (s *Server) release(ctx context.Context, name, id string) error {
	if !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM extworker_inbox_callbacks WHERE source = $1 AND message_id = $2`, name, id); err != nil {
		return fmt.Errorf("callback: release %s: %w", inbox.StoredID(id), err)
	}
	return nil
}

// Run handles the held callbacks again as they fall due, until ctx ends: an early one is
// correlated once its process instance waits (or parked by the inbox once its
// EarlyWindow has passed), and its body deleted as soon as its row settles. Any number
// of processes may run it on one database: each takes due callbacks with FOR UPDATE SKIP
// LOCKED and a lease (Config.Lease), so a callback is handled by one at a time, and
// again by another should its process die.
func (s *Server) Run(ctx context.Context) error {
	for {
		n, err := s.RunDue(ctx)
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("callback: held callbacks not handled; trying again", "error", err)
		}
		wait := s.cfg.PollInterval
		if err == nil && n == s.cfg.Concurrency {
			wait = 0 // more may be due
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// held is one held callback, taken for handling the taken-th time.
type held struct {
	src   *source
	m     inbox.Message
	taken int
}

// RunDue handles once the held callbacks that are due (up to Config.Concurrency, at
// once), and returns how many it took. Run calls it in a loop.
func (s *Server) RunDue(ctx context.Context) (int, error) {
	due, err := s.takeDue(ctx)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	for _, d := range due {
		wg.Go(func() { s.rehandle(ctx, d) })
	}
	wg.Wait()
	return len(due), nil
}

// takeDue leases the due held callbacks of this server's sources.
func (s *Server) takeDue(ctx context.Context) ([]held, error) {
	names := make([]string, 0, len(s.sources))
	for name := range s.sources {
		names = append(names, name)
	}
	rows, err := s.pool.Query(ctx, `UPDATE extworker_inbox_callbacks c SET due_at = now() + $3::bigint * interval '1 microsecond',
			attempts = c.attempts + 1
		FROM (SELECT source, message_id FROM extworker_inbox_callbacks WHERE source = ANY($1) AND due_at <= now()
			ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED) d
		WHERE c.source = d.source AND c.message_id = d.message_id
		RETURNING c.source, c.message_id, c.type, c.body, c.attempts`, names, s.cfg.Concurrency, s.cfg.Lease.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("callback: take held callbacks: %w", err)
	}
	defer rows.Close()
	var out []held
	for rows.Next() {
		var name string
		var d held
		if err := rows.Scan(&name, &d.m.ID, &d.m.Type, &d.m.Body, &d.taken); err != nil {
			return nil, fmt.Errorf("callback: take held callbacks: %w", err)
		}
		d.src = s.sources[name]
		out = append(out, d)
	}
	return out, rows.Err()
}

// rehandle hands a held callback to its inbox again and holds or lets go of it as the
// row says. A failure leaves it leased: it is due again when the lease ends.
func (s *Server) rehandle(ctx context.Context, d held) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.src.h.Config().HandleTimeout)
	defer cancel()
	h, err := d.src.h.Handle(ctx, d.m)
	if err == nil {
		err = s.keep(ctx, d.src, d.m, h, d.taken)
	}
	if err != nil {
		s.cfg.Logger.Warn("callback: held callback not handled; due again after the lease", "source", d.src.h.Config().Source,
			"message_id", inbox.StoredID(d.m.ID), "lease", s.cfg.Lease, "error", err)
	}
}
