#!/usr/bin/env python3
"""Memory and speed of training on a large Parquet file through the chat data set.

  scripts/bench_chat_parquet.py TRAINER [GB] [--keep DIR]

Writes a Parquet file of about GB gigabytes (default 1.0) of chat records in /tmp (OpenAI
`messages`, a list of {role, content} structs a row, two to four turns of random words, row
groups of 64 MB, as datasets writes them) and a byte-level BPE tokenizer folder with the
llama3-instruct template (tests/data/chat_templates/). Then, each in a fresh process:

- trainer: one training step of a tiny Llama on the file (data.name chat, data.files the file,
  validation a small JSONL file), and the same run on a 1,000-row Parquet file of the same records
  (the baseline: LibTorch, the model, the tokenizer). The peak RSS (VmHWM, polled from
  /proc/PID/status) and wall time of each; the growth is the large file's peak less the
  baseline's, the rate its rows over the difference of the wall times (reading, rendering and
  tokenizing every conversation, which the chat data set does before the first step). The log
  line of the data set gives the tokens it holds.
- pyarrow: the same file read with ParquetFile.iter_batches + to_pylist (Python rows), defaults.

Prints one JSON object with the figures (docs/benchmarks.md, "Chat data set on a 1 GB Parquet
file"). The files are deleted afterwards unless --keep DIR names a folder for them.
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(ROOT, "tests", "data", "chat_templates", "llama3-instruct.json")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
WORDS = ("apple bread cloud dance eagle flame grape honey island jelly kite lemon mango night "
         "ocean piano queen river stone tiger violin water zebra amber breeze candle").split()
SCHEMA = pa.schema([("messages", pa.list_(pa.struct([("content", pa.string()),
                                                      ("role", pa.string())])))])


def conversations(rng, n):
    out = []
    for _ in range(n):
        msgs = []
        for _ in range(rng.randint(1, 2)):
            for role in ("user", "assistant"):
                msgs.append({"content": " ".join(rng.choices(WORDS, k=rng.randint(20, 120))),
                             "role": role})
        out.append({"messages": msgs})
    return out


def write_parquet(path, gb, rng):
    rows = 0
    with pq.ParquetWriter(path, SCHEMA) as w:
        while os.path.getsize(path) < gb * 1e9:
            batch = conversations(rng, 20000)
            w.write_table(pa.Table.from_pylist(batch, schema=SCHEMA), row_group_size=len(batch))
            rows += len(batch)
    return rows


def tokenizer_folder(d):
    os.makedirs(d)
    with open(TEMPLATE, encoding="utf-8") as f:
        config = json.load(f)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(([" " + w for w in WORDS] + WORDS) * 4 + [config["chat_template"]] * 2,
                            trainers.BpeTrainer(vocab_size=1000, special_tokens=SPECIALS,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({**config, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return d


def config(d, tok, files, val):
    path = os.path.join(d, f"chat-{os.path.basename(files)}.yaml")
    with open(path, "w") as f:
        json.dump({
            "seed": 0, "device": "cpu",
            "model": {"name": "llama", "n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 32,
                      "intermediate_size": 64, "block_size": 512, "vocab_size": 0},
            "data": {"name": "chat", "tokenizer": tok, "files": files, "val_files": val,
                     "seq_len": 512, "batch_size": 4, "workers": 0},
            "train": {"max_steps": 1, "eval_at_end": False},
            "run": {"log_every": 1, "progress": "never", "checkpoint_every": 0},
        }, f)
    return path


def status_mb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_trainer(trainer, cfg, run_dir):
    """Wall seconds, peak RSS in MB (VmHWM, the last reading before the process ended) and the
    data set's log line."""
    t0 = time.time()
    p = subprocess.Popen([trainer, "--config", cfg, "--run-dir", run_dir, "--log-level", "info"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0.0
    while p.poll() is None:
        hwm = status_mb(p.pid, "VmHWM")
        if hwm:
            peak = max(peak, hwm)
        time.sleep(0.05)
    wall = time.time() - t0
    out, err = p.communicate()
    if p.returncode != 0:
        sys.exit(f"{cfg}: exit {p.returncode}: {err[-2000:]}")
    line = next((x for x in err.splitlines() if re.search(r"chat train", x)), "")
    return wall, peak, line


def pyarrow_rows_per_s(path):
    code = ("import json,sys,time,pyarrow.parquet as pq\n"
            "t=time.time();n=0\n"
            "for b in pq.ParquetFile(sys.argv[1]).iter_batches(): n+=len(b.to_pylist())\n"
            "s=time.time()-t\n"
            "hwm=[l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
            "print(json.dumps({'rows':n,'seconds':s,'rows_per_s':n/s,'peak_mb':int(hwm)/1024}))")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout)


def main():
    trainer = os.path.abspath(sys.argv[1])
    args = sys.argv[2:]
    keep = None
    if "--keep" in args:
        keep = args[args.index("--keep") + 1]
        del args[args.index("--keep"):args.index("--keep") + 2]
    gb = float(args[0]) if args else 1.0
    d = keep or tempfile.mkdtemp(prefix="chat_parquet_bench_", dir="/tmp")
    os.makedirs(d, exist_ok=True)
    try:
        rng = random.Random(0)
        tok = tokenizer_folder(os.path.join(d, "tok"))
        big, small = os.path.join(d, "big.parquet"), os.path.join(d, "small.parquet")
        t0 = time.time()
        rows = write_parquet(big, gb, rng)
        print(f"wrote {big}: {os.path.getsize(big) / 1e9:.2f} GB, {rows} rows "
              f"({time.time() - t0:.0f} s)", file=sys.stderr)
        pq.write_table(pa.Table.from_pylist(conversations(rng, 1000), schema=SCHEMA), small)
        val = os.path.join(d, "val.jsonl")
        with open(val, "w") as f:
            for r in conversations(rng, 16):
                f.write(json.dumps(r) + "\n")
        base = run_trainer(trainer, config(d, tok, small, val), os.path.join(d, "run-small"))
        full = run_trainer(trainer, config(d, tok, big, val), os.path.join(d, "run-big"))
        py = pyarrow_rows_per_s(big)
        result = {
            "file_gb": os.path.getsize(big) / 1e9, "rows": rows,
            "baseline": {"wall_s": base[0], "peak_rss_mb": base[1], "log": base[2]},
            "trainer": {"wall_s": full[0], "peak_rss_mb": full[1], "log": full[2]},
            "rss_growth_mb": full[1] - base[1],
            "chat_rows_per_s": rows / max(1e-9, full[0] - base[0]),
            "pyarrow_to_pylist": py,
        }
        print(json.dumps(result, indent=2))
    finally:
        if keep is None:
            shutil.rmtree(d)


if __name__ == "__main__":
    main()
