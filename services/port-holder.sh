# port-holder.sh: sourced by engine-up.sh and kafka-up.sh. A port the environment needs
# may be held by a process this checkout did not start (another checkout's engine, a
# leftover server): such a process is never stopped, and never taken for the service
# asked for; the script names it and says how to free the port instead.
#
#   port_held PORT             true when a process listens on TCP PORT (any address)
#   port_pid PORT              the listener's pid, empty when ss cannot tell (not root)
#   refuse_foreign_holder WHO PORT PIDFILE HOW_TO_STOP
#                              when PORT is held by a process other than the one in
#                              PIDFILE (the one this checkout started), print on stderr
#                              who holds it (pid, command line, working directory; for
#                              another checkout's service, that checkout and
#                              HOW_TO_STOP, a command run there with <dir> replaced by it)
#                              and return 1; else return 0

# With ss (iproute2) when there is one, else from /proc: the listening socket's inode in
# /proc/net/tcp{,6} (state 0A), then the process with a descriptor on it.
port_held() {
  if command -v ss >/dev/null 2>&1; then
    [ -n "$(ss -ltnH "sport = :$1" 2>/dev/null)" ]
  else
    [ -n "$(listen_inodes "$1")" ]
  fi
}
port_pid() {
  if command -v ss >/dev/null 2>&1; then
    ss -ltnpH "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2
    return
  fi
  local inode fd
  for inode in $(listen_inodes "$1"); do
    for fd in /proc/[0-9]*/fd/*; do
      if [ "$(readlink "$fd" 2>/dev/null)" = "socket:[$inode]" ]; then
        fd=${fd#/proc/}; echo "${fd%%/*}"; return
      fi
    done
  done
}
listen_inodes() {
  awk -v p="$(printf ':%04X' "$1")" '$4 == "0A" && substr($2, length($2) - 4) == p { print $10 }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

refuse_foreign_holder() {
  local who=$1 port=$2 pidfile=$3 how=$4 pid full cmd cwd mine="" checkout
  port_held "$port" || return 0
  [ -f "$pidfile" ] && mine=$(cat "$pidfile" 2>/dev/null)
  pid=$(port_pid "$port")
  if [ -z "$pid" ]; then
    # ss shows no pid for another user's process: ours only if ours still runs.
    if [ -n "$mine" ] && kill -0 "$mine" 2>/dev/null; then return 0; fi
    echo "$who: port $port is held by a process this checkout did not start (sudo ss -ltnp 'sport = :$port' names it): stop it, or pick another port" >&2
    return 1
  fi
  [ "$pid" = "$mine" ] && return 0
  full=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | sed 's/ *$//' || true)
  cmd=${full:0:200}; [ ${#full} -le 200 ] || cmd="$cmd ..."

  cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null || true)
  echo "$who: port $port is held by pid $pid, which this checkout ($(cd "$(dirname "$pidfile")/../.." && pwd)) did not start: ${cmd:-?}${cwd:+ (working directory $cwd)}" >&2
  # A service of another checkout runs from its services/.run.
  checkout=$(grep -o '/[^ :=]*/services/\.run/' <<<"$full" | head -1 || true)
  checkout=${checkout%/services/.run/}
  if [ -n "$checkout" ]; then
    echo "$who: it is the checkout $checkout's: stop it there with: ${how//<dir>/$checkout}, or kill $pid" >&2
  else
    echo "$who: stop it (kill $pid), or pick another port" >&2
  fi
  return 1
}
