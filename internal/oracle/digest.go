package oracle

import (
	"fmt"

	"github.com/extworker/extworker/idempotency"
)

// Effect is one effect the provider performed, as I2 sees it.
type Effect struct {
	// ID is the provider's reference (a charge id).
	ID string
	// Key is the Idempotency-Key the effect was performed under.
	Key string
	// Request is the request the handler builds for this effect, rebuilt from what the
	// provider recorded (for the demo's charge: {"invoice", "amountCents"}). Its
	// canonical digest (idempotency.Digest) must be the one the ledger stored.
	Request any
}

// CheckDigests checks I2 (digest integrity): every provider effect came under the
// provider key of exactly one ledger intent, and the request it performed digests to
// that intent's request digest. An effect under a key no intent owns is a dispatch that
// bypassed the ledger; a different digest is a request the ledger never agreed to send
// under that key. rows are the ledger's intents (every state), effects the provider's.
func CheckDigests(rows []idempotency.Row, effects []Effect) []string {
	var v []string
	byKey := make(map[string]idempotency.Row, len(rows))
	for _, r := range rows {
		if prev, dup := byKey[r.ProviderKey]; dup {
			v = append(v, fmt.Sprintf("I2: provider key %s belongs to two intents: %s and %s", r.ProviderKey, prev.Key, r.Key))
			continue
		}
		byKey[r.ProviderKey] = r
	}
	for _, e := range effects {
		if e.Key == "" {
			v = append(v, fmt.Sprintf("I2: effect %s has no idempotency key recorded", e.ID))
			continue
		}
		row, ok := byKey[e.Key]
		if !ok {
			v = append(v, fmt.Sprintf("I2: effect %s under key %s has no ledger intent", e.ID, e.Key))
			continue
		}
		d, err := idempotency.Digest(e.Request)
		if err != nil {
			v = append(v, fmt.Sprintf("I2: effect %s (%s): %v", e.ID, row.Key, err))
			continue
		}
		if d != row.Digest {
			v = append(v, fmt.Sprintf("I2: effect %s (%s) performed a request with digest %s, the ledger holds %s", e.ID, row.Key, d, row.Digest))
		}
	}
	return v
}
