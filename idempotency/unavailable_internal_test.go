package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
)

func TestUnreachable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "25006"}, true}, // a standby, not yet promoted
		{&pgconn.PgError{Code: "57P01"}, true}, // the server shutting down
		{&pgconn.PgError{Code: "57P03"}, true}, // starting up
		{&pgconn.PgError{Code: "08006"}, true}, // the connection failed
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "22021"}, false}, // bytes the database refuses: not an outage
		{fmt.Errorf("confirm: %w", io.ErrUnexpectedEOF), true},
		{context.DeadlineExceeded, true},
		{context.Canceled, false},
		{errors.New("idempotency: intent mismatch"), false},
	} {
		assert.Equal(t, c.want, unreachable(c.err), "%v", c.err)
	}
}
