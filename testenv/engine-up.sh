#!/usr/bin/env bash
# engine-up.sh: build (when needed) and start the engine under test, then wait until
# GET /engine-rest/version answers. Idempotent: an engine that already answers is left alone.
#
#   ENGINE=camunda7|operaton|cibseven   which engine to build and run (default camunda7)
#   ENGINE_PORT                          HTTP port (default 8080)
#   ENGINE_START_TIMEOUT                 seconds to wait for readiness (default 300)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
ENGINE="${ENGINE:-camunda7}"
ENGINE_PORT="${ENGINE_PORT:-8080}"
ENGINE_START_TIMEOUT="${ENGINE_START_TIMEOUT:-300}"
url="http://127.0.0.1:${ENGINE_PORT}/engine-rest/version"
run="$here/.run"
mkdir -p "$run"

case "$ENGINE" in camunda7|operaton|cibseven) ;; *)
  echo "engine-up: ENGINE must be camunda7, operaton or cibseven, not '$ENGINE'" >&2; exit 2 ;;
esac

if curl -fsS -m 2 "$url" >/dev/null 2>&1; then
  echo "engine-up: engine already answering at $url: $(curl -fsS -m 2 "$url")"
  exit 0
fi

need_pkgs=()
command -v java >/dev/null 2>&1 || need_pkgs+=(openjdk-17-jdk-headless)
command -v mvn  >/dev/null 2>&1 || need_pkgs+=(maven)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "engine-up: installing ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

jar="$here/engine/target/engine-under-test.jar"
stamp="$here/engine/target/.built-for"
stale=0
[ -f "$jar" ] || stale=1
[ -f "$stamp" ] && [ "$(cat "$stamp")" = "$ENGINE" ] || stale=1
if [ $stale = 0 ] && [ -n "$(find "$here/engine/pom.xml" "$here/engine/src" -newer "$jar" -print -quit)" ]; then stale=1; fi
if [ $stale = 1 ]; then
  echo "engine-up: building the $ENGINE engine (Maven downloads are cached in ~/.m2)"
  t0=$(date +%s)
  (cd "$here/engine" && mvn -B -q -P "$ENGINE" package -DskipTests)
  echo "$ENGINE" > "$stamp"
  echo "engine-up: built in $(( $(date +%s) - t0 ))s"
fi

"$here/engine-down.sh" --quiet || true
echo "engine-up: starting $ENGINE on port $ENGINE_PORT (log: $run/engine.log)"
t0=$(date +%s)
ENGINE_PORT="$ENGINE_PORT" setsid nohup java -Xms256m -Xmx768m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
  -jar "$jar" >"$run/engine.log" 2>&1 < /dev/null &
echo $! > "$run/engine.pid"

deadline=$(( t0 + ENGINE_START_TIMEOUT ))
until curl -fsS -m 2 "$url" >/dev/null 2>&1; do
  if ! kill -0 "$(cat "$run/engine.pid")" 2>/dev/null; then
    echo "engine-up: the engine exited during start-up; last log lines:" >&2
    tail -40 "$run/engine.log" >&2; exit 1
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "engine-up: no answer from $url after ${ENGINE_START_TIMEOUT}s; last log lines:" >&2
    tail -40 "$run/engine.log" >&2; exit 1
  fi
  sleep 1
done
echo "engine-up: $ENGINE $(curl -fsS -m 2 "$url") ready in $(( $(date +%s) - t0 ))s at http://127.0.0.1:$ENGINE_PORT/engine-rest"
