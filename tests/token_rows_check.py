#!/usr/bin/env python3
"""data.name: token_rows against transformers' causal LM loss (CTest
Data.TokenRowsTrainAsTransformersReadsThem).

  token_rows_check.py TRAINER

Rows as MLPerf's Llama 2 70B LoRA data set holds them (input_ids with labels -100 on the prompt
and the padding, an attention_mask 0 on the padding), of a tiny random Llama (lora_check.py's
base), in a Parquet file that pyarrow writes (training) and a JSONL file (validation):
1. The first step's loss at learning rate 0 (every training row in the batch) equals
   LlamaForCausalLM(input_ids, attention_mask, labels).loss of the same rows (1e-5 relative): each
   row a sample of its own, the targets the next ids where labels allow, padding masked.
2. data.pack: true (two rows a sample, attention kept inside each) gives the same loss (1e-5).
3. The end-of-run evaluation on the JSONL rows equals transformers' loss of them (1e-5).
4. Bad input, exit 2 and one line naming the file, the row and the column: labels that are not
   the input ids (nor -100), a file without input_ids.
Exits 77 (skipped) when transformers or pyarrow is not installed.
"""
import json
import os
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from lora_check import VOCAB, load_base, save_base
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

ROWS, LENGTH, PROMPT, PAD = 6, 48, 16, 8
TOL = 1e-5


def make_rows(seed, count):
    """`count` rows: input_ids, labels (-100 on the prompt and the padding), attention_mask."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        pad = PAD if i % 2 else 0  # every other row padded at its end
        ids = torch.randint(1, VOCAB, (LENGTH,), generator=g)
        ids[LENGTH - pad:] = 0
        labels = ids.clone()
        labels[:PROMPT] = -100
        labels[LENGTH - pad:] = -100
        mask = torch.ones(LENGTH, dtype=torch.long)
        mask[LENGTH - pad:] = 0
        rows.append({"input_ids": ids.tolist(), "labels": labels.tolist(),
                     "attention_mask": mask.tolist()})
    return rows


def reference_loss(base, rows):
    model = load_base(base)
    t = {k: torch.tensor([r[k] for r in rows]) for k in rows[0]}
    with torch.no_grad():
        return model(**t).loss.item()


def config(work, base, name, **data):
    path = os.path.join(work, f"{name}.yaml")
    cfg = {"seed": 0, "model": {"pretrained": base},
           "data": {"name": "token_rows", "root": work, "files": "train.parquet",
                    "val_files": "val.jsonl", "seq_len": LENGTH, "batch_size": ROWS,
                    "workers": 0, **data},
           "train": {"max_steps": 1, "eval_at_end": True},
           "optim": {"name": "adamw", "lr": 0.0},
           "run": {"log_every": 1, "threads": 1, "progress": "never", "tensorboard": False}}
    with open(path, "w") as f:
        json.dump(cfg, f)  # JSON is YAML
    return path


def losses(trainer, cfg, run_dir):
    r = subprocess.run([trainer, "--config", cfg, "--run-dir", run_dir], capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit(f"training failed: {r.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    train = [x["loss"] for x in records if x.get("split") == "train"]
    val = [x["loss"] for x in records if x.get("split") == "val"]
    return train, val


def refused(trainer, cfg, work, name, needles, failures):
    r = subprocess.run([trainer, "--config", cfg, "--run-dir", os.path.join(work, name)],
                       capture_output=True, text=True)
    line = (r.stderr.strip().splitlines() or [""])[-1]
    print(f"{name}: exit {r.returncode}, {line}")
    if r.returncode != 2 or not all(n in line for n in needles):
        failures.append(f"{name}: exit {r.returncode}, expected 2 naming {needles}: {r.stderr!r}")


def main():
    trainer = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as work:
        base = os.path.join(work, "base")
        save_base(base, seed=1)
        train, val = make_rows(1, ROWS), make_rows(2, 4)
        pq.write_table(pa.Table.from_pylist(train), os.path.join(work, "train.parquet"))
        with open(os.path.join(work, "val.jsonl"), "w") as f:
            for r in val:
                f.write(json.dumps(r) + "\n")
        theirs, theirs_val = reference_loss(base, train), reference_loss(base, val)
        for name, data in (("rows", {}), ("packed", {"pack": True, "seq_len": 2 * LENGTH,
                                                    "batch_size": ROWS // 2})):
            ours, ours_val = losses(trainer, config(work, base, name, **data),
                                    os.path.join(work, name))
            print(f"{name}: trainer's first loss {ours[0]:.6f}, transformers' {theirs:.6f}; "
                  f"validation {ours_val[-1] if ours_val else None}, transformers' "
                  f"{theirs_val:.6f}")
            if not ours or abs(ours[0] - theirs) > TOL * theirs:
                failures.append(f"{name}: first loss {ours}, transformers' {theirs}")
            if not ours_val or abs(ours_val[-1] - theirs_val) > TOL * theirs_val:
                failures.append(f"{name}: validation loss {ours_val}, transformers' {theirs_val}")
        bad = [dict(r) for r in train]
        bad[3] = dict(bad[3], labels=[5] + bad[3]["labels"][1:])
        bad[3]["input_ids"] = [6] + bad[3]["input_ids"][1:]
        pq.write_table(pa.Table.from_pylist(bad), os.path.join(work, "bad.parquet"))
        refused(trainer, config(work, base, "bad_labels", files="bad.parquet"), work,
                "bad_labels", ["bad.parquet", "row 3", "labels"], failures)
        pq.write_table(pa.Table.from_pylist([{"ids": r["input_ids"]} for r in train]),
                       os.path.join(work, "no_ids.parquet"))
        refused(trainer, config(work, base, "no_ids", files="no_ids.parquet"), work, "no_ids",
                ["no_ids.parquet", "input_ids"], failures)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
