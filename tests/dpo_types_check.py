#!/usr/bin/env python3
"""Preference tuning's hinge, robust and orpo losses (LoRA) and a full fine-tune against TRL 1.16,
and evaluation on a held-out split against TRL's evaluate() (CTest Dpo.LossTypesAndEval).

  dpo_types_check.py TRAINER [--keep DIR]

The base and the pairs are dpo_check.py's (a tiny random Llama, the Llama 3 template). For each
case the trainer's step-0 adapters (a one-step run at learning rate 0, exported with `export
--format peft`) are loaded into PEFT over the same base; then 20 steps of the trainer and 20 of
TRL's trainer from them over the same 8 pairs (every pair in every batch, AdamW, clipping at 1.0,
a constant rate) log the same loss and metrics at every step, within 1e-5 relative
(dpo_check.relative: near 0 relative to what the value is computed from). After the last step
both evaluate the trained adapters on 6 held-out pairs in batches of 4 (the last one short): the
trainer's val record in metrics.jsonl carries the loss and every metric of TRL's evaluate()
(eval_loss, eval_rewards/chosen, ...; TRL's means over the batches, its loss weighted by their
pairs) within 1e-5 relative, and `trainer eval --json` of the last checkpoint prints them as the
record has them.

- hinge, text records with an implicit prompt: DPOTrainer, loss_type ["hinge"].
- robust with dpo.label_smoothing 0.1, messages with an explicit prompt: DPOTrainer,
  loss_type ["robust"], label_smoothing 0.1.
- orpo (dpo.beta: ORPO's lambda): trl.experimental.orpo.ORPOTrainer, beta 0.1: the loss (the NLL
  over the chosen rows' prompt and completion minus the mean of beta log sigmoid of the log odds
  ratio), rewards/*, logps/*, logits/*, nll_loss, log_odds_ratio and log_odds_chosen. Rows of one
  length (dpo_check.simpo_records): ORPOTrainer's logits/* are means over every position.
- A full fine-tune (no model.lora; sigmoid, text): the reference is a frozen copy of the starting
  weights; DPOTrainer over the plain model, its ref_model loaded from the same folder.

Exits 77 (skipped) when trl, peft, transformers or tokenizers is not installed (dpo_check.py's
imports).
"""
import json
import os
import sys

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

import dpo_check as dc  # noqa: E402  (exits 77 without trl, peft, transformers, tokenizers)

try:
    from trl import DPOConfig, DPOTrainer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

EVAL_PAIRS, EVAL_BATCH, SMOOTHING = 6, 4, 0.1
ORPO_METRICS = dc.METRICS[:8] + ["nll_loss", "log_odds_ratio", "log_odds_chosen"]


def trainer_config(work, name, base, train, val, dpo, steps, lr, lora=True):
    """dpo_check's config with the `dpo:` keys `dpo`, evaluation after the last step in batches
    of EVAL_BATCH pairs; without `lora` every weight trained."""
    path = dc.trainer_config(work, name, base, train, val, dpo["loss_type"], steps, lr)
    with open(path) as f:
        config = json.load(f)
    config["dpo"].update(dpo)
    if not lora:
        del config["model"]["lora"]
    config["data"]["eval_batch_size"] = EVAL_BATCH
    config["train"]["eval_at_end"] = True
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def trainer_run(binary, work, name, base, rows, dpo, lora=True):
    """The trainer's STEPS steps on rows[0], evaluated on rows[1]: (run directory, the step-0
    adapters exported for PEFT, None without `lora`)."""
    train, val = os.path.join(work, f"{name}-train.jsonl"), os.path.join(work, f"{name}-val.jsonl")
    dc.write_jsonl(train, rows[0])
    dc.write_jsonl(val, rows[1])
    if not lora:
        run_dir = os.path.join(work, name)
        dc.run([binary, "--config", trainer_config(work, name, base, train, val, dpo, dc.STEPS,
                                                   dc.LR, lora=False), "--run-dir", run_dir],
               f"{name}: train")
        return run_dir, None
    start = os.path.join(work, f"{name}-start")
    dc.run([binary, "--config", trainer_config(work, f"{name}-start", base, train, val, dpo, 1,
                                               0.0), "--run-dir", start], f"{name}: step 0")
    adapters = os.path.join(work, f"{name}-adapters")
    dc.run([binary, "export", "--checkpoint", start, "--out", adapters, "--format", "peft"],
           f"{name}: export")
    run_dir = os.path.join(work, name)
    dc.run([binary, "--config", trainer_config(work, name, base, train, val, dpo, dc.STEPS, dc.LR),
            "--run-dir", run_dir], f"{name}: train")
    return run_dir, adapters


def eval_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r.get("split") == "val"]


