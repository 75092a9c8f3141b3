#!/usr/bin/env python3
"""The big recipes fit the servers they are written for, by the memory plan (CTest
Doctor.RecipesFitTheirServers).

  recipe_plans_check.py TRAINER REPO [--print]

`trainer doctor --config F --json --gpus N --gpu-memory M` plans each recipe as shipped, only its
model folder and data files replaced by stand-ins of the same shapes: a Hugging Face folder of
the published architecture whose shards are sparse files (real headers, holes for the data: the
plan reads headers only), and data files whose samples have the recipe's sequence length.
- configs/llama3_8b_qlora.yaml: Llama 3.1 8B QLoRA on one 24 GB GPU (an RTX 4090's 24,564 MiB);
  its chat data stand in as synthetic token windows of data.seq_len (packing fills each window);
- configs/llama2_70b_lora_mlperf.yaml: Llama 2 70B LoRA under fsdp on 8 GPUs of 80 GB (an H100
  SXM's 81,559 MiB), on Parquet token rows of 8,192 ids as MLPerf's GovReport holds them;
- configs/llama3_8b.yaml: Llama 3.1 8B trained whole from the seed under fsdp on 8 x 80 GB, on a
  uint32 token file.
Each plan must say "fits", and each config's header must quote the plan's per-GPU figure (the
text `GiB per GPU` after the figure doctor prints, to 0.1 GiB). --print prints the plans.
Exits 77 (skipped) when transformers or pyarrow is not installed.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

from plan_check import LLAMA2_70B, LLAMA31_8B, sparse_folder  # noqa: E402

GIB = 2**30


def token_rows(work, seq):
    """MLPerf's layout: data/train-*.parquet and data/validation-*.parquet, rows of `seq` ids."""
    root = os.path.join(work, "govreport")
    os.makedirs(os.path.join(root, "data"))
    ids = np.random.default_rng(0).integers(0, 32000, size=(4, seq))
    labels = np.where(np.arange(seq) < seq // 2, -100, ids)
    table = pa.table({"input_ids": ids.tolist(), "labels": labels.tolist()})
    for split in ("train", "validation"):
        pq.write_table(table, os.path.join(root, "data", f"{split}-00000-of-00001.parquet"))
    return root


def token_file(work, seq, vocab):
    root = os.path.join(work, "c4")
    os.makedirs(root)
    ids = np.random.default_rng(0).integers(0, vocab, size=4 * (seq + 1), dtype=np.uint32)
    for split in ("train", "val"):
        ids.tofile(os.path.join(root, f"{split}.bin"))
    return root


def recipes(work):
    """(config, GPUs, memory per GPU, --set overrides) of each recipe."""
    llama8b, _ = sparse_folder(work, "llama8b", LLAMA31_8B)
    # MLPerf's Llama 2 70B checkpoint trains 8,192-token rows: its config.json allows them.
    llama70b, _ = sparse_folder(work, "llama70b", {**LLAMA2_70B, "max_position_embeddings": 8192})
    synthetic = ["data.name=synthetic_tokens", f"data.num_classes={LLAMA31_8B['vocab_size']}",
                 "data.train_samples=64", "data.val_samples=2",
                 "data.pack=false", "data.train_on=all", "data.root="]
    return (
        ("configs/llama3_8b_qlora.yaml", 1, "24564MiB", [f"model.pretrained={llama8b}",
                                                         *synthetic]),
        ("configs/llama2_70b_lora_mlperf.yaml", 8, "81559MiB",
         [f"model.pretrained={llama70b}", f"data.root={token_rows(work, 8192)}"]),
        ("configs/llama3_8b.yaml", 8, "81559MiB",
         [f"data.root={token_file(work, 8192, LLAMA31_8B['vocab_size'])}"]),
    )


def plan(trainer, repo, config, gpus, memory, sets):
    args = [trainer, "doctor", "--json", "--config", os.path.join(repo, config), "--gpus",
            str(gpus), "--gpu-memory", memory]
    for s in sets:
        args += ["--set", s]
    r = subprocess.run(args, capture_output=True, text=True, cwd=repo)
    try:
        report_json = json.loads(r.stdout)
    except json.JSONDecodeError:
        sys.exit(f"{config}: doctor printed no JSON (exit {r.returncode}): {r.stderr[-2000:]}")
    message = next((f["message"] for f in report_json["findings"] if f["check"] == "memory"), "")
    if "memory" not in report_json:
        sys.exit(f"{config}: no memory plan: {r.stderr[-2000:]}")
    return report_json["memory"]["plan"], message


def quoted(repo, config):
    """The per-GPU figures (GiB) a config's header quotes: `N.N GiB per GPU`."""
    with open(os.path.join(repo, config)) as f:
        header = "".join(line for line in f if line.startswith("#"))
    return [float(x) for x in re.findall(r"([0-9]+\.[0-9]) GiB per GPU", header)]


def main():
    trainer, repo = sys.argv[1], os.path.abspath(sys.argv[2])
    only_print = "--print" in sys.argv[3:]
    failures = []
    with tempfile.TemporaryDirectory() as work:
        for config, gpus, memory, sets in recipes(work):
            p, message = plan(trainer, repo, config, gpus, memory, sets)
            gib = p["per_process_bytes"] / GIB
            parts = ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in p["parts"].items())
            print(f"{config} on {gpus} x {memory}: {gib:.1f} GiB per GPU "
                  f"({'fits' if p['fits'] else 'does not fit'}; {parts})")
            if only_print:
                continue
            if not p["fits"]:
                failures.append(f"{config}: does not fit: {message}")
            if round(gib, 1) not in quoted(repo, config):
                failures.append(f"{config}: the header does not quote the plan's "
                                f"{gib:.1f} GiB per GPU (it quotes {quoted(repo, config)})")
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
