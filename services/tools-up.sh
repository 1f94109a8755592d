#!/usr/bin/env bash
# tools-up.sh: install the command-line tools the tests call besides Go:
#   promtool (Debian's `prometheus` package, 2.42 on bookworm), which checks the alert
#     rules, runs their unit tests and lints a live worker's /metrics. The package's
#     Prometheus server is not started (a policy-rc.d forbids it during install);
#   bin/jaeger, Jaeger all-in-one, the collector the traces tests send OTLP to
#     (testenv.Jaeger), built from its own module, tools/jaeger, so that its hundreds of
#     modules stay out of the main go.mod. Rebuilt when tools/jaeger/go.mod names
#     another version than the binary's;
#   chromium (Debian's package), the headless browser the Cockpit and console tests
#     drive with chromedp (testenv.Browser).
# Idempotent: quick when all are there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
GO="${GO:-go}"

if command -v promtool >/dev/null 2>&1; then
  echo "tools-up: $(promtool --version 2>&1 | head -1)"
else
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
fi

if command -v chromium >/dev/null 2>&1; then
  echo "tools-up: $(chromium --version 2>/dev/null | head -1)"
else
  echo "tools-up: installing chromium from Debian's package (headless browser tests)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium >/dev/null
  command -v chromium >/dev/null 2>&1 || { echo "tools-up: the chromium package installed no chromium" >&2; exit 1; }
  echo "tools-up: $(chromium --version 2>/dev/null | head -1)"
fi

jaeger="$root/bin/jaeger"
want="$(awk '$1 == "github.com/jaegertracing/jaeger" { print $2 }' "$root/tools/jaeger/go.mod")"
have=""
if [ -x "$jaeger" ]; then
  have="$("$GO" version -m "$jaeger" 2>/dev/null | awk '($1 == "mod" || $1 == "dep") && $2 == "github.com/jaegertracing/jaeger" { print $3 }')"
fi
if [ -n "$want" ] && [ "$have" = "$want" ]; then
  echo "tools-up: bin/jaeger (Jaeger $have)"
else
  echo "tools-up: building bin/jaeger (Jaeger $want, tools/jaeger): several minutes the first time"
  start=$(date +%s)
  mkdir -p "$root/bin"
  (cd "$root/tools/jaeger" && "$GO" build -o "$jaeger" github.com/jaegertracing/jaeger/cmd/jaeger)
  echo "tools-up: bin/jaeger (Jaeger $want) built in $(( $(date +%s) - start ))s"
fi
