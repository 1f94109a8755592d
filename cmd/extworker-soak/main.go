// Command extworker-soak runs the seeded SIGKILL soak against the real engine and
// PostgreSQL (see package internal/soak and `make soak`). It prints the run's report
// (also written to <logs>/<seed>-<time>/report.txt) and exits non-zero when an invariant
// is violated, printing the seed to replay the run and the directory holding its whole
// history. The soak must be the only worker on the engine's demo topics.
//
// -defaults selects the defaults tier: the workers run at the daemon's shipped settings
// and the harness derives its timing (kill pacing, the provider's delay fault, the drain
// allowed, the stop) from them. Without it, the short-timeouts tier. See docs/testing.md.
//
// -broker runs the demo's events on a RabbitMQ node of the soak's own; -kafka on a Kafka
// broker of its own instead. -broker-restarts SIGKILLs and restarts either.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/extworker/extworker/internal/soak"
	"github.com/extworker/extworker/internal/testenv"
)

func main() { os.Exit(run()) }

// run is main, returning the exit status once the deferred clean-up (the broker's node)
// has run.
func run() int {
	var cfg soak.Config
	flag.StringVar(&cfg.Binary, "bin", "bin/invoice", "the worker binary to run (examples/invoice built with -tags failpoints: make bin/invoice)")
	flag.StringVar(&cfg.EngineURL, "engine", "http://127.0.0.1:8080/engine-rest", "the engine's REST root")
	flag.StringVar(&cfg.DatabaseURL, "db", "postgres://extworker:extworker@127.0.0.1:5432/extworker", "the ledger database")
	flag.IntVar(&cfg.Instances, "instances", 1000, "invoices to start")
	flag.IntVar(&cfg.Workers, "workers", 3, "worker processes")
	flag.DurationVar(&cfg.KillEvery, "kill-every", 0, "mean time between random SIGKILLs; 0: half the workers' lock duration")
	flag.BoolVar(&cfg.Defaults, "defaults", false, "the defaults tier: workers run at the daemon's shipped settings (no lock, long poll, lease, timeout or concurrency set); without it, the short-timeouts tier (3s lock and lease, 1s long poll)")
	flag.IntVar(&cfg.MinKills, "min-kills", 25, "kills the run must reach before the killer stops")
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "the seed (printed, for replay)")
	flag.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "the whole run, drain included")
	flag.StringVar(&cfg.LogDir, "logs", os.TempDir(), "where run directories go (<seed>-<time>/: report, history, worker logs)")
	flag.IntVar(&cfg.PGRestarts, "pg-restarts", 0, "PostgreSQL restarts (immediate) during the run")
	flag.IntVar(&cfg.EngineRestarts, "engine-restarts", 0, "engine restarts (stop, then services/engine-up.sh) during the run")
	flag.StringVar(&cfg.EngineUpScript, "engine-up", "services/engine-up.sh", "the script that starts the engine")
	flag.StringVar(&cfg.EngineUser, "engine-user", "", "HTTP basic user for an engine with REST authentication (e.g. admin on :8081)")
	flag.StringVar(&cfg.EnginePassword, "engine-password", "", "its password (then one of the canaries: it must appear nowhere)")
	flag.DurationVar(&cfg.EngineLatencyWindow, "engine-latency-window", 0, "a window this long of 500ms latency on the workers' engine link (long tier); 0: none")
	flag.BoolVar(&cfg.KeepHistory, "keep-history", false, "keep a passing run's whole history, not just report.txt and the worker logs' tail")
	broker := flag.Bool("broker", false, "run the demo's events (invoice.paid out through the outbox, the shipping process in through the inbox) on a RabbitMQ node of the soak's own, and check I10 and I11")
	flag.IntVar(&cfg.BrokerRestarts, "broker-restarts", 0, "with -broker: SIGKILLs of the broker's node, each followed by a restart, during the run")
	flag.BoolVar(&cfg.Kafka, "kafka", false, "with -broker (implied): the events go through a Kafka broker of the soak's own (a KRaft node it SIGKILLs and restarts on its data), not RabbitMQ; the workers run with the demo's Kafka setting (EXTWORKER_DEMO_EVENTS=kafka)")
	flag.Parse()
	cfg.Seed = *seed
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch {
	case cfg.Kafka:
		dir, err := os.MkdirTemp("", "extworker-soak-kafka-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		node, err := testenv.StartKafkaNode(dir)
		if node != nil {
			defer node.Stop()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak: the Kafka broker:", err)
			return 1
		}
		fmt.Printf("soak: Kafka broker of the soak's own at %s (data in %s)\n", node.Addr(), dir)
		cfg.Broker = kafkaBroker{node}
	case *broker:
		dir, err := os.MkdirTemp("", "extworker-soak-broker-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		node, err := testenv.StartBrokerNode(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak: the broker:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		defer node.Stop()
		fmt.Printf("soak: RabbitMQ node %s of the soak's own at %s\n", node.Node(), node.URL())
		cfg.Broker = node
	}
	if _, err := soak.Run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("soak OK: every invariant held")
	return 0
}

// kafkaBroker is the soak's Kafka node as its Broker: Kill SIGKILLs the JVM, Restart
// starts it again on the same data and ports.
type kafkaBroker struct{ n *testenv.KafkaNode }

func (b kafkaBroker) URL() string { return b.n.Addr() }

func (b kafkaBroker) Kill() error {
	_, err := b.n.KillJVM()
	return err
}

func (b kafkaBroker) Restart() error {
	_, err := b.n.StartAgain()
	return err
}
