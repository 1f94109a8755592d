#!/usr/bin/env bash
# engine-down.sh: stop the engine started by engine-up.sh. Idempotent.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pidfile="$here/.run/engine.pid"
quiet=0; [ "${1:-}" = --quiet ] && quiet=1
if [ -f "$pidfile" ] && pid=$(cat "$pidfile") && kill -0 "$pid" 2>/dev/null; then
  kill "$pid"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  [ $quiet = 1 ] || echo "engine-down: stopped engine (pid $pid)"
else
  [ $quiet = 1 ] || echo "engine-down: no engine running"
fi
rm -f "$pidfile"
