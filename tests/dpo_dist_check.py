#!/usr/bin/env python3
"""LoRA DPO under ddp, under fsdp and across a resume (CTest Dpo.DistributedAndResumed).

  dpo_dist_check.py TRAINER [--keep DIR]

The base and the pairs are dpo_check.py's (a tiny random Llama, the Llama 3 template, TRL's
standard format with an implicit prompt).

- ddp and fsdp: `trainer launch --standalone --nproc-per-node 2` with data.batch_size 4 a rank
  (each pair's chosen and rejected rows on one rank; under fsdp the base and the adapters sharded,
  the reference the sharded base with the adapters off) logs, over 10 steps, the loss and every
  metric TRL logs (rewards/*, logps/*, logits/*, entropy, mean_token_accuracy) within 1e-5
  relative of one process with data.batch_size 8: the metrics reduced over the ranks as TRL's
  gather_for_metrics does (the means over the global batch, the token-weighted ones as sums over
  sums).
- resume: a run stopped after step 5 (train.stop_at_step) and resumed with --resume auto logs
  exactly (bit for bit) the records of the uninterrupted run (which saves the same checkpoints),
  with run.log_every 3 (the window of steps 4-6 spans the stop), in one process and under ddp,
  and in one process for a full fine-tune (no model.lora): the resumed run's reference is the
  frozen copy of the starting weights again, not the checkpoint's.

- refused: a full fine-tune's sigmoid under fsdp (its frozen reference copy is not sharded) and
  dist.tp_size 2 exit 2 naming the key.

Exits 77 (skipped) when trl, peft, transformers or tokenizers is not installed (dpo_check.py's
imports).
"""
import json
import os
import sys

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

import dpo_check as dc  # noqa: E402  (exits 77 without trl, peft, transformers, tokenizers)

STEPS, STOP, LOG_EVERY = 10, 5, 3
# What differs between runs that compute the same: wall-clock rates and the process's memory.
TIMING = {"samples_per_sec", "tokens_per_sec", "tflops", "mfu", "peak_tflops", "rss_mb",
          "rss_peak_mb"}


def config(work, name, base, train, val, batch, log_every, procs, lora=True, strategy="ddp"):
    path = dc.trainer_config(work, name, base, train, val, "sigmoid", STEPS, dc.LR)
    with open(path) as f:
        c = json.load(f)
    if not lora:  # a full fine-tune: the reference a frozen copy of the starting weights
        del c["model"]["lora"]
    c["data"]["batch_size"] = batch
    # A checkpoint after step STOP in the uninterrupted runs too: saving averages the loss window
    # over the ranks, which the resumed run starts from.
    c["run"].update({"log_every": log_every, "checkpoint_every": STOP})
    if procs > 1:
        c["dist"] = {"strategy": strategy}
    with open(path, "w") as f:
        json.dump(c, f)
    return path


def train(binary, work, name, data, batch, procs=1, log_every=1, *extra, lora=True,
          strategy="ddp"):
    run_dir = os.path.join(work, name)
    launch = [binary, "launch", "--standalone", "--nproc-per-node", str(procs), "--"]
    cfg = config(work, name, *data, batch, log_every, procs, lora, strategy)
    dc.run([*(launch if procs > 1 else [binary]), "--config", cfg, "--run-dir", run_dir,
            *extra], f"{name} {' '.join(extra)}")
    return run_dir


def by_step(run_dir):
    """The last train record of each step (a resumed run logs the steps after its checkpoint)."""
    records = {r["step"]: r for r in dc.trainer_records(run_dir)}
    return [records[s] for s in sorted(records)]


