#!/usr/bin/env bash
# engine-down.sh: stop the engines started by engine-up.sh: the one on ENGINE_PORT when it
# is set, else all of them. Idempotent.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
quiet=0; [ "${1:-}" = --quiet ] && quiet=1
if [ -n "${ENGINE_PORT:-}" ]; then
  name=engine; [ "$ENGINE_PORT" = 8080 ] || name="engine-$ENGINE_PORT"
  pidfiles=("$here/.run/$name.pid")
else
  shopt -s nullglob
  pidfiles=("$here"/.run/engine.pid "$here"/.run/engine-*.pid)
fi
# running: the process exists and is not a zombie. An engine that tests SIGKILLed (the
# third one, on port 8082) is dead, but stays a zombie where nothing reaps orphans.
running() { kill -0 "$1" 2>/dev/null && ! ps -o stat= -p "$1" 2>/dev/null | grep -q '^Z'; }
stopped=0
for pidfile in "${pidfiles[@]}"; do
  if [ -f "$pidfile" ] && pid=$(cat "$pidfile") && running "$pid"; then
    kill "$pid"
    for _ in $(seq 1 60); do running "$pid" || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    stopped=1
    [ $quiet = 1 ] || echo "engine-down: stopped engine (pid $pid, $(basename "$pidfile" .pid))"
  fi
  rm -f "$pidfile"
done
[ $quiet = 1 ] || [ $stopped = 1 ] || echo "engine-down: no engine running"
