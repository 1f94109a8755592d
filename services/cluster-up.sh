#!/usr/bin/env bash
# cluster-up.sh: an engine cluster, as production runs Camunda 7: engine nodes on ONE
# database behind a load balancer (docs/testing.md, "An engine cluster"). It starts the
# nodes with services/engine-up.sh (the same build as make up's engines), each on its own
# port and all on database CLUSTER_DB of the main PostgreSQL (created by pg-up.sh), and
# HAProxy (Debian's package, installed when missing) in front of them, round robin, with
# the health check and timeouts of services/haproxy-cluster.cfg. Idempotent: nodes that
# answer are left alone; HAProxy is started again with the current configuration.
#
#   CLUSTER_PORT        HAProxy's port (default 8099): http://127.0.0.1:8099/engine-rest
#   CLUSTER_NODE_PORTS  the nodes' ports (default "8100 8101")
#   CLUSTER_DB          their database (default camunda_cluster)
#   CLUSTER_STATS_PORT  HAProxy's statistics page, /stats (default 8098; empty: none)
#
# cluster-up.sh --install-only installs HAProxy and exits (the tests' clusters need it:
# testenv.StartCluster; in CI a missing haproxy fails them).
# The tests that kill nodes start clusters of their own (internal/testenv.StartCluster).
# HAProxy's pid, configuration and log are in services/.run/haproxy-cluster.*; the nodes'
# as engine-up.sh keeps them (engine-<port>.*). services/cluster-down.sh stops it all.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
CLUSTER_PORT="${CLUSTER_PORT:-8099}"
CLUSTER_NODE_PORTS="${CLUSTER_NODE_PORTS:-8100 8101}"
CLUSTER_DB="${CLUSTER_DB:-camunda_cluster}"
CLUSTER_STATS_PORT="${CLUSTER_STATS_PORT-8098}"
run="$here/.run"
mkdir -p "$run"
read -r -a ports <<<"$CLUSTER_NODE_PORTS"
[ ${#ports[@]} -ge 1 ] || { echo "cluster-up: CLUSTER_NODE_PORTS names no port" >&2; exit 2; }

if ! command -v haproxy >/dev/null 2>&1; then
  echo "cluster-up: installing haproxy"
  export DEBIAN_FRONTEND=noninteractive
  (flock 9; apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq haproxy >/dev/null) 9>"$run/apt.lock"
fi

[ "${1:-}" = --install-only ] && exit 0

bash "$here/pg-up.sh" "$CLUSTER_DB" >/dev/null
# Two nodes creating the engine's schema at once on an empty database collide: the first
# node starts alone then, the others after it, in parallel.
schema=$(PGPASSWORD=camunda psql -h 127.0.0.1 -p "${PG_PORT:-5432}" -U camunda -d "$CLUSTER_DB" -tAc \
  "SELECT to_regclass('act_ge_property') IS NOT NULL")
start_node() { ENGINE_PORT="$1" ENGINE_DB="$CLUSTER_DB" ENGINE_REST_AUTH=false bash "$here/engine-up.sh"; }
rest=("${ports[@]}")
if [ "$schema" != t ]; then
  echo "cluster-up: database $CLUSTER_DB has no engine schema yet: node ${ports[0]} creates it first"
  start_node "${ports[0]}"
  rest=("${ports[@]:1}")
fi
pids=()
for p in "${rest[@]}"; do start_node "$p" & pids+=($!); done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
[ $rc = 0 ] || { echo "cluster-up: a node did not start" >&2; exit 1; }

cfg="$run/haproxy-cluster.cfg"; pidfile="$run/haproxy-cluster.pid"; log="$run/haproxy-cluster.log"
{
  cat "$here/haproxy-cluster.cfg"
  for i in "${!ports[@]}"; do echo "    server node$i 127.0.0.1:${ports[$i]} check"; done
  if [ -n "$CLUSTER_STATS_PORT" ]; then
    printf '\nlisten stats\n    bind 127.0.0.1:%s\n    stats enable\n    stats uri /stats\n    stats refresh 2s\n' "$CLUSTER_STATS_PORT"
  fi
} >"$cfg"
CLUSTER_PORT="$CLUSTER_PORT" haproxy -c -q -f "$cfg"
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  kill "$(cat "$pidfile")"
  for _ in $(seq 1 20); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.25; done
fi
CLUSTER_PORT="$CLUSTER_PORT" setsid nohup haproxy -db -f "$cfg" >"$log" 2>&1 </dev/null &
echo $! >"$pidfile"
url="http://127.0.0.1:$CLUSTER_PORT/engine-rest/version"
for _ in $(seq 1 60); do curl -fsS -m 2 -o /dev/null "$url" 2>/dev/null && break; sleep 0.5; done
curl -fsS -m 2 -o /dev/null "$url" || { echo "cluster-up: HAProxy does not answer at $url; its log:" >&2; cat "$log" >&2; exit 1; }
echo "cluster-up: ${#ports[@]} nodes (ports ${ports[*]}, database $CLUSTER_DB) behind HAProxy at http://127.0.0.1:$CLUSTER_PORT/engine-rest${CLUSTER_STATS_PORT:+ (statistics: http://127.0.0.1:$CLUSTER_STATS_PORT/stats)}"
