#!/usr/bin/env bash
# cluster-down.sh: stop what services/cluster-up.sh started: HAProxy and the nodes
# (CLUSTER_NODE_PORTS, default "8100 8101"). Idempotent. The database stays.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CLUSTER_NODE_PORTS="${CLUSTER_NODE_PORTS:-8100 8101}"
pidfile="$here/.run/haproxy-cluster.pid"
if [ -f "$pidfile" ] && pid=$(cat "$pidfile") && kill -0 "$pid" 2>/dev/null; then
  kill "$pid"
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
  echo "cluster-down: stopped HAProxy (pid $pid)"
fi
rm -f "$pidfile"
for p in $CLUSTER_NODE_PORTS; do ENGINE_PORT=$p bash "$here/engine-down.sh"; done
