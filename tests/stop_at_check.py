#!/usr/bin/env python3
"""train.stop_at ends a run after the first evaluation that reaches its target (CTest
StopAt.EndsAfterTheEvaluationThatReachesTheTarget).

  stop_at_check.py TRAINER

A tiny GPT trains byte-level on a generated text file, evaluating every 2 steps, for 16 steps
without a target; its metrics.jsonl gives the validation losses. The target is chosen from them:
between the first evaluation (from the third on) whose loss is a new low and the lowest loss
before it, so that exactly that evaluation reaches it. The same run with
train.stop_at: {metric: val/loss, below: target} must then exit 0 after that evaluation's step,
with the same losses up to it, no train or val record after it, its last checkpoint at that step,
and the log line of the target giving the time from the first step and from start-up: positive,
the first not above the second, the second not above the process's wall time measured here.
A run with val/ppl (the same losses through exp) stops at the same step; one with
{metric: val/loss, above: ...} at the first evaluation whose loss is at least that. Under
`trainer launch` with 2 processes (the evaluation averaged over both), a target chosen from that
job's own losses in the same way ends both processes after the same evaluation: the job exits 0
(a rank that went on training would wait forever on its partner's gradients) with the checks above.

`trainer bench --to-target` on the same config and target reports, as JSON, the target reached
at that step and the two times (ordered as above); without a target in the config it exits 2.

Bad settings, each exit 2 before training with stderr naming the key: a metric name that does not
exist (val/accuracy), val/top1 of a language model, below without a metric, below and above both.
"""
import glob
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time

from run_check import one_intra_op_thread, report

one_intra_op_thread()

EVERY, STEPS = 2, 16
WORDS = ("apple bread cloud dance eagle flame grape honey island jelly kite lemon mango night "
         "ocean piano queen river stone tiger violin water zebra amber breeze candle").split()
TARGET_LINE = re.compile(r"(\S+) (\S+) reached train\.stop_at \((.*?)\) at step (\d+): "
                         r"([0-9.]+) s from the first step, ([0-9.]+) s from start-up")
failures = []


def config(work):
    rng = random.Random(0)
    text = os.path.join(work, "text.txt")
    with open(text, "w") as f:
        for _ in range(1500):
            f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + ".\n")
    path = os.path.join(work, "gpt.yaml")
    with open(path, "w") as f:
        json.dump({  # JSON is YAML
            "seed": 0, "deterministic": True,
            "model": {"name": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32,
                      "vocab_size": 0, "dropout": 0.0},
            "data": {"name": "tokens", "root": text, "token_format": "bytes",
                     "val_fraction": 0.1, "batch_size": 8, "workers": 0},
            "train": {"max_steps": STEPS},
            "optim": {"name": "adamw", "lr": 0.003},
            "run": {"eval_every": EVERY, "eval_batches": 4, "log_every": 2,
                    "checkpoint_every": 0, "progress": "never", "threads": 1},
        }, f)
    return path


def train(trainer, cfg, run_dir, *sets, processes=1):
    launch = ["launch", "--standalone", "--nproc-per-node", str(processes), "--"]
    args = [trainer, *(launch if processes > 1 else []), "--config", cfg, "--run-dir", run_dir]
    for s in sets:
        args += ["--set", s]
    start = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    return r, time.monotonic() - start


def records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def val_losses(run_dir):
    return [(r["step"], r["loss"]) for r in records(run_dir) if r["split"] == "val"]


def checkpoint_steps(run_dir):
    names = glob.glob(os.path.join(run_dir, "checkpoints", "step_*.safetensors"))
    return sorted(int(os.path.basename(n)[5:13]) for n in names)


def choose_target(losses):
    """(target, step): the first evaluation from the third on whose loss is below every earlier
    one, and a target halfway between its loss and the lowest before it."""
    for i in range(2, len(losses)):
        best_before = min(loss for _, loss in losses[:i])
        step, loss = losses[i]
        if loss < best_before:
            return (loss + best_before) / 2, step
    return None, None


def check_stopped(name, r, wall, run_dir, losses, stop_step, metric):
    if r.returncode != 0:
        failures.append(f"{name}: exit {r.returncode}: {r.stderr[-2000:]}")
        return
    got = val_losses(run_dir)
    want = [(s, loss) for s, loss in losses if s <= stop_step]
    if [s for s, _ in got] != [s for s, _ in want]:
        failures.append(f"{name}: evaluations at steps {[s for s, _ in got]}, expected "
                        f"{[s for s, _ in want]} (ending after step {stop_step})")
    elif any(not math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(got, want)):
        failures.append(f"{name}: validation losses {got} differ from the run without a target "
                        f"{want}")
    last = max(rec["step"] for rec in records(run_dir))
    if last != stop_step:
        failures.append(f"{name}: metrics.jsonl has records up to step {last}, not {stop_step}")
    steps = checkpoint_steps(run_dir)
    if not steps or steps[-1] != stop_step:
        failures.append(f"{name}: checkpoints at steps {steps}; the last must be {stop_step}")
    m = TARGET_LINE.search(r.stderr)
    if not m:
        failures.append(f"{name}: no line of the target in stderr:\n{r.stderr[-2000:]}")
        return
    if m.group(1) != metric or int(m.group(4)) != stop_step:
        failures.append(f"{name}: the target's line names {m.group(1)} at step {m.group(4)}, "
                        f"expected {metric} at {stop_step}: {m.group(0)}")
    from_first, from_start = float(m.group(5)), float(m.group(6))
    if not 0 < from_first <= from_start <= wall + 0.05:
        failures.append(f"{name}: times {from_first} s from the first step and {from_start} s "
                        f"from start-up, with the process's wall time {wall:.2f} s: expected "
                        f"0 < first <= start-up <= wall")
    with open(os.path.join(run_dir, "train.log")) as f:
        if m.group(0) not in f.read():
            failures.append(f"{name}: train.log lacks the target's line")


