package soak

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// The soak's two tiers (docs/testing.md).
//
// The defaults tier (Config.Defaults) runs the workers at the daemon's shipped settings:
// their environment says where the engine, the ledger database and the provider are, the
// ledger namespace, the worker id, logging, the operations endpoint (off: several workers
// share the host) and failpoints, and nothing else. It is the configuration users run.
//
// The short-timeouts tier overrides the lock, the long poll, the lease, the provider
// timeout (which must end a call before the ledger's lease cuts it off), the shutdown
// grace and the concurrency (shortOverrides), so that a crashed attempt is taken over
// within seconds and a run fits many more kills and crash points into its time.
//
// Either way the harness reads what the workers run with from the worker binary itself
// (`invoice config -json` in the workers' environment) and derives its own timing from
// it (deriveTiming): nothing in the harness assumes a lock length. The demo's own
// provider settings are printed there too, beside the framework's.

// shortOverrides are the short-timeouts tier's settings, on top of the daemon's defaults.
var shortOverrides = []string{"EXTWORKER_LOCK_DURATION=3s", "EXTWORKER_LEDGER_LEASE=3s", "EXTWORKER_LONG_POLL=1s",
	"EXTWORKER_PROVIDER_TIMEOUT=2500ms", "EXTWORKER_SHUTDOWN_GRACE=5s", "EXTWORKER_MAX_CONCURRENCY=8"}

// baseDrain is the soak's pass criterion for the drain (docs/testing.md): two minutes from the
// end of the faults until every instance has settled. A tier whose recovery is slower by
// design gets more (deriveTiming).
const baseDrain = 2 * time.Minute

// Settings are the workers' timing settings, as the worker binary reports them.
type Settings struct {
	LockDuration, LongPoll, LedgerLease       time.Duration
	ProviderTimeout, EngineTimeout, SearchLag time.Duration
	ShutdownGrace                             time.Duration
	// ShutdownTimeout bounds the whole shutdown; 0 when the binary has no such setting.
	ShutdownTimeout time.Duration
	MaxConcurrency  int
	Overrides       []string // the tier's EXTWORKER_ settings (none: the defaults tier)
}

// Timing is what the harness derives from the workers' settings.
type Timing struct {
	// KillEvery is the mean time between random kills: Config.KillEvery, or half the
	// lock, so that a worker usually lives through several locks and their extensions.
	KillEvery time.Duration
	// ProviderDelay is how long the provider's "delay" fault holds a charge before it
	// commits it: past the lock, and past the point where the worker gives up on the call
	// (its provider timeout, or its ledger lease, which cuts a dispatch off before it
	// ends), so the worker gives up on a charge the provider then makes.
	ProviderDelay time.Duration
	// DrainAllowed is the longest the drain may take: baseDrain, or, when recovery is
	// slower by design, the longest recovery (a crashed attempt's ledger lease, then its
	// expired engine lock found by the next long poll, then one provider call) plus a
	// minute of work.
	DrainAllowed time.Duration
	// StopWithin is how long the workers get to exit after SIGTERM at the end: their
	// shutdown timeout (or, for a binary without one, their shutdown grace) and 15 s.
	StopWithin time.Duration
}

// deriveTiming derives the harness's timing from the workers' settings; killEvery, if
// positive, is the run's own choice.
func deriveTiming(s Settings, killEvery time.Duration) Timing {
	recovery := s.LedgerLease + s.LockDuration + s.LongPoll + s.ProviderTimeout
	return Timing{
		KillEvery:     cmp.Or(killEvery, s.LockDuration/2),
		ProviderDelay: max(s.LockDuration, min(s.ProviderTimeout, s.LedgerLease)) + time.Second,
		DrainAllowed:  max(baseDrain, recovery+time.Minute),
		StopWithin:    cmp.Or(s.ShutdownTimeout, s.ShutdownGrace) + 15*time.Second,
	}
}

// tierName names the tier for the report.
func tierName(defaults bool) string {
	if defaults {
		return "defaults"
	}
	return "short"
}

// workerEnv is the environment every worker process of the run starts from: this
// process's environment without any EXTWORKER_ variable (a setting inherited from the
// shell would quietly change the tier), then the tier's overrides, then sets (the URLs,
// the namespace, logging).
func workerEnv(defaults bool, sets ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EXTWORKER_") {
			env = append(env, kv)
		}
	}
	if !defaults {
		env = append(env, shortOverrides...)
	}
	return append(env, sets...)
}

// readSettings asks the worker binary what it runs with in env (`extworker config
// -json`: the effective configuration, defaults applied, secrets masked).
func readSettings(ctx context.Context, bin string, env []string, defaults bool) (Settings, error) {
	cmd := exec.CommandContext(ctx, bin, "config", "-json")
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var vars map[string]string
	if err := json.Unmarshal(stdout.Bytes(), &vars); err != nil {
		return Settings{}, fmt.Errorf("%s config -json: %v (%v): %s", bin, err, runErr, stderr.Bytes())
	}
	if runErr != nil {
		return Settings{}, fmt.Errorf("%s config -json: the workers' configuration is invalid: %v: %s", bin, runErr, stderr.Bytes())
	}
	if vars == nil {
		vars = map[string]string{}
	}
	s := Settings{}
	if !defaults {
		s.Overrides = shortOverrides
	}
	var errs []string
	dur := func(name string, to *time.Duration) {
		d, err := time.ParseDuration(vars[name])
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s %q: %v", name, vars[name], err))
		}
		*to = d
	}
	dur("EXTWORKER_LOCK_DURATION", &s.LockDuration)
	dur("EXTWORKER_LONG_POLL", &s.LongPoll)
	dur("EXTWORKER_LEDGER_LEASE", &s.LedgerLease)
	dur("EXTWORKER_PROVIDER_TIMEOUT", &s.ProviderTimeout)
	dur("EXTWORKER_ENGINE_TIMEOUT", &s.EngineTimeout)
	dur("EXTWORKER_PROVIDER_SEARCH_LAG", &s.SearchLag)
	dur("EXTWORKER_SHUTDOWN_GRACE", &s.ShutdownGrace)
	if _, ok := vars["EXTWORKER_SHUTDOWN_TIMEOUT"]; ok {
		dur("EXTWORKER_SHUTDOWN_TIMEOUT", &s.ShutdownTimeout)
	}
	n, err := strconv.Atoi(vars["EXTWORKER_MAX_CONCURRENCY"])
	if err != nil {
		errs = append(errs, fmt.Sprintf("EXTWORKER_MAX_CONCURRENCY %q: %v", vars["EXTWORKER_MAX_CONCURRENCY"], err))
	}
	s.MaxConcurrency = n
	if len(errs) > 0 {
		return s, fmt.Errorf("%s config -json: %s", bin, strings.Join(errs, "; "))
	}
	return s, nil
}

// String is the settings line of the report.
func (s Settings) String() string {
	shutdown := fmt.Sprintf("shutdown grace %v", s.ShutdownGrace)
	if s.ShutdownTimeout > 0 {
		shutdown += fmt.Sprintf(" (at most %v in all)", s.ShutdownTimeout)
	}
	return fmt.Sprintf("lock %v, long poll %v, ledger lease %v, provider timeout %v, engine timeout %v, search lag %v, %s, max concurrency %d",
		s.LockDuration, s.LongPoll, s.LedgerLease, s.ProviderTimeout, s.EngineTimeout, s.SearchLag, shutdown, s.MaxConcurrency)
}
