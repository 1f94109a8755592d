package main

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/extworker/extworker"
	"github.com/extworker/extworker/examples/invoice/fakeprovider"
	"github.com/extworker/extworker/idempotency"
)

// providerConfig is the demo's payment provider, from variables the demo reads itself
// (EXTWORKER_PROVIDER_URL, _TIMEOUT, _SEARCH, _SEARCH_LAG; `invoice config` prints them
// beside the framework's): the framework knows no provider (docs/configuration.md, The demo).
type providerConfig struct {
	// URL is the provider; empty starts a fake one in this process.
	URL string `envconfig:"PROVIDER_URL"`
	// Timeout bounds each provider call (idempotency.Effect.Timeout): a call that times
	// out after the request left is an unknown outcome, reconciled before anything is
	// sent again. The ledger refuses it unless EXTWORKER_LEDGER_LEASE leaves it whole.
	Timeout time.Duration `envconfig:"PROVIDER_TIMEOUT" default:"10s"`
	// Search: the provider's business search (charges by invoice) is authoritative once
	// SearchLag has passed. false: unknown charges past the provider's window go to an
	// operator.
	Search    bool          `envconfig:"PROVIDER_SEARCH" default:"true"`
	SearchLag time.Duration `envconfig:"PROVIDER_SEARCH_LAG" default:"1m"`
}

// loadProviderConfig reads the demo's provider variables; every problem is a
// configuration error (exit status 78).
func loadProviderConfig() (providerConfig, error) {
	var c providerConfig
	if err := envconfig.Process("EXTWORKER", &c); err != nil {
		return c, extworker.ConfigError{Err: err}
	}
	var errs []error
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_PROVIDER_TIMEOUT %v: must be positive", c.Timeout))
	}
	if c.SearchLag < 0 {
		errs = append(errs, fmt.Errorf("EXTWORKER_PROVIDER_SEARCH_LAG %v: must not be negative", c.SearchLag))
	}
	if len(errs) > 0 {
		return c, extworker.ConfigError{Err: fmt.Errorf("the demo's provider: %w", errors.Join(errs...))}
	}
	return c, nil
}

// newDemoEnv charges through ledger and the provider pc names, or a fake one started in
// this process (returned, for its scripts and counts). The returned function stops it.
func newDemoEnv(pc providerConfig, ledger *idempotency.Ledger) (*demoEnv, *fakeprovider.Server, func(), error) {
	// A fresh connection per request: on a reused one, net/http itself silently resends a
	// request carrying an Idempotency-Key whose answer was lost, and the demo wants to show
	// the ledger reconciling such outcomes.
	env := &demoEnv{ledger: ledger, searchOn: pc.Search, searchLag: pc.SearchLag, timeout: pc.Timeout, pay: &fakeprovider.Client{BaseURL: pc.URL,
		HTTP: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: pc.Timeout}}}
	if pc.URL != "" {
		return env, nil, func() {}, nil
	}
	srv, err := fakeprovider.Start(demoDeclineLimit)
	if err != nil {
		return nil, nil, nil, err
	}
	env.pay.BaseURL = srv.URL()
	return env, srv, func() { _ = srv.Close() }, nil
}
