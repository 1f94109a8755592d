package idempotency

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/extworker/extworker/failure"
)

// storeFailed marks the error of a ledger statement that failed. When the database could
// not be reached it is failure.Deferred: the task's retries are kept, since an outage
// (a failover, a restart, a partition) ends by itself, and one longer than a handler's
// retry budget must not raise incidents; the task is tried again after its retry
// timeout. Any other error is failure.Retryable.
func storeFailed(err error) error {
	if unreachable(err) {
		return failure.Deferred(err, 0)
	}
	return failure.Retryable(err)
}

// unreachable reports whether err says the database could not be reached or takes no
// writes for now: connecting failed, the connection broke or timed out, the server is
// shutting down or starting up, or it is a standby not yet promoted. An error the
// database answered about the statement itself is not.
func unreachable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03", // admin_shutdown, crash_shutdown, cannot_connect_now
			"25006": // read_only_sql_transaction: a standby
			return true
		}
		return strings.HasPrefix(pe.Code, "08") // connection exceptions
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed)
}
