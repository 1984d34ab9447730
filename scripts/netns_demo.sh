#!/usr/bin/env bash
# The multi-machine path on one host: two network namespaces joined by a veth pair stand in for two
# machines. Rank 0 runs in one (and hosts the TCPStore, as torchrun's rank 0 does without an agent),
# rank 1 in the other, with torchrun's variables (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK)
# and Gloo over TCP on the veth interface. The same training is then run on this machine with
# `cemfrac launch --nproc 2`, and the loss of every step must be equal (bitwise: docs/distributed.md).
#
#   sudo scripts/netns_demo.sh [EXE [WORKDIR [-- ARGS...]]]
#
# EXE defaults to build/tools/cemfrac, WORKDIR to a fresh temporary directory. ARGS are the program
# arguments of one training run in which the word {out} stands for its run directory; the default is
# 3 steps of configs/tiny-llama.toml on data/brown. Needs root (ip netns, ip link). Everything it
# creates (namespaces, interfaces, processes) is removed on exit, also on failure or Ctrl-C.
# Exit status: 0 equal, 1 different or a run failed, 2 cannot set up the namespaces.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
exe=${1:-$here/build/tools/cemfrac}
work=${2:-$(mktemp -d /tmp/cemfrac-netns-XXXXXX)}
shift $(($# < 2 ? $# : 2))
if [[ ${1:-} == -- ]]; then shift; fi
args=("$@")
if [[ ${#args[@]} -eq 0 ]]; then
  args=(--threads 1 train --config "$here/configs/tiny-llama.toml" --quiet --out '{out}'
        --set "data.path=$here/data/brown" --set model.vocab_size=4096 --set train.steps=3
        --set train.warmup_steps=1
        --set train.log_every=1 --set train.eval_every=0 --set train.eval_tokens=1024
        --set train.checkpoint_every=0)
fi
mkdir -p "$work"

tag=cf$$
ns0=${tag}a ns1=${tag}b
if0=${tag}v0 if1=${tag}v1  # at most 15 characters
addr0=10.231.7.1 addr1=10.231.7.2
pids=()

cleanup() {
  for p in "${pids[@]:-}"; do [[ -n $p ]] && kill "$p" 2>/dev/null || true; done
  ip netns del "$ns0" 2>/dev/null || true  # deleting a namespace deletes its end of the veth pair
  ip netns del "$ns1" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# args with {out} replaced by $1
run_args() {
  local a out=()
  for a in "${args[@]}"; do out+=("${a//\{out\}/$1}"); done
  printf '%s\0' "${out[@]}"
}

setup() {
  ip netns add "$ns0" && ip netns add "$ns1" &&
    ip link add "$if0" type veth peer name "$if1" &&
    ip link set "$if0" netns "$ns0" && ip link set "$if1" netns "$ns1" &&
    ip -n "$ns0" addr add "$addr0/24" dev "$if0" && ip -n "$ns1" addr add "$addr1/24" dev "$if1" &&
    ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
    ip -n "$ns0" link set "$if0" up && ip -n "$ns1" link set "$if1" up
}
if ! setup 2>"$work/setup.err"; then
  echo "netns_demo: cannot create the network namespaces: $(head -n1 "$work/setup.err")" >&2
  exit 2
fi

# One rank in its namespace: the environment a user sets by hand on each machine.
start_rank() {
  local rank=$1 ns=$2 ifname=$3 out=$4
  mapfile -d '' -t a < <(run_args "$out")
  ip netns exec "$ns" env MASTER_ADDR=$addr0 MASTER_PORT=29500 RANK=$rank WORLD_SIZE=2 \
    LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GLOO_SOCKET_IFNAME=$ifname \
    CEMFRAC_CONNECT_TIMEOUT=30 CEMFRAC_COLLECTIVE_TIMEOUT=30 \
    "$exe" "${a[@]}" >"$work/rank$rank.out" 2>"$work/rank$rank.err" &
  pids+=($!)
}
start_rank 0 "$ns0" "$if0" "$work/two-machines"
start_rank 1 "$ns1" "$if1" "$work/rank1-unused"
status=0
for i in 0 1; do
  if ! wait "${pids[$i]}"; then
    echo "netns_demo: rank $i failed: $(tail -n1 "$work/rank$i.err")" >&2
    status=1
  fi
done
pids=()
[[ $status -eq 0 ]] || exit 1

mapfile -d '' -t a < <(run_args "$work/one-machine")
if ! "$exe" launch --nproc 2 -- "${a[@]}" >"$work/one.out" 2>"$work/one.err"; then
  echo "netns_demo: the one-machine run failed: $(tail -n1 "$work/one.err")" >&2
  exit 1
fi

losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl"; }
two=$(losses "$work/two-machines") one=$(losses "$work/one-machine")
echo "two namespaces ($addr0 <-> $addr1 over $if0/$if1, Gloo over TCP):"
echo "$two" | sed 's/^/  /'
if [[ -n $two && $two == "$one" ]]; then
  echo "netns_demo: equal to cemfrac launch --nproc 2 on one machine ($(echo "$two" | wc -l) steps; $work)"
  exit 0
fi
echo "netns_demo: DIFFERENT from the one-machine run:" >&2
echo "$one" | sed 's/^/  /' >&2
exit 1
