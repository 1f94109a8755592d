package doctor_test

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/extworker/extworker/internal/daemon"
	"github.com/extworker/extworker/internal/doctor"
)

// The decisions are functions of facts; Write prints them as `extworker doctor` does
// when its output is not a terminal.
func ExampleWrite() {
	cfg := daemon.Config{LockDuration: 10 * time.Second, LongPoll: 30 * time.Second, ShutdownGrace: 30 * time.Second,
		ShutdownTimeout: 45 * time.Second, LedgerLease: 2 * time.Minute}
	skew := 400 * time.Millisecond
	checks := []doctor.Check{
		doctor.EngineVersion("7.24.0"),
		doctor.ClockSkew(&skew, nil),
		doctor.Relations(cfg)[0],
		doctor.Address("EXTWORKER_HTTP_ADDR", "127.0.0.1:9464", errors.New("address already in use")),
	}
	_ = doctor.Write(os.Stdout, checks, false)
	fmt.Println("exit status", doctor.ExitCode(checks))
	// Output:
	// OK    engine version               7.24.0
	// OK    clock skew                   engine +0.4s (against this host)
	// WARN  lock vs long poll            EXTWORKER_LOCK_DURATION 10s (extended every 3.333s), EXTWORKER_LONG_POLL 30s: a task the engine locks late in a long poll arrives with its lock short or run out, and must be extended (or locked again) at once
	//       fix: set EXTWORKER_LOCK_DURATION to at least EXTWORKER_LONG_POLL (30s), or shorten the long poll
	// FAIL  address EXTWORKER_HTTP_ADDR  127.0.0.1:9464: address already in use
	//       fix: set EXTWORKER_HTTP_ADDR to a free address (one per worker on a host), or stop what listens there (ss -ltnp)
	// 4 checks: 2 ok, 1 warning, 1 failed, 0 skipped
	// exit status 1
}
