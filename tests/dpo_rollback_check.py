#!/usr/bin/env python3
"""LoRA DPO's metrics window after a train.rollback_on_nan rollback (CTest Dpo.RollbackWindow).

  dpo_rollback_check.py TOOL [--keep DIR]

TOOL (tests/dpo_rollback_tool.cpp) trains like `trainer --config` with NaN gradients in one
backward pass. The base and the pairs are dpo_check.py's; the loss is hinge, whose per-pair loss
relu(1 - beta (chosen log-ratio - rejected log-ratio)) is 1 minus the pair's reward margin while
the margins stay below 1 (as here): over any set of micro-batches the mean loss is 1 minus the
mean rewards/margins. The run logs every 5 steps, saves a checkpoint every 2 (step 2's holds the
window of steps 1 and 2), and step 3's gradients are NaN (no clipping, which would skip the
update): step 3's weights are NaN, step 4's loss is NaN, and the run goes back to step 2's
checkpoint and goes on. Every train record, the one after the rollback (step 5's) included, must
cover the same steps for the loss and for TRL's metrics: loss = 1 - rewards/margins within 1e-5,
both finite. A metrics window restored from the checkpoint while the loss window starts afresh
(the steps after the checkpoint undone) would mix steps 1 and 2 into step 5's metrics.

Exits 77 (skipped) when trl, peft, transformers or tokenizers is not installed (dpo_check.py's
imports).
"""
import json
import math
import os
import sys

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

import dpo_check as dc  # noqa: E402  (exits 77 without trl, peft, transformers, tokenizers)

STEPS, LOG_EVERY, CHECKPOINT_EVERY, NAN_BACKWARD = 10, 5, 2, 3


def main():
    failures = []
    with dc.base_and_work("dpo_rollback_check_", "tool") as (args, work, base):
        train, val = os.path.join(work, "train.jsonl"), os.path.join(work, "val.jsonl")
        dc.write_jsonl(train, dc.records(4 * dc.PAIRS, 1, False))
        dc.write_jsonl(val, dc.records(4, 2, False))
        path = dc.trainer_config(work, "rollback", base, train, val, "hinge", STEPS, dc.LR)
        with open(path) as f:
            config = json.load(f)
        # No clipping: its norm would find the NaN gradients and skip the update.
        config["train"].update({"rollback_on_nan": True, "max_bad_steps": 100,
                                "clip_grad_norm": 0.0})
        config["run"].update({"log_every": LOG_EVERY, "checkpoint_every": CHECKPOINT_EVERY,
                              "keep_last": 10})
        with open(path, "w") as f:
            json.dump(config, f)
        run_dir = os.path.join(work, "run")
        r = dc.run([args.tool, path, run_dir, str(NAN_BACKWARD)], "the run with NaN gradients")
        back = f"back to the checkpoint of step {CHECKPOINT_EVERY}"
        log = r.stdout + r.stderr
        if back not in log:
            failures.append(f"no rollback {back}: {log.strip()[-800:]}")
        records = {rec["step"]: rec for rec in dc.trainer_records(run_dir)}
        steps = sorted(records)
        if steps != list(range(LOG_EVERY, STEPS + 1, LOG_EVERY)):
            failures.append(f"train records at steps {steps}")
        worst = (0.0, "")
        for step in steps:
            rec = records[step]
            loss, margins = rec.get("loss", math.nan), rec.get("rewards/margins", math.nan)
            if not (math.isfinite(loss) and abs(margins) < 1):
                failures.append(f"step {step}: loss {loss}, rewards/margins {margins} (finite, "
                                f"below 1 expected)")
                continue
            difference = abs(loss - (1 - margins))
            if difference > worst[0]:
                worst = (difference, f"step {step}: loss {rec['loss']!r}, rewards/margins "
                                     f"{rec['rewards/margins']!r}")
        print(f"train records at steps {steps} after a rollback to step {CHECKPOINT_EVERY}: "
              f"worst |loss - (1 - rewards/margins)| {worst[0]:.2e} ({worst[1]})")
        if worst[0] > dc.TOL:
            failures.append(f"loss and metrics over different steps: {worst[1]}")
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
