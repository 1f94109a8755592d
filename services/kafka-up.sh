#!/usr/bin/env bash
# kafka-up.sh: start the local Apache Kafka 4.1.1 broker, a single KRaft node (broker and
# controller in one JVM) on loopback, run from its Maven Central jars (services/kafka/pom.xml,
# resolved into ~/.m2) with the machine's Java 17; then wait until it answers a metadata
# request listing itself (the broker is up and unfenced). Idempotent: a broker that already
# answers is left alone. Its data directory is formatted once and kept across restarts.
#
#   bash services/kafka-up.sh            start the broker (make up: make kafka-up)
#   bash services/kafka-up.sh classpath  print the broker's class path, resolving the jars
#                                        first when needed: internal/testenv runs the tests'
#                                        private brokers (StartKafka) from it
#
#   KAFKA_PORT             the client (PLAINTEXT) port (default 9092)
#   KAFKA_CONTROLLER_PORT  the KRaft controller's port (default KAFKA_PORT+1, 9093)
#   KAFKA_HEAP             the JVM's heap (default -Xms128m -Xmx512m)
#   KAFKA_START_TIMEOUT    seconds to wait for readiness (default 180)
#
# The settings every local broker shares are in services/kafka/broker.properties; this one's
# configuration, data and files are in services/.run: kafka-<port>/server.properties,
# kafka-<port>/data (the log and the KRaft metadata), kafka-<port>.pid and kafka-<port>.log.
# services/kafka-down.sh stops it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"
KAFKA_HEAP="${KAFKA_HEAP:--Xms128m -Xmx512m}"
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-180}"
KAFKA_VERSION=4.1.1
run="$here/.run"
mkdir -p "$run"
cpfile="$run/kafka.classpath"

# classpath writes the broker's class path to $cpfile, from Maven (one resolution at a time)
# when the file is missing, older than the pom, or names a jar that is gone from ~/.m2.
resolve_classpath() {
  (
    flock 9
    stale=0
    if [ ! -s "$cpfile" ] || [ "$here/kafka/pom.xml" -nt "$cpfile" ]; then
      stale=1
    else
      IFS=: read -r -a jars <"$cpfile" || true # no newline at its end
      for jar in "${jars[@]}"; do [ -f "$jar" ] || { stale=1; break; }; done
    fi
    [ $stale = 1 ] || exit 0
    need_pkgs=()
    command -v java >/dev/null 2>&1 || need_pkgs+=(openjdk-17-jdk-headless)
    command -v mvn >/dev/null 2>&1 || need_pkgs+=(maven)
    if [ ${#need_pkgs[@]} -gt 0 ]; then
      echo "kafka-up: installing ${need_pkgs[*]}" >&2
      export DEBIAN_FRONTEND=noninteractive
      (flock 8; apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need_pkgs[@]}" >/dev/null) 8>"$run/apt.lock"
    fi
    echo "kafka-up: resolving Kafka $KAFKA_VERSION's jars (Maven downloads are cached in ~/.m2)" >&2
    t0=$(date +%s)
    mvn -B -q -Dstyle.color=never -f "$here/kafka/pom.xml" dependency:build-classpath -Dmdep.outputFile="$cpfile.tmp" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2
    mv -f "$cpfile.tmp" "$cpfile"
    echo "kafka-up: resolved in $(($(date +%s) - t0))s" >&2
  ) 9>"$run/kafka-classpath.lock"
}

if [ "${1:-}" = classpath ]; then
  resolve_classpath
  cat "$cpfile"
  exit 0
fi
[ $# = 0 ] || { echo "usage: kafka-up.sh [classpath]" >&2; exit 2; }

# answers: the broker on $1 answers a Metadata request (v4: Kafka 4 serves v4 and later)
# with at least one broker, which it lists only once it is unfenced. The request: api key 3,
# version 4, correlation id 1, no client id, no topics, no auto-creation. The answer's
# first 16 bytes: its size, the correlation id, throttle_time_ms and the brokers' count.
answers() {
  timeout 3 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "\x00\x00\x00\x0f\x00\x03\x00\x04\x00\x00\x00\x01\xff\xff\x00\x00\x00\x00\x00" >&3
    read -r -a b < <(head -c 16 <&3 | od -An -v -tu1 | tr -s " \n" "  ")
    [ "${#b[@]}" = 16 ] && [ "${b[*]:4:4}" = "0 0 0 1" ] && [ "${b[*]:12:4}" != "0 0 0 0" ]
  ' _ "$1" 2>/dev/null
}

name="kafka-$KAFKA_PORT"
pidfile="$run/$name.pid"; log="$run/$name.log"
dir="$run/$name"; data="$dir/data"; conf="$dir/server.properties"

if answers "$KAFKA_PORT"; then
  echo "kafka-up: Kafka already answering on 127.0.0.1:$KAFKA_PORT (data: $data)"
  exit 0
fi

# A port held by a process this checkout did not start (another checkout's broker, a
# leftover server) is named, with how to stop it, and left alone.
. "$here/port-holder.sh"
for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
  refuse_foreign_holder kafka-up "$p" "$pidfile" "KAFKA_PORT=$KAFKA_PORT bash <dir>/services/kafka-down.sh" || exit 1
done

resolve_classpath
cp=$(cat "$cpfile")
# A broker of ours that runs but does not answer (hung, or left from a failed start) goes.
KAFKA_PORT="$KAFKA_PORT" "$here/kafka-down.sh" --quiet || true

mkdir -p "$data"
{
  cat "$here/kafka/broker.properties"
  echo
  echo "# services/kafka-up.sh: the broker on port $KAFKA_PORT"
  echo "listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT"
  echo "advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT"
  echo "controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT"
  echo "log.dirs=$data"
} >"$conf.tmp"
mv -f "$conf.tmp" "$conf"

jvm=(java $KAFKA_HEAP -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true
  "-Dlog4j2.configurationFile=$here/kafka/log4j2.properties" -cp "$cp")

# Formatted once: a new cluster id, this node the KRaft quorum's only voter (--standalone).
if [ ! -f "$data/meta.properties" ]; then
  cluster=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
  echo "kafka-up: formatting $data (cluster $cluster)"
  "${jvm[@]}" kafka.tools.StorageTool format --standalone -t "$cluster" -c "$conf" >"$dir/format.log" 2>&1 ||
    { echo "kafka-up: formatting $data failed:" >&2; tail -20 "$dir/format.log" >&2; exit 1; }
fi

echo "kafka-up: starting Kafka $KAFKA_VERSION on 127.0.0.1:$KAFKA_PORT, controller on $KAFKA_CONTROLLER_PORT (log: $log)"
t0=$(date +%s)
setsid nohup "${jvm[@]}" kafka.Kafka "$conf" >"$log" 2>&1 </dev/null &
echo $! >"$pidfile"

deadline=$((t0 + KAFKA_START_TIMEOUT))
until answers "$KAFKA_PORT"; do
  if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "kafka-up: the broker on port $KAFKA_PORT exited during start-up; last log lines:" >&2
    tail -40 "$log" >&2; exit 1
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "kafka-up: no answer on 127.0.0.1:$KAFKA_PORT after ${KAFKA_START_TIMEOUT}s; last log lines:" >&2
    tail -40 "$log" >&2; exit 1
  fi
  sleep 0.5
done
echo "kafka-up: Kafka $KAFKA_VERSION ready on 127.0.0.1:$KAFKA_PORT in $(($(date +%s) - t0))s"
