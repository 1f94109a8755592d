package idempotency_test

import (
	"testing"

	"github.com/extworker/extworker/idempotency"
	"github.com/extworker/extworker/idempotency/ledgertest"
)

// One behaviour suite (package ledgertest), run against the PostgreSQL ledger and the
// in-memory one: a handler tested on NewInMemory sees what it sees in production.

func TestConformancePostgreSQL(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T, cfg idempotency.Config) *idempotency.Ledger {
		l, _ := newLedger(t, cfg)
		return l
	})
}

// TestConformanceInMemory needs no services (make check runs it).
func TestConformanceInMemory(t *testing.T) {
	ledgertest.Run(t, func(_ *testing.T, cfg idempotency.Config) *idempotency.Ledger {
		return idempotency.NewInMemory(cfg)
	})
}
