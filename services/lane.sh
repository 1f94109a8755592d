#!/usr/bin/env bash
# lane.sh up|down|run LANE [command...]: a lane is an engine release on ports of its own
# with its databases on a PostgreSQL cluster of its own. What runs in a lane (the
# conformance suite, a soak, which SIGKILLs its workers and restarts its PostgreSQL)
# shares no service with make test (engines 8080-8083, the main cluster on 5432) nor with
# another lane, so CI runs the lanes beside make test (.ci/run, make engines-check).
#
#   LANE            engine                PostgreSQL cluster   engine ports
#   soak            camunda7 (7.24.0)     lane_soak, 5433      8084
#   camunda7-7.20   Camunda 7.20.0        lane_v720, 5434      8090, the quiet one 8091
#   camunda7-7.22   Camunda 7.22.0        lane_v722, 5435      8092, the quiet one 8093
#
# up    creates (the first time) and starts the cluster, then the lane's engines, in
#       parallel (engine-up.sh, pg-up.sh); idempotent
# down  stops the lane's engines and its cluster (its data stays for the next run)
# run   runs the command with the lane's variables: the tests' (EXTWORKER_TEST_ENGINE_URL,
#       EXTWORKER_TEST_QUIET_ENGINE_URL, EXTWORKER_TEST_ENGINE_DB_URL, EXTWORKER_TEST_DB_URL),
#       the soak's (SOAK_ENGINE, SOAK_DB: the Makefile's soak targets read them), and
#       pg_ctlcluster on PATH from lane-bin/ with LANE_PG_CLUSTER, so that the soak's
#       PostgreSQL restart (internal/soak: pg_ctlcluster <newest> main restart) restarts
#       the lane's cluster, not the main one everything else uses.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd="${1:-}"; lane="${2:-}"
quiet_port=""
case "$lane" in
  soak)          engine=camunda7;      cluster=lane_soak; pg_port=5433; port=8084 ;;
  camunda7-7.20) engine=$lane;         cluster=lane_v720; pg_port=5434; port=8090; quiet_port=8091 ;;
  camunda7-7.22) engine=$lane;         cluster=lane_v722; pg_port=5435; port=8092; quiet_port=8093 ;;
  *) echo "lane.sh: usage: lane.sh up|down|run soak|camunda7-7.20|camunda7-7.22 [command...]" >&2; exit 2 ;;
esac
# engine-up.sh puts an older release's data in databases suffixed _v7xx.
suffix=""; case "$engine" in camunda7-7.*) suffix="_v7${engine#camunda7-7.}" ;; esac

case "$cmd" in
  up)
    PG_CLUSTER=$cluster PG_PORT=$pg_port bash "$here/pg-up.sh" >/dev/null
    echo "lane $lane: PostgreSQL cluster $cluster on 127.0.0.1:$pg_port"
    ENGINE=$engine ENGINE_PORT=$port ENGINE_DB=camunda PG_CLUSTER=$cluster PG_PORT=$pg_port \
      bash "$here/engine-up.sh" & a=$!
    b=""
    if [ -n "$quiet_port" ]; then
      ENGINE=$engine ENGINE_PORT=$quiet_port ENGINE_DB=camunda_quiet PG_CLUSTER=$cluster PG_PORT=$pg_port \
        bash "$here/engine-up.sh" & b=$!
    fi
    rc=0
    wait $a || rc=1
    if [ -n "$b" ]; then wait "$b" || rc=1; fi
    exit $rc
    ;;
  down)
    for p in $port $quiet_port; do ENGINE_PORT=$p bash "$here/engine-down.sh" --quiet || true; done
    ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
    pg_ctlcluster "$ver" "$cluster" stop 2>/dev/null || true
    echo "lane $lane: engines on ${port}${quiet_port:+ and $quiet_port} and PostgreSQL cluster $cluster stopped"
    ;;
  run)
    shift 2
    [ $# -gt 0 ] || { echo "lane.sh run $lane: no command" >&2; exit 2; }
    export EXTWORKER_TEST_ENGINE_URL="http://127.0.0.1:$port/engine-rest"
    export EXTWORKER_TEST_QUIET_ENGINE_URL="http://127.0.0.1:${quiet_port:-$port}/engine-rest"
    export EXTWORKER_TEST_ENGINE_DB_URL="postgres://camunda:camunda@127.0.0.1:$pg_port/camunda$suffix"
    export EXTWORKER_TEST_DB_URL="postgres://extworker:extworker@127.0.0.1:$pg_port/extworker"
    export SOAK_ENGINE="$EXTWORKER_TEST_ENGINE_URL" SOAK_DB="$EXTWORKER_TEST_DB_URL"
    export LANE_PG_CLUSTER=$cluster PATH="$here/lane-bin:$PATH"
    exec "$@"
    ;;
  *) echo "lane.sh: usage: lane.sh up|down|run LANE [command...]" >&2; exit 2 ;;
esac
