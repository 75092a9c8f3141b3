#!/usr/bin/env python3
"""Chat data in any chat template, rendered by transformers into the token files that
`data.name: tokens` reads, with a mask file beside them.

  .venv/bin/python scripts/render_chat.py --tokenizer MODEL_DIR --out DIR
      [--train-on assistant|all|last|completion] [--val FILE.jsonl ... | --val-fraction 0.1]
      [--seed 0] FILE.jsonl ...

Each line of the files is a record {"messages": [...]} or {"prompt", "completion"} (strings, or
lists of messages), as data.name: chat reads them; messages may carry whatever the template
renders (tool calls, other roles), and a record's "tools" go to the template. It is rendered
with MODEL_DIR's chat template by apply_chat_template and tokenized as it tokenizes. Its trained
tokens are those --train-on names (data.train_on's meanings): an assistant turn is the text
between the render of the turns before it with add_generation_prompt=True and the render
including it, and its tokens are those overlapping that text (transformers' char_to_token). A
conversation whose turns render differently once later turns follow cannot be split so and is
skipped with a line saying so (train on last or all instead).

DIR gets train.bin and val.bin (little-endian uint16 when the vocabulary fits, else uint32), each
with its description train.bin.json / val.bin.json (the width, token count and vocabulary, as
`trainer tokenize` writes it: the tokens data set reads the width from it), and train.mask and
val.mask: one byte a token, 1 where it trains.
Conversations follow one another; a window of the tokens data set may span two, but no target
trains across them (a conversation's first token never trains).
"""
import argparse
import json
import os
import random
import sys

import numpy as np


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="JSONL files of the training conversations")
    p.add_argument("--tokenizer", required=True, help="a model folder with the chat template")
    p.add_argument("--out", required=True, help="the folder for train.bin, val.bin and masks")
    p.add_argument("--train-on", default="assistant",
                   choices=["assistant", "all", "last", "completion"])
    p.add_argument("--val", nargs="*", default=[], help="JSONL files of the validation ones")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="without --val: each conversation's chance to validate")
    p.add_argument("--seed", type=int, default=0, help="draws the validation conversations")
    return p.parse_args()


def records(path):
    """(FILE:LINE, record) of each non-blank line; exits 2 at a line that is not a record."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{where}:{e.colno}: not JSON: {e.msg}")
            if not isinstance(r, dict) or not ("messages" in r or "prompt" in r):
                sys.exit(f"{where}: a record needs \"messages\", or \"prompt\" and \"completion\"")
            yield where, r


def as_messages(part, role):
    return [{"role": role, "content": part}] if isinstance(part, str) else list(part)


class Renderer:
    def __init__(self, tokenizer):
        self.tok = tokenizer

    def text(self, messages, tools, generation=False):
        return self.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                            add_generation_prompt=generation)

    def turn(self, messages, i, tools, full):
        """The text span [a, b) of assistant message i in `full`, or None if it has none."""
        a = self.text(messages[:i], tools, generation=True)
        b = self.text(messages[:i + 1], tools)
        if not (full.startswith(a) and full.startswith(b)) or len(b) <= len(a):
            return None
        return len(a), len(b)

    def encode(self, where, r, train_on):
        """(ids, mask) of record r, or None (with a line why) when it cannot be masked."""
        tools = r.get("tools")
        if "messages" in r:
            messages, first = list(r["messages"]), None
            if train_on == "completion":
                sys.exit(f"{where}: --train-on completion needs {{\"prompt\", \"completion\"}} "
                         "records")
        else:
            messages = as_messages(r["prompt"], "user")
            first = len(messages)
            messages += as_messages(r["completion"], "assistant")
        if not messages:
            print(f"{where}: an empty conversation; skipped", file=sys.stderr)
            return None
        full = self.text(messages, tools)
        enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        spans = [(0, len(full))] if train_on == "all" else []
        wanted = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if train_on == "last":
            wanted = wanted[-1:]
        elif train_on == "completion":
            wanted = [first]
        for i in (wanted if train_on != "all" else []):
            span = self.turn(messages, i, tools, full)
            if span is None:
                print(f"{where}: turn {i} renders differently once later turns follow; skipped "
                      "(use --train-on last or all)", file=sys.stderr)
                return None
            spans.append(span if train_on != "completion" else (span[0], len(full)))
        ids = enc["input_ids"]
        mask = np.zeros(len(ids), np.uint8)
        for a, b in spans:
            lo, hi = enc.char_to_token(a), enc.char_to_token(b - 1)
            mask[lo:(len(ids) if hi is None else hi + 1)] = 1
        mask[:1] = 0
        if not mask.any():
            print(f"{where}: no token to train (--train-on {train_on}); skipped", file=sys.stderr)
            return None
        return ids, mask


def write_split(out, name, parts, vocab):
    dtype = np.uint16 if vocab <= 65536 else np.uint32
    ids = np.concatenate([np.asarray(p[0], dtype) for p in parts]) if parts else np.zeros(0, dtype)
    mask = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.uint8)
    for suffix, array in ((".bin", ids), (".mask", mask)):
        path = os.path.join(out, name + suffix)
        with open(path + ".tmp", "wb") as f:
            f.write(array.tobytes())
        os.replace(path + ".tmp", path)
    # The description the tokens data set reads the width and vocabulary from (as `trainer
    # tokenize` writes it beside its files): FILE.bin.json.
    sidecar = {"format": "trainer-tokens", "version": 1, "dtype": np.dtype(dtype).name,
               "tokens": int(len(ids)), "vocab_size": int(vocab), "documents": len(parts)}
    path = os.path.join(out, name + ".bin.json")
    with open(path + ".tmp", "w") as f:
        json.dump(sidecar, f)
    os.replace(path + ".tmp", path)
    trained = int(mask.sum())
    print(f"{name}: {len(parts)} conversations, {len(ids)} tokens ({dtype.__name__}), "
          f"{100.0 * trained / max(1, len(ids)):.1f}% trained")


def main():
    args = parse_args()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    if not tok.chat_template:
        sys.exit(f"{args.tokenizer} has no chat template")
    render = Renderer(tok)
    rng = random.Random(args.seed)
    splits = {"train": [], "val": []}
    for split, files in (("train", args.files), ("val", args.val)):
        for path in files:
            for where, r in records(path):
                encoded = render.encode(where, r, args.train_on)
                if encoded is None:
                    continue
                to_val = split == "val" or (not args.val and rng.random() < args.val_fraction)
                splits["val" if to_val else "train"].append(encoded)
    os.makedirs(args.out, exist_ok=True)
    vocab = len(tok)
    for name, parts in splits.items():
        write_split(args.out, name, parts, vocab)


if __name__ == "__main__":
    main()
