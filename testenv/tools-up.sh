#!/usr/bin/env bash
# tools-up.sh: install the command-line tools the tests call besides Go: promtool (Debian's
# `prometheus` package, 2.42 on bookworm), which checks the alert rules, runs their unit
# tests and lints a live worker's /metrics. Idempotent: quick when promtool is there.
# The package's Prometheus server is not started (a policy-rc.d forbids it during install).
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  echo "tools-up: $(promtool --version 2>&1 | head -1)"
  exit 0
fi
echo "tools-up: installing promtool from Debian's prometheus package"
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && added_policy=1
fi
trap '[ $added_policy = 1 ] && rm -f "$policy"' EXIT
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus >/dev/null
command -v promtool >/dev/null 2>&1 || { echo "tools-up: the prometheus package installed no promtool" >&2; exit 1; }
echo "tools-up: $(promtool --version 2>&1 | head -1)"
