#!/usr/bin/env bash
# rabbit-up.sh: install (if needed) and start the local RabbitMQ broker, then create the
# user and virtual host the outbox and inbox tests use. Idempotent; safe to run again.
set -euo pipefail

AMQP_PORT="${AMQP_PORT:-5672}"
as_rabbit() { if [ "$(id -u)" = 0 ]; then runuser -u rabbitmq -- "$@"; else sudo -u rabbitmq "$@"; fi; }

# user:password:vhost
IFS=: read -r user pass vhost <<<"extworker:extworker:extworker"
ready() { echo "rabbit-up: RabbitMQ ready on 127.0.0.1:$AMQP_PORT (vhost $vhost, user $user)"; }

# Quick when all is there: one rabbitmqctl call (each starts an Erlang VM, seconds on a
# busy machine) finds the node running and the user's permissions on the vhost.
if command -v rabbitmqctl >/dev/null 2>&1 &&
  rabbitmqctl -q list_permissions -p "$vhost" 2>/dev/null | awk -v u="$user" '$1 == u && $2 == ".*" && $3 == ".*" && $4 == ".*" { ok = 1 } END { exit !ok }'; then
  ready
  exit 0
fi

if ! command -v rabbitmq-server >/dev/null 2>&1; then
  echo "rabbit-up: installing RabbitMQ from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  # One apt at a time: make demo-up runs this beside pg-up.sh and engine-up.sh.
  run="$(cd "$(dirname "$0")" && pwd)/.run"
  mkdir -p "$run"
  (flock 9; apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq rabbitmq-server >/dev/null) 9>"$run/apt.lock"
fi

if ! rabbitmqctl -q status >/dev/null 2>&1; then
  echo "rabbit-up: starting RabbitMQ on port $AMQP_PORT"
  # Without systemd: the broker detaches itself; its logs go to /var/log/rabbitmq.
  as_rabbit env RABBITMQ_NODE_PORT="$AMQP_PORT" HOME=/var/lib/rabbitmq rabbitmq-server -detached
fi
for _ in $(seq 1 120); do
  rabbitmqctl -q await_startup >/dev/null 2>&1 && break
  sleep 1
done
rabbitmqctl -q await_startup || { echo "rabbit-up: RabbitMQ did not start (see /var/log/rabbitmq)" >&2; exit 1; }

rabbitmqctl -q list_users | awk '{print $1}' | grep -qx "$user" || rabbitmqctl -q add_user "$user" "$pass" >/dev/null
rabbitmqctl -q list_vhosts | grep -qx "$vhost" || rabbitmqctl -q add_vhost "$vhost" >/dev/null
rabbitmqctl -q set_permissions -p "$vhost" "$user" ".*" ".*" ".*" >/dev/null
ready
