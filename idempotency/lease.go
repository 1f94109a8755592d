package idempotency

import (
	"errors"
	"fmt"
	"time"
)

// ErrLeaseTooShort is an effect whose timeout (Effect.Timeout) the ledger's lease
// (Config.Lease, EXTWORKER_LEDGER_LEASE) cannot leave whole: a configuration to fix,
// never retried.
var ErrLeaseTooShort = errors.New("idempotency: the ledger's lease is too short for the effect's timeout")

// CheckLease returns an error matching ErrLeaseTooShort unless lease is longer than
// timeout plus DispatchMargin(lease), or nil for a timeout of 0 (not known). The ledger
// ends a provider call DispatchMargin before the attempt's lease ends, and another worker
// may take the intent over once the lease has ended: a lease that does not leave a call
// its whole timeout cuts calls off while the provider may still be working on them, and
// lets another worker take over a dispatch in progress. Do checks each effect with it; a
// program may check its effects' timeouts at start too.
func CheckLease(lease, timeout time.Duration) error {
	if timeout <= 0 {
		return nil
	}
	if cut := DispatchMargin(lease); lease <= timeout+cut {
		return fmt.Errorf("%w: the lease (EXTWORKER_LEDGER_LEASE, Config.Lease) %v must be longer than the effect's timeout "+
			"(Effect.Timeout, httpeffect.Spec.Timeout) %v plus %v: the ledger ends a provider call a tenth of the lease, "+
			"at most 5s, before the lease ends, and a shorter lease cuts calls off before their timeout and lets another "+
			"worker take over a dispatch in progress", ErrLeaseTooShort, lease, timeout, cut)
	}
	return nil
}
