package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The PostgreSQL server is shared: other engineers' suites restart it (the soak harness
// does, on purpose) or end sessions while this benchmark runs for most of an hour. An
// error of the connection rather than of the operation is waited out and the operation
// run again, and the report counts how often that happened, instead of a restart
// throwing away a seeding of ten million rows.

// interruption reports whether err is the connection's or the server's going away, not
// the operation's own failure.
func interruption(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "57") || strings.HasPrefix(pe.Code, "08")
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"conn closed", "failed to connect", "connection reset", "broken pipe", "unexpected EOF", "server closed the connection"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// waitForServer waits until pool reaches the server again (at most 5 minutes).
func waitForServer(ctx context.Context, pool *pgxpool.Pool) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := pool.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("PostgreSQL did not come back: %w", err)
		}
		time.Sleep(time.Second)
	}
}

// retrying runs f until it succeeds, fails on its own, or has been interrupted 10 times,
// waiting for the server after each interruption; interrupted counts them.
func retrying(ctx context.Context, pool *pgxpool.Pool, what string, interrupted *int, f func() error) error {
	for tries := 0; ; tries++ {
		err := f()
		if !interruption(err) || tries == 10 {
			return err
		}
		*interrupted++
		progress("%s interrupted (%v); waiting for PostgreSQL and running it again", what, err)
		if werr := waitForServer(ctx, pool); werr != nil {
			return werr
		}
	}
}
