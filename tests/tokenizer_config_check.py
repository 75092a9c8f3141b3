#!/usr/bin/env python3
"""tokenizer_config.json's bos_token and eos_token against transformers (CTest
Tokenizer.ConfigTokensAreTheTokenizers).

  tokenizer_config_check.py TRAINER CHAT_TOOL

A folder of a byte-level BPE tokenizer.json written by `tokenizers` (a merge, an added special
token) and a tokenizer_config.json:
- naming tokens the tokenizer holds (a vocabulary token, an added token, as a string or as an
  object with its content): trainer tokenize puts transformers' eos_token_id between two files;
- naming a token it lacks as bos_token or eos_token: transformers' AutoTokenizer gives that token
  an id no tokenizers id is (it adds a token); trainer tokenize exits 1 with one line naming
  tokenizer_config.json, the field and the token;
- naming no bos_token, with the llama3 chat format (chat_tool, as a chat run builds its data):
  exit 2, one line naming data.chat_template, tokenizer_config.json and bos_token.
Exits 77 (skipped) when tokenizers or transformers is not installed.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from run_check import one_intra_op_thread, report

one_intra_op_thread()

try:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

LLAMA3 = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def tokenizer_folder(work, name, config):
    """WORK/NAME: tokenizers' tokenizer.json (the 256 bytes, a merge, added special tokens) and
    `config` as tokenizer_config.json."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    vocab["ab"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ["<|stop|>"] + LLAMA3])
    path = os.path.join(work, name)
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(dict(config, tokenizer_class="PreTrainedTokenizerFast"), f)
    return path


def tokenize(trainer, work, folder):
    """(exit status, stderr, ids) of trainer tokenize of two one-line files with `folder`."""
    texts = []
    for i, text in enumerate(["ab ab\n", "ba\n"]):
        texts.append(os.path.join(work, f"text{i}.txt"))
        with open(texts[-1], "w") as f:
            f.write(text)
    out = os.path.join(work, "out.bin")
    if os.path.exists(out):
        os.remove(out)
    r = subprocess.run([trainer, "tokenize", "--tokenizer", folder, "--out", out, *texts],
                       capture_output=True, text=True)
    ids = np.fromfile(out, dtype=np.uint16).tolist() if r.returncode == 0 else None
    return r.returncode, r.stderr.strip(), ids


def check_named(trainer, work):
    """Tokens the tokenizer holds are accepted (the eos between files is transformers'); a token
    it lacks (transformers adds it) is exit 1 naming the file, field and token."""
    failures = []
    held = [("vocab", {"eos_token": "ab"}), ("added", {"eos_token": "<|stop|>"}),
            ("object", {"bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>"},
                        "eos_token": {"__type": "AddedToken", "content": "<|stop|>"}})]
    for name, config in held:
        folder = tokenizer_folder(work, name, config)
        hf = AutoTokenizer.from_pretrained(folder)
        plain = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        assert hf.eos_token_id < plain.get_vocab_size(), name
        rc, err, ids = tokenize(trainer, work, folder)
        want = plain.encode("ab ab\n").ids + [hf.eos_token_id] + plain.encode("ba\n").ids
        print(f"{name}: exit {rc}, ids {ids}, transformers' {want}")
        if rc != 0 or ids != want:
            failures.append(f"{name}: exit {rc}, ids {ids} (transformers' {want}): {err}")
    for key in ("bos_token", "eos_token"):
        for written in ("<|nope|>", {"__type": "AddedToken", "content": "<|nope|>"}):
            folder = tokenizer_folder(work, f"lacks_{key}", {key: written})
            hf = AutoTokenizer.from_pretrained(folder)
            plain = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
            added = hf.convert_tokens_to_ids("<|nope|>")
            assert plain.token_to_id("<|nope|>") is None and added >= plain.get_vocab_size()
            rc, err, _ = tokenize(trainer, work, folder)
            config = os.path.join(folder, "tokenizer_config.json")
            want = f'{config}: {key} "<|nope|>" is no token of {folder}/tokenizer.json'
            print(f"{key} {written}: exit {rc}: {err[:200]}")
            if rc != 1 or want not in err or "\n" in err or f"id {added}," not in err:
                failures.append(f"{key} {written}: exit {rc} (expected 1 with {want!r}, "
                                f"transformers' id {added}): {err}")
    return failures


def check_chat_without_bos(chat_tool, work):
    """The llama3 format on a folder whose tokenizer_config.json names no bos_token (and whose
    tokenizer.json has no post-processor): exit 2 naming tokenizer_config.json's field."""
    folder = tokenizer_folder(work, "no_bos", {"eos_token": "<|eot_id|>"})
    assert AutoTokenizer.from_pretrained(folder).bos_token is None
    chat = os.path.join(work, "chat")
    os.makedirs(chat, exist_ok=True)
    with open(os.path.join(chat, "train.jsonl"), "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "ab"},
                                         {"role": "assistant", "content": "ba"}]}) + "\n")
    out = os.path.join(work, "chat_out")
    os.makedirs(out, exist_ok=True)
    r = subprocess.run([chat_tool, out, "name=chat", f"root={chat}", f"tokenizer={folder}",
                        "chat_template=llama3", "files=train.jsonl", "dump=conversations"],
                       capture_output=True, text=True)
    err = r.stderr.strip()
    want = f"{folder}/tokenizer_config.json: bos_token is missing or null"
    print(f"chat without bos: exit {r.returncode}: {err[:200]}")
    if r.returncode != 2 or want not in err or "data.chat_template" not in err or "\n" in err:
        return [f"chat without bos: exit {r.returncode} (expected 2 with {want!r}): {err}"]
    return []


def main():
    trainer, chat_tool = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        failures = check_named(trainer, work) + check_chat_without_bos(chat_tool, work)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
