#!/usr/bin/env python3
"""Packed chat data trains as unpacked (CTest Packing.TrainsAsUnpacked).

  packing_check.py TRAINER

A byte-level BPE tokenizer `tokenizers` trains here (ChatML's special tokens, the published Qwen
2.5 template, tests/data/chat_templates/), 8 short training conversations and 3 validation ones.
The trainer runs 10 AdamW steps on them twice, each step holding every conversation: unpacked
(one conversation a row, batch 8) and packed (data.pack: true, as many rows as the packing makes,
read from the log). Each model, llama (grouped-query attention) and gpt, must give every step's
training loss and the validation loss of the packed run within 1e-5 (relative) of the unpacked
run's: in a packed row attention stays inside each conversation and positions restart at its
start. A model that cannot keep conversations apart (mlp) is refused at start naming data.pack
(exit 2).
Exits 77 (skipped) when tokenizers is not installed.
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread

one_intra_op_thread()  # before torch is imported

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

WORDS = ["packing", "rows", "hold", "several", "conversations", "the", "model", "attends",
         "inside", "each", "one", "positions", "restart", "at", "zero", "loss", "equal", "a", "b",
         "tokens", "train", "assistant", "user", "says", "hello", "why", "because", "numbers"]
STEPS = 10
failures = []


def fail(what):
    failures.append(what)
    print("FAIL: " + what)


def text(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def conversation(rng):
    # A system prompt always: Qwen's template otherwise adds its long default one.
    msgs = [{"role": "system", "content": text(rng, 1, 4)}]
    for _ in range(rng.randint(1, 2)):
        msgs.append({"role": "user", "content": text(rng, 1, 6)})
        msgs.append({"role": "assistant", "content": text(rng, 1, 8)})
    return {"messages": msgs}


def tokenizer_folder(work, records):
    """A byte-level BPE trained on the records' text, with the Qwen 2.5 (ChatML) template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[
        "<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([m["content"] for r in records for m in r["messages"]], trainer)
    d = os.path.join(work, "tokenizer")
    os.makedirs(d)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(HERE, "data", "chat_templates", "qwen2.5-instruct.json")) as f:
        config = json.load(f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({**config, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return d


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def config(work, model, pack, batch):
    """Every training conversation in every step (batch: all the samples), a constant rate."""
    return {
        "seed": 5,
        "device": "cpu",
        "model": model,
        "data": {"name": "chat", "root": os.path.join(work, "train.jsonl"),
                 "val_files": os.path.join(work, "val.jsonl"),
                 "tokenizer": os.path.join(work, "tokenizer"), "seq_len": 256, "pack": pack,
                 "batch_size": batch, "workers": 0},
        "optim": {"name": "adamw", "lr": 0.003},
        "sched": {"name": "constant"},
        "train": {"max_steps": STEPS},
        "run": {"log_every": 1, "eval_every": STEPS, "checkpoint_every": 10 * STEPS,
                "progress": "never", "tensorboard": False, "threads": 1},
    }


def train(trainer, work, name, cfg):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    run = os.path.join(work, name)
    r = subprocess.run([trainer, "--config", path, "--run-dir", run], capture_output=True,
                       text=True)
    return r, run


def losses(run):
    """The training losses by step and the last validation loss."""
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    train = [r["loss"] for r in rows if r["split"] == "train"]
    val = [r["loss"] for r in rows if r["split"] == "val"]
    return train, val[-1] if val else None


def relative(a, b):
    return abs(a - b) / abs(b)


def check_model(trainer, work, name, model):
    r, run = train(trainer, work, name + "-unpacked", config(work, model, False, 8))
    if r.returncode != 0:
        fail(f"{name} unpacked: exit {r.returncode}: {r.stderr[-1500:]}")
        return
    # The packed rows of the training split, from the log's line on them.
    r, _ = train(trainer, work, name + "-probe", {**config(work, model, True, 1),
                                                  "train": {"max_steps": 1}})
    m = re.search(r"chat train: 8 conversations.*?; (\d+) packed samples", r.stderr + r.stdout)
    if r.returncode != 0 or not m:
        fail(f"{name} packed: exit {r.returncode}, no packed rows in the log: {r.stderr[-1500:]}")
        return
    rows = int(m.group(1))
    if rows >= 8:
        fail(f"{name}: 8 conversations packed into {rows} rows: nothing to compare")
        return
    r, packed_run = train(trainer, work, name + "-packed", config(work, model, True, rows))
    if r.returncode != 0:
        fail(f"{name} packed: exit {r.returncode}: {r.stderr[-1500:]}")
        return
    want, want_val = losses(run)
    got, got_val = losses(packed_run)
    if len(want) != STEPS or len(got) != STEPS:
        fail(f"{name}: {len(want)} unpacked and {len(got)} packed steps logged, not {STEPS}")
        return
    gaps = [relative(g, w) for g, w in zip(got, want)]
    print(f"{name}: 8 conversations, unpacked 8 rows vs packed {rows} rows a step; loss "
          f"{want[0]:.6f} -> {want[-1]:.6f}; largest relative difference over {STEPS} steps "
          f"{max(gaps):.2e}; val {want_val:.8f} vs {got_val:.8f}")
    for step, (g, w, gap) in enumerate(zip(got, want, gaps), 1):
        if gap > 1e-5:
            fail(f"{name} step {step}: packed loss {g!r}, unpacked {w!r} (relative {gap:.2e})")
    if want_val is None or got_val is None or relative(got_val, want_val) > 1e-5:
        fail(f"{name}: packed validation loss {got_val!r}, unpacked {want_val!r}")
    if relative(want[-1], want[0]) < 1e-3:
        fail(f"{name}: the loss did not move ({want[0]} -> {want[-1]}): the check is blind")


def check_refused(trainer, work):
    """mlp cannot keep conversations apart: exit 2 naming data.pack and the model."""
    r, _ = train(trainer, work, "mlp-packed",
                 config(work, {"name": "mlp", "hidden": [16]}, True, 1))
    line = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    if r.returncode != 2 or "data.pack" not in r.stderr or "mlp" not in r.stderr:
        fail(f"mlp with data.pack: exit {r.returncode}, want 2 naming data.pack and mlp: "
             f"{r.stderr[-600:]}")
    else:
        print(f"mlp with data.pack: exit 2: {line}")


def main():
    trainer = sys.argv[1]
    rng = random.Random(45)
    train_records = [conversation(rng) for _ in range(8)]
    val_records = [conversation(rng) for _ in range(3)]
    with tempfile.TemporaryDirectory() as work:
        write_jsonl(os.path.join(work, "train.jsonl"), train_records)
        write_jsonl(os.path.join(work, "val.jsonl"), val_records)
        tokenizer_folder(work, train_records + val_records)
        llama = {"name": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
                 "intermediate_size": 64, "block_size": 256, "vocab_size": 0,
                 "tie_embeddings": False}
        gpt = {"name": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 32, "block_size": 256,
               "vocab_size": 0}
        check_model(trainer, work, "llama", llama)
        check_model(trainer, work, "gpt", gpt)
        check_refused(trainer, work)
    if failures:
        sys.exit(f"{len(failures)} failures; the first: {failures[0]}")
    print("packing: all checks pass")


if __name__ == "__main__":
    main()