def compare_eval(what, run_dir, theirs, metrics, failures):
    """The trainer's evaluation after the last step against TRL's evaluate() record."""
    ours = eval_records(run_dir)
    if len(ours) != 1 or ours[0].get("step") != dc.STEPS or theirs is None:
        failures.append(f"{what} evaluation: trainer records {ours}, TRL {theirs}")
        return
    ours = ours[0]
    unprefixed = {k[len("eval_"):]: v for k, v in theirs.items() if k.startswith("eval_")}
    worst = (0.0, "")
    for name in ["loss"] + metrics:
        if name not in ours or name not in unprefixed:
            failures.append(f"{what} evaluation: {name}: trainer {ours.get(name)}, TRL "
                            f"{unprefixed.get(name)}")
            return
        difference = dc.relative(name, ours[name], unprefixed[name], unprefixed)
        if difference > worst[0]:
            worst = (difference, f"{name}: trainer {ours[name]!r}, TRL {unprefixed[name]!r}")
    print(f"{what} evaluation on {EVAL_PAIRS} held-out pairs: loss {ours['loss']:.6f}, "
          f"rewards/accuracies {ours['rewards/accuracies']:.3f}; worst relative difference "
          f"{worst[0]:.2e} ({worst[1]})")
    if worst[0] > dc.TOL:
        failures.append(f"{what} evaluation: {worst[1]} (relative {worst[0]:.2e} > {dc.TOL})")


def check_eval_command(binary, run_dir, what, metrics, failures):
    """`trainer eval --json` of the run's last checkpoint: the val record's loss and metrics (a
    full fine-tune's reference the starting weights again, not the checkpoint's)."""
    r = dc.run([binary, "eval", "--checkpoint", run_dir, "--json"], f"{what}: trainer eval")
    printed = json.loads(r.stdout.strip().splitlines()[-1])
    record = eval_records(run_dir)[-1]
    different = [name for name in ["loss"] + metrics if printed.get(name) != record.get(name)]
    if different:
        failures.append(f"{what}: trainer eval --json differs from the val record in {different}: "
                        f"{printed} against {record}")
    else:
        print(f"{what}: trainer eval --json gives the val record's loss and metrics")


def robust_terms(record):
    """The size of the two terms whose difference the robust loss is, over 1 - 2 eps: the flipped
    one, eps (-log sigmoid(-margin)), is about eps times the margin once the margins grow, and the
    loss crosses 0 there."""
    return SMOOTHING * abs(record["rewards/margins"]) / (1 - 2 * SMOOTHING)


def check_case(binary, work, base, name, rows, dpo, trl, metrics, failures, lora=True,
               loss_scale=None):
    """One loss type: 20 steps and the evaluation after them against TRL's `trl` (trainer class,
    config class, its options); without `lora` a full fine-tune. `loss_scale`: dpo_check.relative's
    for a loss that crosses 0."""
    run_dir, adapters = trainer_run(binary, work, name, base, rows, dpo, lora)
    trainer_class, config_class, options = trl
    losses, logs, evaluation = dc.trl_train(trainer_class, config_class, base, adapters, rows[0],
                                            work, eval_rows=rows[1],
                                            per_device_eval_batch_size=EVAL_BATCH, **options)
    dc.compare(name, dc.trainer_records(run_dir), losses, logs, failures, metrics, loss_scale)
    compare_eval(name, run_dir, evaluation, metrics, failures)
    check_eval_command(binary, run_dir, name, metrics, failures)


def main():
    failures = []
    with dc.base_and_work("dpo_types_check_") as (args, work, base):
        text = (dc.records(dc.PAIRS, 1, False), dc.records(EVAL_PAIRS, 2, False))
        messages = (dc.records(dc.PAIRS, 11, True), dc.records(EVAL_PAIRS, 12, True))
        check_case(args.trainer, work, base, "text-hinge", text,
                   {"loss_type": "hinge", "beta": dc.BETA},
                   (DPOTrainer, DPOConfig, {"beta": dc.BETA, "loss_type": ["hinge"]}),
                   dc.METRICS, failures)
        check_case(args.trainer, work, base, "messages-robust", messages,
                   {"loss_type": "robust", "beta": dc.BETA, "label_smoothing": SMOOTHING},
                   (DPOTrainer, DPOConfig,
                    {"beta": dc.BETA, "loss_type": ["robust"], "label_smoothing": SMOOTHING}),
                   dc.METRICS, failures, loss_scale=robust_terms)
        same_length = (dc.simpo_records(base, dc.PAIRS, 7), dc.simpo_records(base, EVAL_PAIRS, 9))
        check_case(args.trainer, work, base, "text-orpo", same_length,
                   {"loss_type": "orpo", "beta": dc.BETA},
                   (ORPOTrainer, ORPOConfig, {"beta": dc.BETA}), ORPO_METRICS, failures)
        # Last: a DPOTrainer over a plain model (no PEFT) changes later runs' numbers in this
        # process.
        check_case(args.trainer, work, base, "full-sigmoid", text,
                   {"loss_type": "sigmoid", "beta": dc.BETA},
                   (DPOTrainer, DPOConfig, {"beta": dc.BETA, "loss_type": ["sigmoid"]}),
                   dc.METRICS, failures, lora=False)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