def check_refused(name, trainer, cfg, work, sets, key):
    r, _ = train(trainer, cfg, os.path.join(work, name), *sets)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    if r.returncode != 2 or not any(key in line for line in lines):
        failures.append(f"{name}: expected exit 2 naming {key}, got exit {r.returncode}: "
                        f"{r.stderr[-1500:]}")
    elif os.path.exists(os.path.join(work, name, "checkpoints")):
        failures.append(f"{name}: refused, yet it wrote checkpoints")


def check_bench(trainer, cfg, work, target, stop_step):
    """trainer bench --to-target: the same run, its time to the target as JSON; without a target
    in the config, exit 2."""
    run, out = os.path.join(work, "bench"), os.path.join(work, "bench.json")
    args = [trainer, "bench", "--config", cfg, "--to-target", "--json", out,
            "--set", f"run.dir={run}"]
    start = time.monotonic()
    r = subprocess.run(args + ["--set", "train.stop_at.metric=val/loss",
                               "--set", f"train.stop_at.below={target!r}"],
                       capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - start
    if r.returncode != 0:
        failures.append(f"bench --to-target: exit {r.returncode}: {r.stderr[-1500:]}")
        return
    with open(out) as f:
        j = json.load(f)
    first, from_start = j["seconds_to_target"], j["seconds_to_target_from_start"]
    if not j["reached_target"] or j["steps"] != stop_step:
        failures.append(f"bench --to-target: {j}, expected the target reached at {stop_step}")
    elif not 0 < first <= from_start <= wall + 0.05:
        failures.append(f"bench --to-target: times {first}, {from_start} with the process's wall "
                        f"time {wall:.2f} s")
    elif checkpoint_steps(run)[-1:] != [stop_step]:
        failures.append(f"bench --to-target: checkpoints {checkpoint_steps(run)}")
    else:
        print(f"bench --to-target: {r.stdout.strip()}")
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode != 2 or "train.stop_at" not in r.stderr:
        failures.append(f"bench --to-target without a target: exit {r.returncode}: {r.stderr}")


def check_two_processes(trainer, cfg, work):
    base = os.path.join(work, "base2")
    r, _ = train(trainer, cfg, base, processes=2)
    if r.returncode != 0:
        failures.append(f"2 processes without a target: exit {r.returncode}: {r.stderr[-2000:]}")
        return
    losses = val_losses(base)
    target, stop_step = choose_target(losses)
    if target is None:
        failures.append(f"2 processes: no evaluation after the second lowers the loss: {losses}")
        return
    print(f"2 processes: losses {losses}; target {target:.6f}: expected stop after {stop_step}")
    run = os.path.join(work, "loss2")
    r, wall = train(trainer, cfg, run, "train.stop_at.metric=val/loss",
                    f"train.stop_at.below={target!r}", processes=2)
    check_stopped("2 processes, val/loss below", r, wall, run, losses, stop_step, "val/loss")


def main():
    trainer = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as work:
        cfg = config(work)
        base = os.path.join(work, "base")
        r, _ = train(trainer, cfg, base)
        if r.returncode != 0:
            failures.append(f"the run without a target: exit {r.returncode}: {r.stderr[-2000:]}")
            return report(failures)
        losses = val_losses(base)
        if [s for s, _ in losses] != list(range(EVERY, STEPS + 1, EVERY)):
            failures.append(f"the run without a target evaluated at {[s for s, _ in losses]}")
        target, stop_step = choose_target(losses)
        if target is None:
            failures.append(f"no evaluation after the second lowers the loss: {losses}")
            return report(failures)
        print(f"losses {losses}; target {target:.6f}: expected stop after step {stop_step}")

        run = os.path.join(work, "loss")
        r, wall = train(trainer, cfg, run, "train.stop_at.metric=val/loss",
                        f"train.stop_at.below={target!r}")
        check_stopped("val/loss below", r, wall, run, losses, stop_step, "val/loss")

        run = os.path.join(work, "ppl")
        r, wall = train(trainer, cfg, run, "train.stop_at.metric=val/ppl",
                        f"train.stop_at.below={math.exp(target)!r}")
        check_stopped("val/ppl below", r, wall, run, losses, stop_step, "val/ppl")

        # above: the first evaluation whose loss is at least the third's (a rising metric's rule).
        third = losses[2][1]
        above_step = next(s for s, loss in losses if loss >= third)
        run = os.path.join(work, "above")
        r, wall = train(trainer, cfg, run, "train.stop_at.metric=val/loss",
                        f"train.stop_at.above={third!r}")
        check_stopped("val/loss above", r, wall, run, losses, above_step, "val/loss")

        check_bench(trainer, cfg, work, target, stop_step)
        check_two_processes(trainer, cfg, work)

        key = "train.stop_at.metric"
        check_refused("unknown metric", trainer, cfg, work,
                      [f"{key}=val/accuracy", "train.stop_at.below=1"], key)
        check_refused("top1 of a language model", trainer, cfg, work,
                      [f"{key}=val/top1", "train.stop_at.above=0.5"], key)
        check_refused("below without a metric", trainer, cfg, work,
                      ["train.stop_at.below=1"], key)
        check_refused("below and above", trainer, cfg, work,
                      [f"{key}=val/loss", "train.stop_at.below=1", "train.stop_at.above=2"],
                      "train.stop_at.above")
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
