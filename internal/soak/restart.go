package soak

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
)

// restartPostgres restarts PostgreSQL (the ledger's and the engine's database alike)
// with `pg_ctlcluster ... restart -m immediate`: the newest installed version's main
// cluster.
func restartPostgres(ctx context.Context) error {
	b, err := exec.CommandContext(ctx, "bash", "-c",
		`v=$(ls /usr/lib/postgresql | sort -n | tail -1); pg_ctlcluster "$v" main restart -m immediate`).CombinedOutput()
	if err != nil {
		return fmt.Errorf("restart PostgreSQL: %v: %s", err, b)
	}
	return nil
}

// restartEngine stops the engine listening on the engine URL's port and starts it again.
func restartEngine(ctx context.Context, cfg Config) error {
	u, err := url.Parse(cfg.EngineURL)
	if err != nil {
		return err
	}
	port := u.Port()
	stop := exec.CommandContext(ctx, "bash", "-c", `pid=$(ss -ltnpH "sport = :`+port+`" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
		[ -n "$pid" ] || exit 0
		kill "$pid"; for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.5; done; kill -9 "$pid"`)
	if out, err := stop.CombinedOutput(); err != nil {
		return fmt.Errorf("stop the engine on port %s: %v: %s", port, err, out)
	}
	up := exec.CommandContext(ctx, "bash", cfg.EngineUpScript)
	up.Env = append(os.Environ(), "ENGINE_PORT="+port)
	if out, err := up.CombinedOutput(); err != nil {
		return fmt.Errorf("start the engine on port %s: %v: %s", port, err, out)
	}
	return nil
}

// restartBroker SIGKILLs the broker's node and starts it again.
func restartBroker(b Broker) error {
	if err := b.Kill(); err != nil {
		return fmt.Errorf("kill the broker: %w", err)
	}
	if err := b.Restart(); err != nil {
		return fmt.Errorf("restart the broker: %w", err)
	}
	return nil
}
