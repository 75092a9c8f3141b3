#!/usr/bin/env python3
"""A model drawn from the seed under fsdp: no rank holds the whole model, and the shards hold what
one process draws (CTest Fsdp.SeededModelIsDrawnPerShard).

  seeded_fsdp_check.py TRAINER SOURCE_DIR [--layers N] [--all]

1. Values: a small llama (configs/llama3_tiny.yaml) drawn from the seed trains 3 AdamW steps
   under `trainer launch` with dist.strategy fsdp on 2 processes (each rank draws every matrix
   again and keeps its shard) to the losses of dist.strategy ddp on 2 (every rank the whole model
   as drawn), and with fsdp over 2 data-parallel ranks of tp 2 (4 processes) to those of tp 2 alone
   (2 processes) at the same global batch, within 1e-5 (the strategies sum gradients in another
   order). A gpt drawn from the seed goes through the same path: tests/test_fsdp.cpp trains gpts
   under fsdp against ddp at length.
2. Memory: a llama of the Hugging Face checks' big folder's shape (hidden 4096, intermediate
   11008, 32 heads, 8 key/value heads, vocabulary 256; 5 layers, or N: 7 is 4.97 GB in float32)
   built and sharded (--dry-run=load) under fsdp on 2 processes (with --all also under fsdp x tp
   2 on 4): the largest rank's growth, its peak RSS less that of the same job's --dry-run=plan
   (processes that hold no parameter storage), is at most 0.6x the float32 model, as
   lora_load_check.py measures a base read into shards: each rank keeps a half (a quarter) and
   one matrix drawn at a time. --all also measures the same model built whole in one process
   (what every rank built before).
"""
import json
import math
import os
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread, report

one_intra_op_thread()

try:
    from hf_llama_check import LAUNCH2, LAUNCH4, llama_shapes, peak_rss_of  # noqa: E402
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

HIDDEN, INTER, HEADS, KV, VOCAB = 4096, 11008, 32, 8, 256


def train_losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if r.get("split") == "train"]


def train(trainer, source, launch, config, run_dir, sets):
    args = [trainer, *launch, "--config", os.path.join(source, config), "--run-dir", run_dir]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(sets)}: training failed ({r.returncode}): {r.stderr[-2000:]}")
    return train_losses(run_dir)


def same_values(trainer, source, work):
    """1. Replayed shards against the whole model as drawn, by the losses they train to."""
    common = ["train.max_steps=3", "optim.name=adamw", "run.log_every=1", "run.eval_every=0",
              "train.eval_at_end=false", "run.progress=never", "data.workers=0",
              "run.checkpoint_every=0"]
    tiny = ("configs/llama3_tiny.yaml", ["model.n_layer=2", "model.n_embd=32", "model.n_head=4",
                                         "model.n_kv_head=2", "model.intermediate_size=64"])
    # name, config and its settings, (launcher, settings) of the reference and of the fsdp run
    cases = (("llama fsdp 2", tiny, (LAUNCH2, ["dist.strategy=ddp", "data.batch_size=4"]),
              (LAUNCH2, ["dist.strategy=fsdp", "data.batch_size=4"])),
             ("llama fsdp x tp 2", tiny, (LAUNCH2, ["dist.tp_size=2", "data.batch_size=8"]),
              (LAUNCH4, ["dist.tp_size=2", "dist.strategy=fsdp", "data.batch_size=4"])))
    failures = []
    for name, (config, sets), (ref_launch, ref_sets), (launch, fsdp_sets) in cases:
        label = name.replace(" ", "_")
        ref = train(trainer, source, ref_launch, config, os.path.join(work, label + "_ref"),
                    common + sets + ref_sets)
        got = train(trainer, source, launch, config, os.path.join(work, label), common + sets +
                    fsdp_sets)
        if len(got) != 3 or len(ref) != 3 or any(abs(a - b) > 1e-5 for a, b in zip(got, ref)):
            failures.append(f"{name}: losses {got} against {ref}")
        else:
            print(f"{name}: losses {got} equal {ref} within 1e-5")
    return failures


def big_config(work, layers):
    path = os.path.join(work, "big.yaml")
    with open(path, "w") as f:
        json.dump({"seed": 1, "model": {"name": "llama", "n_layer": layers, "n_head": HEADS,
                                        "n_kv_head": KV, "n_embd": HIDDEN,
                                        "intermediate_size": INTER, "block_size": 16,
                                        "vocab_size": 0, "tie_embeddings": False},
                   "data": {"name": "synthetic_tokens", "num_classes": VOCAB, "seq_len": 16,
                            "train_samples": 8, "val_samples": 4, "batch_size": 2,
                            "workers": 0},
                   "train": {"max_steps": 1}, "optim": {"name": "sgd", "lr": 0},
                   "run": {"progress": "never", "tensorboard": False}}, f)
    return path


def memory(trainer, work, layers, every):
    """2. The largest rank's peak RSS building and sharding the big llama from the seed."""
    config = big_config(work, layers)
    numel = sum(math.prod(shape) for shape in llama_shapes(HIDDEN, INTER, layers, HEADS, KV,
                                                           VOCAB).values())
    model_bytes = numel * 4
    layouts = [("fsdp 2", LAUNCH2, ["dist.strategy=fsdp"])]
    if every:
        layouts = [("one process, whole", [], [])] + layouts + \
            [("fsdp x tp 2", LAUNCH4, ["dist.strategy=fsdp", "dist.tp_size=2"])]
    failures = []
    for name, launch, sets in layouts:
        peaks = []
        for dry_run in ("--dry-run=plan", "--dry-run=load"):
            args = [trainer, *launch, "--config", config, dry_run]
            for s in sets:
                args += ["--set", s]
            code, err, peak = peak_rss_of(args)
            if code != 0:
                sys.exit(f"{name}: {dry_run} of the big llama failed ({code}): {err[-2000:]}")
            peaks.append(peak)
        growth = peaks[1] - peaks[0]
        print(f"{name}: {model_bytes / 1e9:.2f} GB float32 model ({layers} layers), the largest "
              f"process's peak RSS {peaks[1] / 1e9:.2f} GB, {growth / 1e9:.2f} GB above a "
              f"planned one's = {growth / model_bytes:.2f}x")
        if launch and growth > 0.6 * model_bytes:
            failures.append(f"{name}: a rank's growth {growth} > 0.6 x {model_bytes}")
    return failures


def main():
    trainer, source = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    layers = int(args[args.index("--layers") + 1]) if "--layers" in args else 5
    with tempfile.TemporaryDirectory() as work:
        failures = same_values(trainer, source, work)
        failures += memory(trainer, work, layers, "--all" in args)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
