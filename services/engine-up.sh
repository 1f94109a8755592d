#!/usr/bin/env bash
# engine-up.sh: build (when needed) and start an engine under test, then wait until
# GET /engine-rest/version answers with the version asked for, and print one line: the
# engine ready, and where its Cockpit is (/camunda/app/cockpit/).
# Idempotent: an engine that already answers with the version asked for is left alone. One
# of this checkout's engines (its pid in services/.run) that answers with another version
# is stopped and the right one started; a port held by any other process (another
# checkout's engine, a leftover server) is not touched: the script names the holder, says
# how to stop it, and exits 1.
# Several engines run side by side, one per port (make up starts four: 8080 without
# authentication, 8081 with HTTP basic authentication on /engine-rest, 8082 without
# authentication on database camunda_faults, for the tests that SIGKILL and restart it,
# and 8083 on camunda_quiet, for the long-poll timing pins).
#
#   ENGINE=camunda7|camunda7-7.22|camunda7-7.20|operaton|cibseven
#                                        which engine to build and run (default camunda7,
#                                        Camunda 7.24.0; the older Camunda 7 releases CI
#                                        checks run on databases of their own, suffixed
#                                        _v722 and _v720, created here when missing: an
#                                        engine does not run on a newer release's schema)
#   ENGINE_PORT                          HTTP port (default 8080)
#   ENGINE_DB                            its PostgreSQL database (default camunda)
#   PG_PORT, PG_CLUSTER                  the PostgreSQL cluster that database is on (default
#                                        5432, main: pg-up.sh); a lane of make engines-check
#                                        runs its engines on a cluster of its own (lane.sh)
#   ENGINE_REST_AUTH=true                HTTP basic authentication on /engine-rest, with the user
#   ENGINE_ADMIN_USER, ENGINE_ADMIN_PASSWORD   (default admin / extworker-admin)
#   ENGINE_START_TIMEOUT                 seconds to wait for readiness (default 300)
#
# Port 8080 keeps its pid and log in services/.run/engine.pid and engine.log, other ports in
# engine-<port>.pid and engine-<port>.log. Each engine runs from its own copy of the jar
# (services/.run/engine-<port>.jar), so rebuilding never touches a running engine's jar.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/port-holder.sh"
ENGINE="${ENGINE:-camunda7}"
ENGINE_PORT="${ENGINE_PORT:-8080}"
ENGINE_DB="${ENGINE_DB:-camunda}"
ENGINE_REST_AUTH="${ENGINE_REST_AUTH:-false}"
ENGINE_START_TIMEOUT="${ENGINE_START_TIMEOUT:-300}"
url="http://127.0.0.1:${ENGINE_PORT}/engine-rest/version"
run="$here/.run"
mkdir -p "$run"
name=engine; [ "$ENGINE_PORT" = 8080 ] || name="engine-$ENGINE_PORT"
pidfile="$run/$name.pid"; log="$run/$name.log"

# profile: the Maven profile; mvn_props: the release within it; want: the version the
# engine answers with. An engine that answers with another version (make up with another
# ENGINE) is stopped and the right one started.
mvn_props=()
case "$ENGINE" in
  camunda7)      profile=camunda7; want=7.24.0 ;;
  camunda7-7.22) profile=camunda7; want=7.22.0; mvn_props=(-Dcamunda.version=7.22.0 -Dspring-boot.version=3.3.13) ;;
  camunda7-7.20) profile=camunda7; want=7.20.0; mvn_props=(-Dcamunda.version=7.20.0 -Dspring-boot.version=3.1.12) ;;
  operaton)      profile=operaton; want=2.1.3 ;;
  cibseven)      profile=cibseven; want=2.2.0 ;;
  *) echo "engine-up: ENGINE must be camunda7, camunda7-7.22, camunda7-7.20, operaton or cibseven, not '$ENGINE'" >&2; exit 2 ;;
esac
case "$ENGINE" in camunda7-7.*)
  ENGINE_DB="${ENGINE_DB}_v7${ENGINE#camunda7-7.}"
  bash "$here/pg-up.sh" "$ENGINE_DB" >/dev/null ;;
esac
auth=()
if [ "$ENGINE_REST_AUTH" = true ]; then
  export ENGINE_ADMIN_USER="${ENGINE_ADMIN_USER:-admin}" ENGINE_ADMIN_PASSWORD="${ENGINE_ADMIN_PASSWORD:-extworker-admin}"
  auth=(-u "$ENGINE_ADMIN_USER:$ENGINE_ADMIN_PASSWORD")
fi
answers() { curl -fsS -m 2 "${auth[@]}" "$url" 2>/dev/null; }

