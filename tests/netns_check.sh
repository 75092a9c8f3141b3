#!/usr/bin/env bash
# Real multi-node runs on one machine (CTest MultiNode.TwoNamespacesTrainAsOneJob): two network
# namespaces joined by a veth pair, addresses that exist only inside them (10.231.<n>.1 and .2),
# one `trainer launch --nnodes 2` per namespace, the run directory on the shared file system.
#
#   netns_check.sh TRAINER SOURCE_DIR
#
# Scenarios:
#   1. ddp and fsdp across the two nodes: every loss equals a 2-process run on one node's loopback.
#      Then a GPT with tensor parallelism 2 within each node (2 processes a node) and ddp, then
#      fsdp, across the nodes: every loss equals a 4-process run on one node.
#   2. node 1 killed outright (launcher and worker): node 0 stops at once with one line naming the
#      step, the peer and dist.timeout_s; node 1 hung (its processes stopped, the link silent): node
#      0 stops at the collective timeout, dist.timeout_s.
#   3. node 1's worker killed with --max-restarts 1 on both nodes: both restart, resume from the
#      last checkpoint, and end with the uninterrupted run's losses.
#   4. 5 ms latency and 1% loss on the link (tc netem; a tc tbf rate limit where the kernel has no
#      netem): trains to the same losses, slower.
# Needs root and ip(8) with network namespaces; exits 77 (skipped) with the reason otherwise.
set -uo pipefail
TRAINER=$1
SOURCE=$2
skip() { echo "skipped: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "network namespaces need root (uid $(id -u))"
command -v ip >/dev/null || skip "no ip(8)"
TAG=$$
NS0=trn0_$TAG NS1=trn1_$TAG
NET=10.231.$((TAG % 250)).
ip netns add "$NS0" 2>/dev/null || skip "ip netns add is not permitted here"
cleanup() {
  for ns in "$NS0" "$NS1"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$TMP"
}
TMP=$(mktemp -d)
trap cleanup EXIT
ip netns add "$NS1" || skip "ip netns add is not permitted here"
ip link add "v0_$TAG" type veth peer name "v1_$TAG" || skip "no veth pairs here"
ip link set "v0_$TAG" netns "$NS0"
ip link set "v1_$TAG" netns "$NS1"
ip -n "$NS0" addr add "${NET}1/24" dev "v0_$TAG"
ip -n "$NS1" addr add "${NET}2/24" dev "v1_$TAG"
for n in 0 1; do
  ns=NS$n
  ip -n "${!ns}" link set lo up
  ip -n "${!ns}" link set "v${n}_$TAG" up
done

FAILURES=()
fail() { FAILURES+=("$*"); echo "FAIL: $*"; }
ARGS=(--config "$SOURCE/configs/synthetic.yaml" --set model.hidden=[64] --set data.batch_size=16
      --set train.max_steps=40 --set train.epochs=10 --set run.log_every=1
      --set run.checkpoint_every=5 --set run.progress=never --set run.tensorboard=false
      --set data.workers=0 --set run.threads=1 --set dist.timeout_s=8 --set dist.init_timeout_s=30)
# Scenarios 2 and 3 kill a node mid-run: 40 ms a batch makes the run last about 2 s.
SLOW=(--set data.throttle_ms=40)
now_ms() { date +%s%3N; }
PORT=29641
# nodes RUN_DIR LAUNCH_FLAGS... -- TRAINER_FLAGS...: one launcher per namespace, waits for both;
# their output in RUN_DIR.node<n>.log, their exit codes in RC0 and RC1.
nodes() {
  local dir=$1
  shift
  local launch=() rest=() nproc=${NPROC:-1}
  local -n base=${BASE:-ARGS}  # the trainer flags every run of a scenario shares
  while [[ $# -gt 0 && $1 != -- ]]; do launch+=("$1"); shift; done
  shift
  rest=("$@")
  PORT=$((PORT + 1))
  for n in 0 1; do
    local ns=NS$n
    ip netns exec "${!ns}" "$TRAINER" launch --nnodes 2 --node-rank $n --nproc-per-node "$nproc" \
      --master-addr "${NET}1" --master-port $PORT "${launch[@]}" -- "${base[@]}" "${rest[@]}" \
      --run-dir "$dir" > "$dir.node$n.log" 2>&1 &
    eval "PID$n=\$!"
  done
}
finish() { wait "$PID0"; RC0=$?; wait "$PID1"; RC1=$?; }
losses() { python3 -c 'import json,sys; print(" ".join(repr(r["loss"]) for r in map(json.loads, open(sys.argv[1])) if r["split"] == "train"))' "$1/metrics.jsonl" 2>/dev/null; }

# 1. ddp and fsdp across the nodes, against a 2-process run on one node.
for strategy in ddp fsdp; do
  "$TRAINER" launch --standalone --nproc-per-node 2 -- "${ARGS[@]}" --set dist.strategy=$strategy \
    --run-dir "$TMP/local_$strategy" > "$TMP/local_$strategy.log" 2>&1 || fail "local $strategy run"
  start=$(now_ms)
  nodes "$TMP/two_$strategy" -- --set dist.strategy=$strategy
  finish
  [[ $RC0 == 0 && $RC1 == 0 ]] || fail "$strategy across nodes: exit $RC0/$RC1: $(tail -3 "$TMP/two_$strategy.node0.log")"
  a=$(losses "$TMP/local_$strategy") b=$(losses "$TMP/two_$strategy")
  steps=$(wc -w <<<"$b")
  [[ $strategy == ddp ]] && FAST=$(($(now_ms) - start))
  echo "1. $strategy across 2 namespaces: $steps steps in $(($(now_ms) - start)) ms, losses equal to one node's 2 processes: $([[ -n $a && $a == "$b" ]] && echo yes || echo NO)"
  [[ -n $a && $a == "$b" && $steps == 40 ]] || fail "$strategy: losses differ from the one-node run"
done

# 1b. tensor parallelism within each node, data parallelism across: 2 x 2 ranks.
TP_ARGS=(--config "$SOURCE/configs/gpt_char.yaml" --set model.n_layer=2 --set model.n_embd=32
         --set model.n_head=4 --set model.block_size=32 --set model.dropout=0
         --set data.batch_size=4 --set dist.tp_size=2 "${ARGS[@]:6}")
for strategy in ddp fsdp; do
  "$TRAINER" launch --standalone --nproc-per-node 4 -- "${TP_ARGS[@]}" \
    --set dist.strategy=$strategy --run-dir "$TMP/local_tp_$strategy" \
    > "$TMP/local_tp_$strategy.log" 2>&1 || fail "local tp 2 $strategy run"
  start=$(now_ms)
  NPROC=2 BASE=TP_ARGS nodes "$TMP/two_tp_$strategy" -- --set dist.strategy=$strategy
  finish
  [[ $RC0 == 0 && $RC1 == 0 ]] || fail "tp 2 $strategy across nodes: exit $RC0/$RC1: $(tail -3 "$TMP/two_tp_$strategy.node0.log")"
  a=$(losses "$TMP/local_tp_$strategy") b=$(losses "$TMP/two_tp_$strategy")
  steps=$(wc -w <<<"$b")
  echo "1b. tp 2 in each namespace, $strategy across them: $steps steps in $(($(now_ms) - start)) ms, losses equal to one node's 4 processes: $([[ -n $a && $a == "$b" ]] && echo yes || echo NO)"
  [[ -n $a && $a == "$b" && $steps == 40 ]] || fail "tp 2 $strategy: losses differ from the one-node run"
done

# 2. node 1 dies: node 0 stops within dist.timeout_s (8 s) with one clear line.
nodes "$TMP/killed" -- "${SLOW[@]}"
until [[ $(losses "$TMP/killed" | wc -w) -ge 10 ]] || ! kill -0 "$PID0" 2>/dev/null; do sleep 0.05; done
for pid in $(ip netns pids "$NS1"); do kill -9 "$pid"; done
killed_at=$SECONDS
finish
took=$((SECONDS - killed_at))
line=$(grep -m1 -E "failed|stuck|timed out|timeout" "$TMP/killed.node0.log")
echo "2. node 1 killed: node 0's launcher exited $RC0 after $took s: $line"
[[ $RC0 == 1 && $took -le $((8 + 6)) && -n $line ]] || fail "node 0 after node 1 died: exit $RC0 after $took s: $(tail -5 "$TMP/killed.node0.log")"

# 2b. node 1 hangs (its processes stopped, its link silent: no reset reaches node 0): node 0
# stops at the collective timeout, dist.timeout_s (8 s).
nodes "$TMP/hung" -- "${SLOW[@]}"
until [[ $(losses "$TMP/hung" | wc -w) -ge 10 ]] || ! kill -0 "$PID0" 2>/dev/null; do sleep 0.05; done
for pid in $(ip netns pids "$NS1"); do kill -STOP "$pid"; done
hung_at=$SECONDS
wait "$PID0"
RC0=$?
took=$((SECONDS - hung_at))
for pid in $(ip netns pids "$NS1"); do kill -9 "$pid"; done
wait "$PID1" 2>/dev/null
line=$(grep -m1 -E "failed|timed out|timeout" "$TMP/hung.node0.log")
echo "2b. node 1 hung: node 0's launcher exited $RC0 after $took s: $line"
[[ $RC0 == 1 && $took -ge 6 && $took -le $((8 + 8)) && -n $line ]] || fail "node 0 after node 1 hung: exit $RC0 after $took s: $(tail -5 "$TMP/hung.node0.log")"

# 3. node 1's worker dies with a restart left on both nodes: they resume and end as scenario 1.
nodes "$TMP/restarted" --max-restarts 1 -- "${SLOW[@]}"
until [[ $(losses "$TMP/restarted" | wc -w) -ge 12 ]] || ! kill -0 "$PID0" 2>/dev/null; do sleep 0.05; done
for pid in $(ip netns pids "$NS1"); do
  grep -qa -- "launch" "/proc/$pid/cmdline" 2>/dev/null || kill -9 "$pid"
done
finish
resumed=$(grep -c "resumed from" "$TMP/restarted.node0.log")
b=$(losses "$TMP/restarted" | tr ' ' '\n' | tail -n 40 | tr '\n' ' ' | sed 's/ $//')
a=$(losses "$TMP/two_ddp")
echo "3. node 1's worker killed, --max-restarts 1: exits $RC0/$RC1, resumed on node 0: $resumed, last 40 losses equal to the uninterrupted run's: $([[ $a == "$b" ]] && echo yes || echo NO)"
[[ $RC0 == 0 && $RC1 == 0 && $resumed -ge 1 ]] || fail "restart: exit $RC0/$RC1, resumed $resumed: $(tail -5 "$TMP/restarted.node0.log")"

# 4. latency and loss on the link (tc netem); where the kernel has no netem, a token-bucket rate
# limit (tc tbf) that slows the link instead.
link="5 ms latency and 1% loss (netem)"
for n in 0 1; do
  ns=NS$n
  if ! ip netns exec "${!ns}" tc qdisc add dev "v${n}_$TAG" root netem delay 5ms loss 1% 2>/dev/null; then
    link="a 4 Mbit/s limit (tbf; this kernel has no netem, so no latency or loss)"
    ip netns exec "${!ns}" tc qdisc add dev "v${n}_$TAG" root tbf rate 4mbit burst 16kbit \
      latency 200ms || fail "tc: neither netem nor tbf"
  fi
done
start=$(now_ms)
nodes "$TMP/netem" --
finish
slow=$(($(now_ms) - start))
a=$(losses "$TMP/two_ddp") b=$(losses "$TMP/netem")
echo "4. $link on the link: exits $RC0/$RC1 in $slow ms (scenario 1: $FAST ms), losses equal: $([[ -n $b && $a == "$b" ]] && echo yes || echo NO)"
[[ $RC0 == 0 && $RC1 == 0 && $a == "$b" ]] || fail "slow link: exit $RC0/$RC1: $(tail -3 "$TMP/netem.node0.log")"
[[ $slow -gt $FAST ]] || fail "the slowed link did not slow the run ($slow ms vs $FAST ms)"

[[ ${#FAILURES[@]} == 0 ]] || exit 1
echo "all scenarios passed"
