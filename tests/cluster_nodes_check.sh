#!/usr/bin/env bash
# The cluster recipes run as written, on two "nodes" without a cluster (CTest
# Cluster.RecipesTrainAsOneJob and Cluster.NodeLostJobResumes): two network namespaces joined by a
# veth pair as in tests/netns_check.sh, each with an /etc/hosts (ip netns exec's
# /etc/netns/<ns>/hosts) that resolves the host names the schedulers give the master.
#
#   cluster_nodes_check.sh TRAINER SOURCE_DIR recipes|drill
#
# recipes: each node runs the command of docker/k8s/trainjob.yaml and docker/k8s/volcano-job.yaml
#   (tests/cluster_recipes.py reads it from the manifest) with exactly the variables the TrainJob's
#   torch plugin or Volcano's pytorch plugin give a node's container, and docker/slurm/train.sbatch
#   runs as it is, with the variables sbatch and srun set for two nodes (srun and scontrol are
#   stand-ins that start one task per node, in its namespace). A tiny config, the run directory
#   and one process per node are substituted. Every loss equals the same job's on one node (2
#   processes) and, within 1e-5, one process's with the global batch.
# drill: a node lost mid-run. Once a checkpoint is written, every process of node 1 is SIGKILLed;
#   the job is restarted as the scheduler does (TrainJob: the JobSet recreates every pod, the
#   survivor getting SIGTERM first; SLURM: srun --kill-on-bad-exit ends the step, the job is
#   requeued and the script runs again). The run resumes from the newest checkpoint (--resume auto),
#   its losses are the uninterrupted run's, and the steps lost (trained since the checkpoint, done
#   again) are at most run.checkpoint_every; the test prints them.
# Needs root, ip(8) with network namespaces and Python with PyYAML; exits 77 (skipped) with the
# reason otherwise.
set -uo pipefail
TRAINER=$(realpath "$1")
SOURCE=$(realpath "$2")
MODE=$3
PY=${TRAINER_TEST_PYTHON:-python3}
skip() { echo "skipped: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "network namespaces need root (uid $(id -u))"
command -v ip >/dev/null || skip "no ip(8)"
"$PY" -c "import yaml" 2>/dev/null || skip "$PY has no PyYAML"
TAG=$$
NS=("trc0_$TAG" "trc1_$TAG")
NET=10.232.$((TAG % 250)).
TMP=$(mktemp -d)
cleanup() {
  for ns in "${NS[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
ip netns add "${NS[0]}" 2>/dev/null || skip "ip netns add is not permitted here"
ip netns add "${NS[1]}" || skip "ip netns add is not permitted here"
ip link add "c0_$TAG" type veth peer name "c1_$TAG" || skip "no veth pairs here"
for n in 0 1; do
  ip link set "c${n}_$TAG" netns "${NS[n]}"
  ip -n "${NS[n]}" addr add "${NET}$((n + 1))/24" dev "c${n}_$TAG"
  ip -n "${NS[n]}" link set lo up
  ip -n "${NS[n]}" link set "c${n}_$TAG" up
done

TRAINJOB=$SOURCE/docker/k8s/trainjob.yaml
VOLCANO=$SOURCE/docker/k8s/volcano-job.yaml
SBATCH=$SOURCE/docker/slurm/train.sbatch
# The host names: the TrainJob's and the Volcano Job's master pods, and the SLURM nodes.
NODELIST="trn-node[0-1]"
HOSTS0="$("$PY" "$SOURCE/tests/cluster_recipes.py" hosts trainjob "$TRAINJOB")"
HOSTS0+=" $("$PY" "$SOURCE/tests/cluster_recipes.py" hosts volcano "$VOLCANO") trn-node0"
for n in 0 1; do
  mkdir -p "/etc/netns/${NS[n]}"
  printf '127.0.0.1 localhost\n%s1 %s\n%s2 trn-node1\n' "$NET" "$HOSTS0" "$NET" \
    > "/etc/netns/${NS[n]}/hosts"
done

FAILURES=()
fail() { FAILURES+=("$*"); echo "FAIL: $*"; }
CKPT_EVERY=5
# The tiny job every recipe runs: the config and the overrides appended to the recipe's own.
CONFIG=$SOURCE/configs/synthetic.yaml
TINY=(--set model.hidden=[64] --set data.batch_size=16 --set train.max_steps=30 --set train.epochs=10
      --set run.log_every=1 --set "run.checkpoint_every=$CKPT_EVERY" --set run.progress=never
      --set run.tensorboard=false --set data.workers=0 --set run.threads=1 --set dist.timeout_s=8
      --set dist.init_timeout_s=30)
# The drill kills a node mid-run: 40 ms a batch makes the run last about 1.5 s.
SLOW=(--set data.throttle_ms=40)
losses() { "$PY" -c 'import json,sys; print(" ".join(repr(r["loss"]) for r in map(json.loads, open(sys.argv[1])) if r["split"] == "train"))' "$1/metrics.jsonl" 2>/dev/null; }
# within DIR_A DIR_B: the largest relative difference of their train losses, step by step; exit
# 1 when the steps differ or a difference exceeds 1e-5.
within() { "$PY" -c 'import json,sys
def losses(d): return [(r["step"], r["loss"]) for r in map(json.loads, open(d + "/metrics.jsonl")) if r["split"] == "train"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max((abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(a, b)), default=1.0)
print(f"{worst:.1e}")
sys.exit(0 if a and [s for s, _ in a] == [s for s, _ in b] and worst <= 1e-5 else 1)' "$1" "$2" 2>/dev/null; }
last_step() { "$PY" -c 'import json,sys; print(max([r["step"] for r in map(json.loads, open(sys.argv[1])) if r["split"] == "train"] or [0]))' "$1/metrics.jsonl" 2>/dev/null || echo 0; }

# The same job on one node, the reference: 2 processes on this machine's loopback.
"$TRAINER" launch --standalone --nproc-per-node 2 -- --config "$CONFIG" "${TINY[@]}" \
  --run-dir "$TMP/reference" > "$TMP/reference.log" 2>&1 || fail "reference run: $(tail -3 "$TMP/reference.log")"
REFERENCE=$(losses "$TMP/reference")
[[ $(wc -w <<<"$REFERENCE") == 30 ]] || fail "reference run: $(wc -w <<<"$REFERENCE") steps logged"

# pod KIND DIR [EXTRA...]: one container per namespace running the manifest's command with the
# variables its scheduler sets; their output in DIR.node<n>.log, their process ids in PID0/PID1.
pod() {
  local kind=$1 dir=$2 manifest
  shift 2
  manifest=$([[ $kind == trainjob ]] && echo "$TRAINJOB" || echo "$VOLCANO")
  for n in ${NODES:-0 1}; do
    local cmd=()
    mapfile -d '' -t cmd < <("$PY" "$SOURCE/tests/cluster_recipes.py" "$kind" "$manifest" "$n" \
      --trainer "$TRAINER" --config "$CONFIG" --run-dir "$dir" --nproc 1 --nodes 2 -- "${TINY[@]}" "$@")
    (cd "$TMP" && exec ip netns exec "${NS[n]}" env "${cmd[@]}") > "$dir.node$n.log" 2>&1 &
    eval "PID$n=\$!"
  done
}

# Stand-ins for SLURM's srun and scontrol: srun starts one task per node of SLURM_JOB_NODELIST,
# node i in namespace CLUSTER_NS_i, with the variables srun sets for the task, and with
# --kill-on-bad-exit ends the other tasks (SIGTERM, SIGKILL after 10 s) when one fails.
mkdir -p "$TMP/bin"
ln -s "$TRAINER" "$TMP/bin/trainer"
cat > "$TMP/bin/scontrol" <<'EOF'
#!/usr/bin/env bash
# scontrol show hostnames PREFIX[A-B]
[[ $1 == show && $2 == hostnames && $3 =~ ^(.*)\[([0-9]+)-([0-9]+)\]$ ]] || { echo "scontrol stand-in: $*" >&2; exit 2; }
for ((i = BASH_REMATCH[2]; i <= BASH_REMATCH[3]; i++)); do echo "${BASH_REMATCH[1]}$i"; done
EOF
cat > "$TMP/bin/srun" <<'EOF'
#!/usr/bin/env bash
kill_bad=0
while [[ $1 == -* ]]; do
  case $1 in
    --kill-on-bad-exit=1|--kill-on-bad-exit|-K) kill_bad=1 ;;
    --ntasks-per-node=1) ;;
    *) echo "srun stand-in: unsupported option $1" >&2; exit 2 ;;
  esac
  shift
done
mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
pids=()
for i in "${!hosts[@]}"; do
  ns=CLUSTER_NS_$i
  setsid ip netns exec "${!ns}" env SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_NODEID="$i" \
    SLURM_PROCID="$i" SLURM_LOCALID=0 SLURMD_NODENAME="${hosts[i]}" SLURM_NTASKS="${#hosts[@]}" \
    SLURM_NPROCS="${#hosts[@]}" SLURM_STEP_NUM_NODES="${#hosts[@]}" \
    SLURM_STEP_NUM_TASKS="${#hosts[@]}" SLURM_STEP_NODELIST="$SLURM_JOB_NODELIST" \
    SLURM_STEP_TASKS_PER_NODE="1(x${#hosts[@]})" SLURM_TASKS_PER_NODE="1(x${#hosts[@]})" \
    SLURM_NTASKS_PER_NODE=1 SLURM_GTIDS="$i" SLURM_CPUS_ON_NODE=1 "$@" &
  pids+=($!)
done
rc=0 killer=
alive=("${pids[@]}")
while ((${#alive[@]})); do
  wait -n -p finished "${alive[@]}"; r=$?
  for i in "${!alive[@]}"; do [[ ${alive[i]} == "$finished" ]] && unset 'alive[i]'; done
  if ((r != 0 && rc == 0)); then
    rc=$r
    if ((kill_bad)); then
      echo "srun: error: a task exited with exit code $r; terminating the step" >&2
      for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
      (for _ in {1..500}; do sleep 0.02; done
       for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done) &
      killer=$!
    fi
  fi
done
[[ -n $killer ]] && kill "$killer" 2>/dev/null
exit "$rc"
EOF
chmod +x "$TMP/bin/srun" "$TMP/bin/scontrol"

# batch DIR RESTART [EXTRA...]: train.sbatch as sbatch runs it on the allocation's first node, with
# the variables sbatch sets; its output in DIR.batch<RESTART>.log, its process id in BATCH.
batch() {
  local dir=$1 restart=$2 requeued=()
  shift 2
  ((restart == 0)) || requeued=(SLURM_RESTART_COUNT="$restart")
  (cd "$TMP" && exec ip netns exec "${NS[0]}" env PATH="$TMP/bin:$PATH" CLUSTER_NS_0="${NS[0]}" \
    CLUSTER_NS_1="${NS[1]}" SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_JOB_NAME=resnet50-imagenet \
    SLURM_JOB_NODELIST="$NODELIST" SLURM_NODELIST="$NODELIST" SLURM_JOB_NUM_NODES=2 \
    SLURM_NNODES=2 SLURM_NTASKS=2 SLURM_NPROCS=2 SLURM_NTASKS_PER_NODE=1 \
    SLURM_TASKS_PER_NODE="1(x2)" SLURM_JOB_CPUS_PER_NODE="1(x2)" SLURM_CPUS_ON_NODE=1 \
    SLURM_SUBMIT_DIR="$TMP" SLURM_SUBMIT_HOST=trn-node0 SLURM_NODEID=0 SLURM_PROCID=0 \
    SLURM_LOCALID=0 SLURMD_NODENAME=trn-node0 ${requeued[@]+"${requeued[@]}"} \
    CONFIG="$CONFIG" RUN_DIR="$dir" NPROC_PER_NODE=1 \
    bash "$SBATCH" "${TINY[@]}" "$@") > "$dir.batch$restart.log" 2>&1 &
  BATCH=$!
}

recipes() {
  # One process with the global batch (2 x 16) takes the same steps, to float32 rounding.
  "$TRAINER" --config "$CONFIG" "${TINY[@]}" --set data.batch_size=32 --run-dir "$TMP/one" \
    > "$TMP/one.log" 2>&1 || fail "one-process run: $(tail -3 "$TMP/one.log")"
  local diff
  diff=$(within "$TMP/reference" "$TMP/one") || fail "the one-node run is not one process's ($diff)"
  for kind in trainjob volcano; do
    pod $kind "$TMP/$kind"
    wait "$PID0"; local rc0=$?
    wait "$PID1"; local rc1=$?
    local got
    got=$(losses "$TMP/$kind")
    echo "$kind: nodes exited $rc0/$rc1, $(wc -w <<<"$got") steps, losses equal to one node's: $([[ $got == "$REFERENCE" ]] && echo yes || echo NO)"
    [[ $rc0 == 0 && $rc1 == 0 ]] || fail "$kind: exit $rc0/$rc1: $(tail -3 "$TMP/$kind.node1.log")"
    [[ -n $got && $got == "$REFERENCE" ]] || fail "$kind: losses differ from the one-node run"
    diff=$(within "$TMP/$kind" "$TMP/one") || fail "$kind: losses differ from one process's by $diff"
    echo "$kind: losses within $diff of one process's with the global batch"
  done
  # The launcher took the layout from the scheduler's variables (its first lines say from which).
  for want in "--nnodes 2 from PET_NNODES" "--node-rank 1 from PET_NODE_RANK" \
              "--nproc-per-node 1 from PET_NPROC_PER_NODE" "--master-port 29400 from PET_MASTER_PORT" \
              "--master-addr $(cut -d' ' -f1 <<<"$HOSTS0") from PET_MASTER_ADDR"; do
    grep -qF -- "$want" "$TMP/trainjob.node1.log" || fail "trainjob: node 1's log lacks '$want'"
  done
  for want in "--nnodes 2 from WORLD_SIZE" "--node-rank 1 from RANK" "--master-port 23456 from MASTER_PORT"; do
    grep -qF -- "$want" "$TMP/volcano.node1.log" || fail "volcano: node 1's log lacks '$want'"
  done
  batch "$TMP/slurm" 0
  wait "$BATCH"; local rc=$?
  local got
  got=$(losses "$TMP/slurm")
  echo "slurm: train.sbatch exited $rc, $(wc -w <<<"$got") steps, losses equal to one node's: $([[ $got == "$REFERENCE" ]] && echo yes || echo NO)"
  [[ $rc == 0 ]] || fail "slurm: exit $rc: $(tail -5 "$TMP/slurm.batch0.log")"
  [[ -n $got && $got == "$REFERENCE" ]] || fail "slurm: losses differ from the one-node run"
  diff=$(within "$TMP/slurm" "$TMP/one") || fail "slurm: losses differ from one process's by $diff"
  echo "slurm: losses within $diff of one process's with the global batch"
  grep -q "master trn-node0:29500" "$TMP/slurm.batch0.log" || fail "slurm: the master is not the allocation's first host: $(head -3 "$TMP/slurm.batch0.log")"
}

# mid_interval DIR PID: until the checkpoint of step 2 x run.checkpoint_every is written and two
# steps more are logged, so that the steps since it are lost (or PID ended).
mid_interval() {
  local want=$((2 * CKPT_EVERY + 2)) step=0
  until compgen -G "$1/checkpoints/step_000000$((2 * CKPT_EVERY))*.safetensors" >/dev/null ||
    ! kill -0 "$2" 2>/dev/null; do sleep 0.02; done
  while ((step < want)) && kill -0 "$2" 2>/dev/null; do
    [[ $(tail -n 1 "$1/metrics.jsonl" 2>/dev/null) =~ \"step\":\ ?([0-9]+) ]] && step=${BASH_REMATCH[1]}
    sleep 0.02
  done
}
# stop_within S PID: PID's namespace 0 processes SIGKILLed unless PID ends within S seconds (the
# kubelet's terminationGracePeriodSeconds, shortened).
stop_within() {
  local deadline=$((SECONDS + $1))
  while kill -0 "$2" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.02; done
  kill -0 "$2" 2>/dev/null || return 0
  echo "node 0 still running $1 s after SIGTERM; SIGKILL"
  for pid in $(ip netns pids "${NS[0]}"); do kill -9 "$pid" 2>/dev/null; done
}
kill_node1() { for pid in $(ip netns pids "${NS[1]}"); do kill -9 "$pid" 2>/dev/null; done; }

# check_resumed NAME DIR LOG LOST_FROM: the restarted run's losses and its lost work.
check_resumed() {
  local name=$1 dir=$2 log=$3 before=$4 resumed got
  resumed=$(grep -m1 -oE "resumed from .* at step [0-9]+" "$log" | grep -oE "[0-9]+$")
  got=$(losses "$dir")
  if [[ -z $resumed ]]; then
    fail "$name: the restarted job did not resume: $(tail -5 "$log")"
    return
  fi
  local lost=$((before - resumed)) redone=none
  ((lost > 0)) && redone="steps $((resumed + 1))..$before"
  echo "$name: node 1 killed after step $before; resumed from the checkpoint of step $resumed; lost work: $lost steps ($redone trained again; run.checkpoint_every $CKPT_EVERY); losses equal to the uninterrupted run's: $([[ $got == "$REFERENCE" ]] && echo yes || echo NO)"
  # The trainer says what was lost: the steps its log had reached past the checkpoint.
  if ((lost > 0)) && ! grep -q "resumed at step $resumed: the run had logged training to step $before, so $lost steps trained since that checkpoint are lost" "$log"; then
    fail "$name: the restarted job did not log the $lost steps lost: $(grep -m1 "resumed at step" "$log")"
  fi
  ((resumed >= 2 * CKPT_EVERY && lost >= 0 && lost <= CKPT_EVERY)) ||
    fail "$name: resumed at step $resumed after step $before (checkpoint every $CKPT_EVERY)"
  [[ -n $got && $got == "$REFERENCE" ]] || fail "$name: losses differ from the uninterrupted run"
}

drill() {
  # TrainJob: node 1's pod lost; the JobSet (failurePolicy, Recreate) deletes the other pod
  # (SIGTERM, then SIGKILL after terminationGracePeriodSeconds) and creates both again.
  pod trainjob "$TMP/drill_k8s" "${SLOW[@]}"
  mid_interval "$TMP/drill_k8s" "$PID0"
  kill_node1
  { wait "$PID1"; } 2>/dev/null
  local term=$SECONDS
  kill -TERM "$PID0" 2>/dev/null
  stop_within 20 "$PID0"
  wait "$PID0"
  echo "trainjob drill: node 0 stopped $((SECONDS - term)) s after SIGTERM"
  for pid in $(ip netns pids "${NS[0]}"); do kill -9 "$pid" 2>/dev/null; done
  local before
  before=$(last_step "$TMP/drill_k8s")
  mv "$TMP/drill_k8s.node0.log" "$TMP/drill_k8s.node0.first.log"
  pod trainjob "$TMP/drill_k8s" "${SLOW[@]}"
  wait "$PID0"; local rc0=$?
  wait "$PID1"; local rc1=$?
  [[ $rc0 == 0 && $rc1 == 0 ]] || fail "trainjob drill: the restarted pods exited $rc0/$rc1: $(tail -3 "$TMP/drill_k8s.node0.log")"
  check_resumed "trainjob drill" "$TMP/drill_k8s" "$TMP/drill_k8s.node0.log" "$before"

  # SLURM: node 1's task lost; srun --kill-on-bad-exit ends the step, the script exits non-zero
  # and the job is requeued: the same script again, SLURM_RESTART_COUNT 1.
  batch "$TMP/drill_slurm" 0 "${SLOW[@]}"
  mid_interval "$TMP/drill_slurm" "$BATCH"
  kill_node1
  wait "$BATCH"; local rc=$?
  [[ $rc != 0 ]] || fail "slurm drill: the job ended 0 with a node lost"
  before=$(last_step "$TMP/drill_slurm")
  batch "$TMP/drill_slurm" 1 "${SLOW[@]}"
  wait "$BATCH"; rc=$?
  [[ $rc == 0 ]] || fail "slurm drill: the requeued job exited $rc: $(tail -5 "$TMP/drill_slurm.batch1.log")"
  check_resumed "slurm drill" "$TMP/drill_slurm" "$TMP/drill_slurm.batch1.log" "$before"

  # A node that does not come back: node 0 alone waits at the rendezvous for
  # dist.init_timeout_s on every attempt the TrainJob's --max-restarts allows, then exits 1 with
  # a line counting the ranks that arrived and naming the missing one's node.
  local start=$SECONDS
  NODES=0 pod trainjob "$TMP/alone" --set dist.init_timeout_s=2
  wait "$PID0"; rc=$?
  local line attempts
  line=$(grep -m1 -oE "rendezvous at [^ ]+: [0-9]+ of 2 ranks arrived within [0-9.]+ s \(dist.init_timeout_s\): missing rank 1 \(node 1, at 1 process a node\)" "$TMP/alone.node0.log")
  attempts=$(grep -c "restarting the workers" "$TMP/alone.node0.log")
  echo "node 1 never comes back: node 0 exited $rc after $((SECONDS - start)) s and $attempts restarts: $line"
  [[ $rc == 1 && -n $line ]] || fail "node 0 alone: exit $rc: $(tail -5 "$TMP/alone.node0.log")"
  grep -q "no restarts left" "$TMP/alone.node0.log" || fail "node 0 alone did not use its restarts: $(tail -5 "$TMP/alone.node0.log")"
}

case $MODE in
  recipes) recipes ;;
  drill) drill ;;
  *) echo "usage: cluster_nodes_check.sh TRAINER SOURCE_DIR recipes|drill" >&2; exit 2 ;;
esac
[[ ${#FAILURES[@]} == 0 ]] || exit 1
echo "all $MODE checks passed"