# cockpit is where the engine's Cockpit is and how to log in, for the ready line: demo /
# demo (a demo credential of these local engines, application.yaml), or with REST
# authentication the REST administrator, who replaces the demo user there
# (application-rest-auth.yaml). An engine started from a build without the webapps has
# none: it says how to restart it.
cockpit() {
  local at="http://127.0.0.1:${ENGINE_PORT}/camunda/app/cockpit/default/" login="demo / demo"
  [ "$ENGINE_REST_AUTH" = true ] && login="$ENGINE_ADMIN_USER, the REST administrator"
  if curl -fsS -m 5 -o /dev/null "$at" 2>/dev/null; then
    echo "Cockpit $at (login $login)"
  else
    echo "no Cockpit (an engine started before the webapps were added: ENGINE_PORT=$ENGINE_PORT bash services/engine-down.sh, then make up)"
  fi
}
is_wanted() { [[ "$1" == *"\"version\":\"$want\""* ]]; }
# foreign: the port is held by a process this checkout did not start; it says so (with
# what answers there, if anything) and exits 1.
stop_hint="ENGINE_PORT=$ENGINE_PORT bash <dir>/services/engine-down.sh"
foreign() {
  local why
  why=$(refuse_foreign_holder engine-up "$ENGINE_PORT" "$pidfile" "$stop_hint" 2>&1) && return 0
  if [ -n "${1:-}" ]; then
    echo "engine-up: the engine on port $ENGINE_PORT answers $1, not $ENGINE's $want, and is not this checkout's to stop" >&2
  fi
  echo "$why" >&2
  exit 1
}

if v=$(answers); then
  if is_wanted "$v"; then
    echo "engine-up: $ENGINE $want already running at http://127.0.0.1:$ENGINE_PORT/engine-rest; $(cockpit)"
    exit 0
  fi
  foreign "$v"
  echo "engine-up: the engine on port $ENGINE_PORT is $v, not $ENGINE's $want: stopping it"
  ENGINE_PORT="$ENGINE_PORT" "$here/engine-down.sh" --quiet || true
else
  foreign
fi

need_pkgs=()
command -v java >/dev/null 2>&1 || need_pkgs+=(openjdk-17-jdk-headless)
command -v mvn  >/dev/null 2>&1 || need_pkgs+=(maven)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "engine-up: installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  (flock 9; apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need_pkgs[@]}" >/dev/null) 9>"$run/apt.lock"
fi

# One build at a time (make up starts two engines in parallel), into target/<engine>.
build="$here/engine/target/$ENGINE"
jar="$build/engine-under-test.jar"
(
  flock 9
  stale=0
  [ -f "$jar" ] || stale=1
  if [ $stale = 0 ] && [ -n "$(find "$here/engine/pom.xml" "$here/engine/src" -newer "$jar" -print -quit)" ]; then stale=1; fi
  if [ $stale = 1 ]; then
    echo "engine-up: building the $ENGINE engine (Maven downloads are cached in ~/.m2)"
    t0=$(date +%s)
    # Maven 3.8 writes ANSI resets even with -q and style.color=never: stripped (pipefail
    # keeps its exit status).
    (cd "$here/engine" && mvn -B -q -Dstyle.color=never -P "$profile" "${mvn_props[@]}" package -DskipTests "-Dengine.build.directory=$build" 2>&1 | sed 's/\x1b\[[0-9;]*m//g')
    echo "engine-up: built in $(( $(date +%s) - t0 ))s"
  fi
) 9>"$run/build.lock"

ENGINE_PORT="$ENGINE_PORT" "$here/engine-down.sh" --quiet || true
foreign # while it built
cp "$jar" "$run/$name.jar.tmp" && mv -f "$run/$name.jar.tmp" "$run/$name.jar"
echo "engine-up: starting $ENGINE on port $ENGINE_PORT, database $ENGINE_DB, REST authentication $ENGINE_REST_AUTH (log: $log)"
t0=$(date +%s)
ENGINE_PORT="$ENGINE_PORT" ENGINE_REST_AUTH="$ENGINE_REST_AUTH" \
ENGINE_DB_URL="${ENGINE_DB_URL:-jdbc:postgresql://127.0.0.1:${PG_PORT:-5432}/$ENGINE_DB}" \
  setsid nohup java -Xms256m -Xmx768m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
  -jar "$run/$name.jar" >"$log" 2>&1 < /dev/null &
echo $! > "$pidfile"

# Ready: it answers with the version asked for (an answer with another one is not this
# engine's: it fails to bind, and exits).
deadline=$(( t0 + ENGINE_START_TIMEOUT ))
until v=$(answers) && is_wanted "$v"; do
  if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "engine-up: the engine on port $ENGINE_PORT exited during start-up; last log lines:" >&2
    tail -40 "$log" >&2; exit 1
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "engine-up: no answer with version $want from $url after ${ENGINE_START_TIMEOUT}s${v:+ (it answers $v)}; last log lines:" >&2
    tail -40 "$log" >&2; exit 1
  fi
  sleep 1
done
echo "engine-up: $ENGINE $want ready in $(( $(date +%s) - t0 ))s at http://127.0.0.1:$ENGINE_PORT/engine-rest (REST authentication $ENGINE_REST_AUTH); $(cockpit)"