def check_parallel(binary, work, data, one, strategy, failures):
    two = by_step(train(binary, work, strategy, data, dc.PAIRS // 2, 2, strategy=strategy))
    if len(one) != STEPS or len(two) != STEPS:
        failures.append(f"{strategy}: steps logged: one process {len(one)}, two {len(two)}")
        return
    worst = (0.0, "")
    for step, (a, b) in enumerate(zip(two, one), 1):
        for name in ["loss"] + dc.METRICS:
            if name not in a:
                failures.append(f"{strategy}: step {step}: no {name} logged")
                return
            difference = dc.relative(name, a[name], b[name], b)
            if difference > worst[0]:
                worst = (difference,
                         f"step {step} {name}: {strategy} {a[name]!r}, one {b[name]!r}")
    print(f"{strategy}, 2 processes of 4 pairs against 1 of 8: {STEPS} steps, worst relative "
          f"difference {worst[0]:.2e} ({worst[1]})")
    if worst[0] > dc.TOL:
        failures.append(f"{strategy}: {worst[1]} (relative {worst[0]:.2e} > {dc.TOL})")


def check_resume(binary, work, data, procs, failures, lora=True):
    what = f"resume, {procs} process{'es' if procs > 1 else ''}" + ("" if lora else ", full")
    batch, tag = dc.PAIRS // procs, f"{procs}{'' if lora else '-full'}"
    whole = by_step(train(binary, work, f"whole-{tag}", data, batch, procs, LOG_EVERY, lora=lora))
    run_dir = train(binary, work, f"stopped-{tag}", data, batch, procs, LOG_EVERY, "--set",
                    f"train.stop_at_step={STOP}", lora=lora)
    train(binary, work, f"stopped-{tag}", data, batch, procs, LOG_EVERY, "--resume", "auto",
          lora=lora)
    resumed = by_step(run_dir)
    strip = [[{k: v for k, v in r.items() if k not in TIMING} for r in rs]
             for rs in (whole, resumed)]
    if not whole or strip[0] != strip[1]:
        bad = next((k for k in range(min(len(whole), len(resumed))) if strip[0][k] != strip[1][k]),
                   None)
        detail = (f"step {whole[bad]['step']}: whole {strip[0][bad]}, resumed {strip[1][bad]}"
                  if bad is not None else f"{len(whole)} records, resumed {len(resumed)}")
        failures.append(f"{what}: {detail}")
    else:
        print(f"{what}: stopped after step {STOP}, resumed: the {len(whole)} records (log_every "
              f"{LOG_EVERY}) equal the uninterrupted run's bit for bit")


def check_refused(binary, work, data, failures):
    """Layouts dpo does not take exit 2 naming the key: a full fine-tune's frozen reference under
    fsdp, and tensor parallelism."""
    for what, lora, sets, key in (
            ("full fine-tune under fsdp", False, ["dist.strategy=fsdp"], "dist.strategy"),
            ("tp 2", True, ["dist.tp_size=2"], "dist.tp_size")):
        cfg = config(work, "refused", *data, dc.PAIRS, 1, 1, lora)
        args = [binary, "--config", cfg, "--run-dir", os.path.join(work, "refused")]
        for s in sets:
            args += ["--set", s]
        r = dc.run(args, what, expect=2)
        if key not in r.stderr:
            failures.append(f"{what}: exit 2 without naming {key}: {r.stderr.strip()[-400:]}")


def main():
    failures = []
    with dc.base_and_work("dpo_dist_check_") as (args, work, base):
        train_file, val_file = os.path.join(work, "train.jsonl"), os.path.join(work, "val.jsonl")
        dc.write_jsonl(train_file, dc.records(4 * dc.PAIRS, 1, False))
        dc.write_jsonl(val_file, dc.records(4, 2, False))
        data = (base, train_file, val_file)
        one = by_step(train(args.trainer, work, "one", data, dc.PAIRS))
        for strategy in ("ddp", "fsdp"):
            check_parallel(args.trainer, work, data, one, strategy, failures)
        check_refused(args.trainer, work, data, failures)
        for procs in (1, 2):
            check_resume(args.trainer, work, data, procs, failures)
        check_resume(args.trainer, work, data, 1, failures, lora=False)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
