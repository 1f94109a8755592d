#!/usr/bin/env bash
# pg-up.sh: install (if needed) and start the local PostgreSQL cluster, then create the
# roles and databases the engine and the tests use. Idempotent; safe to run again.
#   PG_CLUSTER   the cluster (default main, the one make up starts); another name creates
#                a cluster of its own, as a lane of make engines-check does (lane.sh)
#   PG_PORT      its port (default 5432)
# Arguments name more engine databases (engine-up.sh's for the older Camunda releases).
set -euo pipefail

PG_CLUSTER="${PG_CLUSTER:-main}"
PG_PORT="${PG_PORT:-5432}"
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }

if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  echo "pg-up: installing PostgreSQL from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  # One apt at a time: make demo-up runs this beside rabbit-up.sh and kafka-up.sh.
  run="$(cd "$(dirname "$0")" && pwd)/.run"
  mkdir -p "$run"
  (flock 9; apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq postgresql >/dev/null) 9>"$run/apt.lock"
fi

ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
# One cluster set-up at a time on the machine: CI's lanes run this side by side, and a
# cluster pg_createcluster is still writing (its directory in /etc/postgresql without its
# postgresql.conf yet) makes every other pg_lsclusters fail ("Invalid data directory for
# cluster 15 lane_v720": a lane failed so in a local CI run).
exec 8>"${TMPDIR:-/tmp}/extworker-pg-clusters.lock"
flock 8
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -qx "$ver $PG_CLUSTER"; then
  pg_createcluster "$ver" "$PG_CLUSTER" --port "$PG_PORT" >/dev/null
fi
have_port=$(pg_lsclusters -h | awk -v v="$ver" -v c="$PG_CLUSTER" '$1==v && $2==c {print $3}')
if [ "$have_port" != "$PG_PORT" ]; then
  echo "pg-up: cluster $ver/$PG_CLUSTER listens on port $have_port, not PG_PORT=$PG_PORT" >&2; exit 1
fi
if ! pg_lsclusters -h | awk -v v="$ver" -v c="$PG_CLUSTER" '$1==v && $2==c {print $4}' | grep -q online; then
  # Four engines hold up to ten connections each, and the suite's packages run side by
  # side with pools of their own (the console and inbox consumers too): the default 100
  # runs out. Set before the start, so a running cluster is never restarted for it.
  pg_conftool "$ver" "$PG_CLUSTER" set max_connections 250
  pg_ctlcluster "$ver" "$PG_CLUSTER" start 8>&- # the server must not hold the lock
fi
flock -u 8

for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p "$PG_PORT" && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p "$PG_PORT" >/dev/null || { echo "pg-up: PostgreSQL did not become ready" >&2; exit 1; }

# role:password:database. The engine's schema lives in "camunda" (the second engine's, with
# REST authentication on, in "camunda_auth"; the third one's, which fault tests kill and
# restart, in "camunda_faults"; the fourth one's, which only the long-poll timing pins use,
# in "camunda_quiet"); the worker's ledger in "extworker".
specs=(camunda:camunda:camunda camunda:camunda:camunda_auth camunda:camunda:camunda_faults camunda:camunda:camunda_quiet extworker:extworker:extworker)
for db in "$@"; do specs+=("camunda:camunda:$db"); done
for spec in "${specs[@]}"; do
  IFS=: read -r role pass db <<<"$spec"
  as_postgres psql -q -v ON_ERROR_STOP=1 -p "$PG_PORT" -d postgres <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$role') THEN
    CREATE ROLE $role LOGIN PASSWORD '$pass';
  END IF;
END \$\$;
SQL
  if ! as_postgres psql -tA -p "$PG_PORT" -d postgres -c "SELECT 1 FROM pg_database WHERE datname='$db'" | grep -q 1; then
    as_postgres createdb -p "$PG_PORT" -O "$role" "$db"
  fi
done
# The ledger's two roles (docs/operators.md), which `extworker migrate` grants to, and
# logins the role tests connect as: a worker, two operators for the two-person rule, and
# the operator console's.
as_postgres psql -q -v ON_ERROR_STOP=1 -p "$PG_PORT" -d postgres <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_worker') THEN CREATE ROLE extworker_worker NOLOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_operator') THEN CREATE ROLE extworker_operator NOLOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_app') THEN
    CREATE ROLE extworker_app LOGIN PASSWORD 'extworker_app' IN ROLE extworker_worker;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_alice') THEN
    CREATE ROLE extworker_alice LOGIN PASSWORD 'extworker_alice' IN ROLE extworker_operator;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_bob') THEN
    CREATE ROLE extworker_bob LOGIN PASSWORD 'extworker_bob' IN ROLE extworker_operator;
  END IF;
  -- The operator console's role and login (docs/console.md): one login for every
  -- operator the console authenticates, told apart by operator name.
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_console') THEN
    CREATE ROLE extworker_console NOLOGIN IN ROLE extworker_operator;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_console_app') THEN
    CREATE ROLE extworker_console_app LOGIN PASSWORD 'extworker_console_app' IN ROLE extworker_console;
  END IF;
  -- The role matrix's (migrations/roles_test.go): a login in no role (what PUBLIC may
  -- do), and a second tenant's roles on the same cluster (EXTWORKER_DATABASE_ROLE_PREFIX
  -- tenant_b) with its console's login.
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'extworker_stranger') THEN
    CREATE ROLE extworker_stranger LOGIN PASSWORD 'extworker_stranger';
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tenant_b_worker') THEN CREATE ROLE tenant_b_worker NOLOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tenant_b_operator') THEN CREATE ROLE tenant_b_operator NOLOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tenant_b_console') THEN
    CREATE ROLE tenant_b_console NOLOGIN IN ROLE tenant_b_operator;
  END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tenant_b_console_app') THEN
    CREATE ROLE tenant_b_console_app LOGIN PASSWORD 'tenant_b_console_app' IN ROLE tenant_b_console;
  END IF;
END $$;
SQL
echo "pg-up: PostgreSQL $ver ready on 127.0.0.1:$PG_PORT (cluster $PG_CLUSTER; databases camunda, camunda_auth, camunda_faults, camunda_quiet, extworker${*:+, $*})"
