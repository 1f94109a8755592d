#!/usr/bin/env bash
# kafka-down.sh: stop the Kafka brokers started by kafka-up.sh: the one on KAFKA_PORT when it
# is set, else all of them (SIGTERM: a controlled shutdown, which flushes the logs; SIGKILL
# after KAFKA_STOP_TIMEOUT seconds, default 30). Their data directories stay. Idempotent.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
quiet=0; [ "${1:-}" = --quiet ] && quiet=1
KAFKA_STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
if [ -n "${KAFKA_PORT:-}" ]; then
  pidfiles=("$here/.run/kafka-$KAFKA_PORT.pid")
else
  shopt -s nullglob
  pidfiles=("$here"/.run/kafka-*.pid)
fi
# running: the process exists, is not a zombie, and is a broker's JVM (kafka.Kafka), not
# another process that was given its pid since.
running() {
  kill -0 "$1" 2>/dev/null && ! ps -o stat= -p "$1" 2>/dev/null | grep -q '^Z' &&
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q ' kafka\.Kafka '
}
stopped=0
for pidfile in "${pidfiles[@]}"; do
  if [ -f "$pidfile" ] && pid=$(cat "$pidfile") && running "$pid"; then
    kill "$pid"
    for _ in $(seq 1 $((KAFKA_STOP_TIMEOUT * 2))); do running "$pid" || break; sleep 0.5; done
    if running "$pid"; then
      kill -9 "$pid" 2>/dev/null || true
      [ $quiet = 1 ] || echo "kafka-down: no exit ${KAFKA_STOP_TIMEOUT}s after SIGTERM: SIGKILLed"
    fi
    stopped=1
    [ $quiet = 1 ] || echo "kafka-down: stopped Kafka (pid $pid, $(basename "$pidfile" .pid))"
  fi
  rm -f "$pidfile"
done
[ $quiet = 1 ] || [ $stopped = 1 ] || echo "kafka-down: no Kafka running"
