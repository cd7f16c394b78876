#!/usr/bin/env bash
# A cluster of H hosts on one machine, for tests and benchmarks across hosts
# (tests/README.md). Each host is a network namespace with its own address
# and its own veth link to a hub namespace, shaped with tc tbf to RATE in
# both directions; the hub bridges the links and hosts the rendezvous.
# Traffic stays inside these namespaces. Needs root (ip netns, tc).
#
#   scripts/cluster.sh up H RATE [CC] hosts 0..H-1 (e.g. `up 2 2gbit`); every
#                                     namespace's TCP congestion control is CC
#                                     (default cubic, whatever the machine's)
#   scripts/cluster.sh down           kill everything inside, remove it all
#   scripts/cluster.sh exec I CMD...  run CMD on host I, with SMDDP_HOST_ID=h<I>
#                                     (namespaces share the hostname)
#   scripts/cluster.sh hub CMD...     run CMD in the hub (e.g. a TCPStore)
#   scripts/cluster.sh link I down|up take host I's link down or up
#   scripts/cluster.sh kill I         SIGKILL every process on host I
#   scripts/cluster.sh addr I|hub     print an address
#   scripts/cluster.sh burst RATE     print the tbf bucket (bytes) `up` gives RATE
#   scripts/cluster.sh cc I           print host I's TCP congestion control
#   scripts/cluster.sh status
#
# Names start with $SMDDP_CLUSTER (default "smx"): give each cluster that
# may run at the same time as another (a second worktree, a second test
# run) its own prefix. Inside, every cluster uses the same addresses
# (10.77.0.1 hub, 10.77.0.(10+I) host I, eth0 on each host); namespaces
# keep them apart.
set -euo pipefail

P="${SMDDP_CLUSTER:-smx}"
HUB="$P-hub"
SUBNET=10.77.0
HUB_ADDR="$SUBNET.1"

host_ns() { echo "$P-h$1"; }
host_addr() { echo "$SUBNET.$((10 + $1))"; }

die() { echo "cluster.sh: $*" >&2; exit 1; }

# tbf needs a bucket of at least one (GSO-sized) packet, and about 10 ms of
# traffic to reach its rate.
burst_for() {
  local rate="$1" n unit bits
  n="${rate%%[a-zA-Z]*}"
  unit="${rate#"$n"}"
  case "$unit" in
    bit|"") bits="$n" ;;
    kbit) bits=$((n * 1000)) ;;
    mbit) bits=$((n * 1000000)) ;;
    gbit) bits=$((n * 1000000000)) ;;
    *) die "RATE '$rate': use bit, kbit, mbit or gbit" ;;
  esac
  local bytes=$((bits / 800))
  ((bytes < 262144)) && bytes=262144
  echo "$bytes"
}

# TCP congestion control is per namespace, and a new one starts with the
# machine's. That choice changes what the cluster measures: under bbr (this
# VM's default) a DDP step at 4 x 1 took 140-475 ms longer in 11 of 24
# steps, under cubic in none (a flow stalling in bbr's ProbeRTT would fit)
# (docs/notes/2026-11-27-congestion-control.md). So `up` sets it, cubic
# (Linux's default) unless told otherwise, and results name it.
ensure_cc() {
  local cc="$1" avail
  avail="$(cat /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null || true)"
  [[ " $avail " == *" $cc "* ]] ||
    die "congestion control '$cc' is not available here (tcp_available_congestion_control: ${avail:-unreadable})"
  # Outside the root namespace the kernel sets only an allowed one as a
  # namespace's default, and refuses the rest with EPERM (seen on a 6.18
  # kernel whose allowed list was "reno bbr"). Allowing one more only lets
  # namespaces and unprivileged sockets choose it; nothing else changes.
  local allowed f=/proc/sys/net/ipv4/tcp_allowed_congestion_control
  allowed="$(cat "$f" 2>/dev/null || true)"
  if [[ " $allowed " != *" $cc "* ]]; then
    sysctl -qw net.ipv4.tcp_allowed_congestion_control="${allowed:+$allowed }$cc" ||
      die "congestion control '$cc' is not allowed in namespaces here ($f: ${allowed:-unreadable}), and adding it failed"
  fi
}

namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-(hub|h[0-9]+)$" || true; }

cmd_down() {
  local ns
  for ns in $(namespaces); do
    # Every process inside first: a namespace with a live process stays.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  done
  for ns in $(namespaces); do
    ip netns del "$ns" 2>/dev/null || true
  done
}

cmd_up() {
  local hosts="${1:-}" rate="${2:-}" cc="${3:-cubic}"
  [[ "$hosts" =~ ^[0-9]+$ && "$hosts" -ge 1 && "$hosts" -le 200 ]] || die "up H RATE: H in 1..200"
  [[ -n "$rate" ]] || die "up H RATE: RATE such as 2gbit"
  ensure_cc "$cc"
  local burst
  burst="$(burst_for "$rate")"
  [[ -z "$(namespaces)" ]] || die "a cluster named '$P' exists: 'down' it, or set SMDDP_CLUSTER"
  trap 'cmd_down' ERR
  ip netns add "$HUB"
  ip netns exec "$HUB" sysctl -qw net.ipv4.tcp_congestion_control="$cc"
  ip -n "$HUB" link set lo up
  ip -n "$HUB" link add br0 type bridge
  ip -n "$HUB" addr add "$HUB_ADDR/24" dev br0
  ip -n "$HUB" link set br0 up
  local i ns
  for ((i = 0; i < hosts; i++)); do
    ns="$(host_ns "$i")"
    ip netns add "$ns"
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control="$cc"
    ip -n "$ns" link set lo up
    # Both ends are made inside namespaces: no name in the root namespace
    # can collide with anyone else's.
    ip -n "$ns" link add eth0 type veth peer name "h$i" netns "$HUB"
    ip -n "$ns" addr add "$(host_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$HUB" link set "h$i" master br0
    ip -n "$HUB" link set "h$i" up
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    ip netns exec "$HUB" tc qdisc add dev "h$i" root tbf rate "$rate" burst "$burst" latency 50ms
  done
  trap - ERR
  echo "cluster '$P': hub $HUB_ADDR ($HUB), $hosts host(s) at $rate, tcp $cc:"
  for ((i = 0; i < hosts; i++)); do echo "  h$i $(host_addr "$i") ($(host_ns "$i"), eth0)"; done
}

cmd_exec() {
  local i="${1:-}"
  shift || true
  [[ "$i" =~ ^[0-9]+$ ]] || die "exec I CMD..."
  exec ip netns exec "$(host_ns "$i")" env SMDDP_HOST_ID="h$i" "$@"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  exec) shift; cmd_exec "$@" ;;
  hub) shift; exec ip netns exec "$HUB" "$@" ;;
  link)
    [[ "${2:-}" =~ ^[0-9]+$ && "${3:-}" =~ ^(up|down)$ ]] || die "link I up|down"
    ip -n "$(host_ns "$2")" link set eth0 "$3"
    ;;
  kill)
    [[ "${2:-}" =~ ^[0-9]+$ ]] || die "kill I"
    ip netns pids "$(host_ns "$2")" | xargs -r kill -9
    ;;
  addr)
    if [[ "${2:-}" == hub ]]; then echo "$HUB_ADDR"; else host_addr "${2:?addr I|hub}"; fi
    ;;
  burst) burst_for "${2:?burst RATE}" ;;
  cc)
    [[ "${2:-}" =~ ^[0-9]+$ ]] || die "cc I"
    ip netns exec "$(host_ns "$2")" cat /proc/sys/net/ipv4/tcp_congestion_control
    ;;
  status) namespaces ;;
  *) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
