#!/usr/bin/env python3
"""model.checkpointing: offload (CTest Checkpointing.OffloadKeepsTheLossesAndCountsTheBytes).

  offload_check.py TRAINER

A small GPT (3 blocks, width 32, context 16, batch 4) on synthetic tokens, 5 AdamW steps:
1. With model.checkpointing none, blocks and offload (every block recomputed, its input held in
   host memory from forward to backward), the logged losses are equal, bit for bit.
2. `trainer bench --json` reports activation_offload_bytes_per_step: with offload, each block's
   input, float32 [4, 16, 32], once a step: 3 x 4 x 16 x 32 x 4 bytes; with blocks, 0.
3. A value checkpointing does not take (offload:2) is exit 2 naming model.checkpointing.
"""
import json
import os
import subprocess
import sys
import tempfile

from run_check import report

LAYERS, BATCH, SEQ, WIDTH = 3, 4, 16, 32
CONFIG = {
    "seed": 0,
    "model": {"name": "gpt", "n_layer": LAYERS, "n_head": 2, "n_embd": WIDTH,
              "block_size": SEQ, "vocab_size": 64, "dropout": 0.1},
    "data": {"name": "synthetic_tokens", "num_classes": 64, "seq_len": SEQ,
             "batch_size": BATCH, "train_samples": 64, "val_samples": 8, "workers": 0},
    "train": {"max_steps": 5, "eval_at_end": False},
    "optim": {"name": "adamw", "lr": 0.01},
    "run": {"log_every": 1, "threads": 1, "progress": "never", "tensorboard": False},
}


def run(args, expect=0):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != expect:
        sys.exit(f"{' '.join(args[1:3])}: exit {r.returncode} (expected {expect}): "
                 f"{r.stderr[-2000:]}")
    return r


def main():
    trainer = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as work:
        config = os.path.join(work, "gpt.yaml")
        with open(config, "w") as f:
            json.dump(CONFIG, f)  # JSON is YAML
        losses = {}
        for mode in ("none", "blocks", "offload"):
            run_dir = os.path.join(work, mode)
            run([trainer, "--config", config, "--run-dir", run_dir, "--set",
                 f"model.checkpointing={mode}"])
            with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                losses[mode] = [r["loss"] for r in map(json.loads, f) if r["split"] == "train"]
        print(f"losses: none {losses['none']}, offload {losses['offload']}")
        if len(losses["none"]) != 5 or not losses["none"] == losses["blocks"] == losses["offload"]:
            failures.append(f"the losses differ: {losses}")
        for mode, expected in (("offload", LAYERS * BATCH * SEQ * WIDTH * 4), ("blocks", 0)):
            bench_json = os.path.join(work, f"bench_{mode}.json")
            run([trainer, "bench", "--config", config, "--steps", "2", "--warmup", "1", "--json",
                 bench_json, "--set", f"model.checkpointing={mode}"])
            with open(bench_json) as f:
                moved = json.load(f).get("activation_offload_bytes_per_step")
            print(f"{mode}: {moved} bytes offloaded a step (expected {expected})")
            if moved != expected:
                failures.append(f"{mode}: {moved} bytes offloaded a step, expected {expected}")
        r = run([trainer, "--config", config, "--run-dir", os.path.join(work, "bad"), "--set",
                 "model.checkpointing=offload:2"], expect=2)
        line = r.stderr.strip().splitlines()[-1]
        if "model.checkpointing" not in line or "offload" not in line:
            failures.append(f"offload:2: {r.stderr!r}")
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
