#!/usr/bin/env python3
"""The chat data set (data.name: chat, src/data/tokens/chat.h) against transformers' apply_chat_template
(CTest Chat.MatchesApplyChatTemplate).

  chat_check.py CHAT_TOOL TRAINER

Tokenizers: Llama 3's and Qwen 3's real vocabularies (quicktok-v1's ranks as tokenizer.json,
scripts/quicktok_tokenizer_json.py: Qwen's with NFC), each in a folder whose tokenizer_config.json
holds a published chat template (tests/data/chat_templates/: Llama 3, 3.1, 3.2 Instruct; Qwen 2,
2.5 Instruct; Qwen 3 as first released and as updated; plain ChatML), and a small one `tokenizers`
trains here. Data made here: 200 conversations (one to four rounds, system prompts first and
later, a final user turn without answer, the text of many scripts, text that NFC changes,
whitespace at the edges that the Llama templates trim, <think> blocks and reasoning_content,
special tokens written in the text) and 60 prompt/completion records (strings and message lists).

- Tokens: for every template, each conversation's ids equal apply_chat_template(tokenize=True)
  with it, the tokenizer.json wrapped in PreTrainedTokenizerFast.
- Tool calls (chat_tool_calls.py): OpenAI-style tool_calls, tool messages and a record's tools
  with the Llama 3.1, 3.2, Qwen 2.5 and 3 templates: ids equal apply_chat_template(messages,
  tools=tools), masks of train_on assistant and last as below; tools in the other formats, and
  what the templates raise on, refused naming the line.
- Masks, for each data.train_on: an assistant turn is the text between the render of the turns
  before it with add_generation_prompt=True and the render including it (for Qwen 3's turns
  before the last user message, which lose their <think> block once a user message follows: the
  renders with a user message after), its tokens those the text overlaps
  (char_to_token). assistant: every turn; last: the last; completion: the completion's first turn
  to the end; all: every token but the first. A conversation without a trained token is dropped,
  with a warning naming its line.
- Llama 3.2 dates its system header today (transformers' strftime_now) unless data.chat_date;
  data.chat_template: llama3, chatml, plain on a folder without a template equal the published
  templates (plain: bos, the contents, eos after each assistant one).
- Another template: exit 2 naming data.chat_template and scripts/render_chat.py; render_chat.py
  writes token and mask files equal to the reference, and the tokens data set reads the mask.
- Bad input: not JSON (a number beyond a double's range too), a JSON array file (as Alpaca's
  pretty-printed alpaca_data.json) with a bad element (its first line named) or without a comma
  between elements (line and column named), a role outside the templates, a
  content that is not a string, a messages record under train_on completion, an empty
  conversation, no trained token: a line naming the file and line (exit 2, or a warning and the
  line dropped); a tokenizer_config.json chat_template that is not text: exit 2 naming the file.
- Samples: cut to data.seq_len (a conversation whose first trained token is cut off dropped and
  counted in the log), targets -100 where they do not train; packed, every conversation once with
  positions from 0 and the log's share of positions used; a tiny Llama (transformers, float64)
  given the packed rows with the block-causal mask the positions define has the loss of the
  unpacked rows within 1e-5.
- Training: a llama run on chat data (unpacked and packed) stopped after step 4 and resumed
  equals an uninterrupted one bit for bit.
Exits 77 (skipped) when transformers, tokenizers or quicktok is not installed.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

from chat_reference import hf_tokenizer, run_tool
from chat_tool_calls import bad_cases as tool_bad_cases, check_tool_calls
from run_check import one_intra_op_thread

one_intra_op_thread()  # before torch is imported

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
try:
    import numpy as np
    import torch
    import quicktok  # noqa: F401
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    import quicktok_tokenizer_json as qj
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

TEMPLATES = os.path.join(HERE, "data", "chat_templates")
# Template file -> (vocabulary, the format trainer recognises it as).
CASES = {"llama3-instruct": ("llama3", "llama3"), "llama3.1-instruct": ("llama3", "llama3.1"),
         "llama3.2-instruct": ("llama3", "llama3.2"), "qwen2-instruct": ("qwen3", "qwen2"),
         "qwen2.5-instruct": ("qwen3", "qwen2.5"), "qwen3": ("qwen3", "qwen3"),
         "qwen3-first-release": ("qwen3", "qwen3"), "chatml": ("qwen3", "chatml")}
MODES = ["assistant", "all", "last"]
MARK = "\ue000mark"
failures = []


def fail(what):
    failures.append(what)
    print("FAIL:", what)


# ---- data made here -------------------------------------------------------------------------

PIECES = ["Hello there", "how are you?", "naïve café", "日本語のテキストです", "Ελληνικά γράμματα",
          "עברית עם ניקוד", "العربية", "emoji 👩‍💻🎉👍🏽", "한국어 문장", "e\u0301 then a\u0308",
          "\u1100\u1161\u11a8 jamo", "ﬁ ligature", "12345 67.89", "def f(x):\n    return x * 2",
          "tabs\tand  spaces", "line\r\nbreak", "русский текст", "हिन्दी", "ภาษาไทย", "don't we'll",
          "$$$ !!! ???", "`code`", "\u00a0nbsp", "…and so on", "x</think>y", "😀" * 3]
EDGES = ["", "", "", " ", "\n", "  \n", "\u3000", "\t", "\n\n", "\xa0", "\u2028", "\r\n"]
SPECIALS = ["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|begin_of_text|>"]


def text(rng):
    parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 6))]
    body = "".join(p + rng.choice([" ", "\n", ". ", ""]) for p in parts).rstrip()
    if rng.random() < 0.03:
        body += rng.choice(SPECIALS) + rng.choice(PIECES)
    return rng.choice(EDGES) + body + rng.choice(EDGES)


def assistant(rng):
    m = {"role": "assistant", "content": text(rng)}
    r = rng.random()
    if r < 0.15:
        m["content"] = "<think>\n" + text(rng) + "\n</think>\n\n" + m["content"]
    elif r < 0.25:
        m["reasoning_content"] = text(rng)
    elif r < 0.28:
        m["content"] = ""
    return m


def conversation(rng):
    msgs = [{"role": "system", "content": text(rng)}] if rng.random() < 0.5 else []
    rounds = rng.randint(1, 4)
    for r in range(rounds):
        msgs.append({"role": "user", "content": text(rng)})
        if rng.random() < 0.1:
            msgs.append({"role": "system", "content": text(rng)})
        if r < rounds - 1 or rng.random() < 0.9:
            msgs.append(assistant(rng))
    return {"messages": msgs}


def prompt_completion(rng):
    r = rng.random()
    if r < 0.4:
        return {"prompt": text(rng), "completion": text(rng)}
    prompt = conversation(rng)["messages"]
    while prompt[-1]["role"] != "user":
        prompt.pop()
    completion = text(rng) if r < 0.7 else [assistant(rng)]
    return {"prompt": prompt, "completion": completion}


def as_messages(record):
    """(messages, index of the completion's first message or None)."""
    if "messages" in record:
        return record["messages"], None
    p, c = record["prompt"], record["completion"]
    p = [{"role": "user", "content": p}] if isinstance(p, str) else p
    c = [{"role": "assistant", "content": c}] if isinstance(c, str) else c
    return p + c, len(p)


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


# ---- tokenizers -----------------------------------------------------------------------------

def template_file(name):
    with open(os.path.join(TEMPLATES, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


def folder(work, name, vocab_json, config):
    """A tokenizer folder: the vocabulary's tokenizer.json and `config` as tokenizer_config."""
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    link = os.path.join(d, "tokenizer.json")
    if not os.path.exists(link):
        os.symlink(vocab_json, link)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({**config, "tokenizer_class": "PreTrainedTokenizerFast"}, f, ensure_ascii=False)
    return d


def small_tokenizer(work, records):
    """A byte-level BPE `tokenizers` trains on the records' text, with ChatML's tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[
        "<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [m["content"] for r in records for m in as_messages(r)[0]]
    tok.train_from_iterator(texts, trainer)
    path = os.path.join(work, "small.json")
    tok.save(path)
    config = template_file("qwen2.5-instruct")
    return folder(work, "small", path, config), path, config


# ---- the reference --------------------------------------------------------------------------

def render(t, msgs, gen=False, **kw):
    return t.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw)


def cut_before(text, marker):
    return text[:text.index(marker)]


def turn_spans(t, msgs, full, **kw):
    """(message index, begin, end) of every assistant turn in `full`, the reference's way: where
    the render of the turns before it with add_generation_prompt=True ends, and where the render
    including it ends. Qwen 3's turns render otherwise once a user message follows (a <think>
    block dropped) or while they are the last (an empty one added): then the turns as they render
    with a user message (or a tool message) after them, the first of these that is a prefix of
    the whole."""
    user, tool = {"role": "user", "content": MARK}, {"role": "tool", "content": MARK}
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        starts = [lambda: render(t, msgs[:i], gen=True, **kw),
                  lambda: cut_before(render(t, msgs[:i] + [user], **kw), "<|im_start|>user\n" +
                                     MARK) + "<|im_start|>assistant\n"]
        ends = [lambda: render(t, msgs[:i + 1], **kw),
                lambda: cut_before(render(t, msgs[:i + 1] + [user], **kw),
                                   "<|im_start|>user\n" + MARK),
                lambda: cut_before(render(t, msgs[:i + 1] + [tool], **kw),
                                   "<|im_start|>user\n<tool_response>\n" + MARK)]
        a = next((x for x in (f() for f in starts) if full.startswith(x)), None)
        b = next((x for x in (f() for f in ends) if full.startswith(x)), None)
        if a is None or b is None:
            raise AssertionError(f"the renders of turn {i} are not prefixes of the whole")
        spans.append((i, len(a), len(b)))
    return spans


def masks(enc, spans_by_mode):
    """mode -> trained flags of the tokens of `enc` (offsets mapping), from character spans."""
    out = {}
    n = len(enc["input_ids"])
    for mode, spans in spans_by_mode.items():
        trained = [0] * n
        for a, b in spans:
            lo, hi = enc.char_to_token(a), enc.char_to_token(b - 1)
            for k in range(lo, hi + 1):
                trained[k] = 1
        trained[0] = 0
        out[mode] = trained
    return out


def reference(t, record, **kw):
    """(ids, {mode: trained}) of a record by transformers (with its "tools", where it has some)."""
    msgs, first = as_messages(record)
    if record.get("tools") is not None:
        kw = dict(kw, tools=record["tools"])
    full = render(t, msgs, **kw)
    ids = t.apply_chat_template(msgs, tokenize=True, **kw)
    enc = t(full, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == list(ids)
    spans = turn_spans(t, msgs, full, **kw)
    modes = {"all": [(0, len(full))], "assistant": [(a, b) for _, a, b in spans],
             "last": [spans[-1][1:]] if spans else []}
    if first is not None:
        modes["completion"] = [(a, len(full)) for i, a, _ in spans if i == first]
    return list(ids), masks(enc, modes)


def plain_reference(t, bos, eos, record):
    msgs, first = as_messages(record)
    full, spans = bos, []
    for m in msgs:
        start = len(full)
        full += m["content"] + (eos if m["role"] == "assistant" else "")
        if m["role"] == "assistant":
            spans.append((start, len(full)))
    enc = t(full, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], masks(enc, {"assistant": spans})


# ---- the tool -------------------------------------------------------------------------------

def tool(chat_tool, out, *settings):
    """(exit status, stderr, conversations by name, samples) of chat_tool with data.KEY=VALUE."""
    os.makedirs(out, exist_ok=True)
    for f in ("conversations.jsonl", "samples.jsonl", "stderr.txt"):
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    code, err = run_tool(chat_tool, out, settings)
    conversations, samples = {}, []
    path = os.path.join(out, "conversations.jsonl")
    if code == 0 and os.path.exists(path):
        with open(path) as f:
            for line in f:
                c = json.loads(line)
                conversations[c["name"]] = c
    path = os.path.join(out, "samples.jsonl")
    if code == 0 and os.path.exists(path):
        with open(path) as f:
            samples = [json.loads(line) for line in f]
    return code, err, conversations, samples


def compare(what, got, want, mode, stderr):
    """got: the tool's conversations by name; want: name -> (ids, masks) of every record."""
    kept = {n: w for n, w in want.items() if any(w[1][mode])}
    if set(got) != set(kept):
        fail(f"{what}: {len(got)} conversations, {len(kept)} expected; missing "
             f"{sorted(set(kept) - set(got))[:3]}, extra {sorted(set(got) - set(kept))[:3]}")
        return
    bad = 0
    for name, (ids, m) in kept.items():
        g = got[name]
        if g["ids"] != ids or g["trained"] != m[mode]:
            bad += 1
            if bad <= 2:
                k = next((i for i, (x, y) in enumerate(zip(g["ids"], ids)) if x != y), None)
                fail(f"{what}: {name}: ids equal {g['ids'] == ids} (first difference at {k}), "
                     f"trained equal {g['trained'] == m[mode]}")
    dropped = sorted((n for n in want if n not in kept), key=lambda n: (n.split(":")[0],
                                                                       int(n.split(":")[1])))
    for n in dropped[:5]:
        if f"{n}: no token to train" not in stderr:
            fail(f"{what}: no warning names the dropped {n}")
    if bad == 0:
        print(f"{what}: {len(kept)} conversations equal ({len(dropped)} dropped)")


def check_templates(chat_tool, work, vocab, records):
    files = {"chat": os.path.join(work, "chat.jsonl"), "pc": os.path.join(work, "pc.jsonl")}
    for name, (voc, fmt) in CASES.items():
        config = template_file(name)
        d = folder(work, "tpl-" + name, vocab[voc], config)
        t = hf_tokenizer(vocab[voc], config)
        want = {f"{files[f]}:{i + 1}": reference(t, r) for f in files for i, r in
                enumerate(records[f])}
        for mode in MODES + ["completion"]:
            pattern = "pc.jsonl" if mode == "completion" else "{chat,pc}.jsonl"
            rc, err, got, _ = tool(chat_tool, os.path.join(work, "out"), f"root={work}",
                                   f"files={pattern}", f"tokenizer={d}", f"train_on={mode}",
                                   "dump=conversations")
            if rc != 0:
                fail(f"{name} {mode}: exit {rc}: {err[-500:]}")
                continue
            if f"holds the published {fmt} template" not in err:
                fail(f"{name}: not recognised as {fmt}: {err[-300:]}")
            if fmt == "llama3.2" and "set data.chat_date" not in err:
                fail("llama3.2 without data.chat_date: no warning that it dates today")
            scope = {n: w for n, w in want.items() if mode != "completion" or "pc.jsonl" in n}
            compare(f"{name} train_on {mode}", got, scope, mode, err)
        if fmt in ("llama3.1", "llama3.2"):
            date = "01 Feb 2025"
            want = {f"{files['chat']}:{i + 1}": reference(t, r, date_string=date)
                    for i, r in enumerate(records["chat"])}
            rc, err, got, _ = tool(chat_tool, os.path.join(work, "out"), f"root={files['chat']}",
                                   f"tokenizer={d}", f"chat_date={date}", "dump=conversations")
            compare(f"{name} chat_date {date}", got, want, "assistant", err)


def check_forced(chat_tool, work, vocab, records):
    """data.chat_template on folders without a template: as the published ones, and plain."""
    chat = os.path.join(work, "chat.jsonl")
    for fmt, voc, published in (("llama3", "llama3", "llama3-instruct"),
                                ("chatml", "qwen3", "chatml")):
        config = template_file(published)
        bare = {k: v for k, v in config.items() if k != "chat_template"}
        d = folder(work, "bare-" + voc, vocab[voc], bare)
        t = hf_tokenizer(vocab[voc], config)
        want = {f"{chat}:{i + 1}": reference(t, r) for i, r in enumerate(records["chat"])}
        rc, err, got, _ = tool(chat_tool, os.path.join(work, "out"), f"root={chat}",
                               f"tokenizer={d}", f"chat_template={fmt}", "dump=conversations")
        if rc != 0:
            fail(f"forced {fmt}: exit {rc}: {err[-300:]}")
        else:
            compare(f"forced {fmt}", got, want, "assistant", err)
        rc, err, _, _ = tool(chat_tool, os.path.join(work, "out"), f"root={chat}",
                             f"tokenizer={d}")
        if rc != 2 or "data.chat_template" not in err or "render_chat.py" not in err:
            fail(f"no template, auto: exit {rc}: {err[-300:]}")
    config = template_file("llama3-instruct")
    t = hf_tokenizer(vocab["llama3"], config)
    bos = "<|begin_of_text|>"  # the post-processor's: what encoding adds
    want = {f"{chat}:{i + 1}": plain_reference(t, bos, config["eos_token"], r)
            for i, r in enumerate(records["chat"])}
    rc, err, got, _ = tool(chat_tool, os.path.join(work, "out"), f"root={chat}",
                           f"tokenizer={work}/bare-llama3", "chat_template=plain",
                           "dump=conversations")
    compare("forced plain", got, want, "assistant", err)


def check_other_template(chat_tool, work, vocab, records):
    """A template of its own: exit 2; render_chat.py's token files; the tokens data set's mask."""
    config = template_file("qwen2.5-instruct")
    config["chat_template"] += "{#- a local edit #}"
    d = folder(work, "custom", vocab["qwen3"], config)
    chat, pc = os.path.join(work, "chat.jsonl"), os.path.join(work, "pc.jsonl")
    rc, err, _, _ = tool(chat_tool, os.path.join(work, "out"), f"root={chat}", f"tokenizer={d}")
    if rc != 2 or "data.chat_template" not in err or "render_chat.py" not in err:
        fail(f"an unknown template: exit {rc}: {err[-300:]}")
    out = os.path.join(work, "rendered")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "render_chat.py"),
                        "--tokenizer", d, "--out", out, "--val", pc, "--", chat],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"render_chat.py: exit {r.returncode}: {r.stderr[-500:]}")
        return
    t = hf_tokenizer(vocab["qwen3"], config)
    for split, recs in (("train", records["chat"]), ("val", records["pc"])):
        want = [reference(t, x) for x in recs]
        want = [(ids, m["assistant"]) for ids, m in want if any(m["assistant"])]
        ids = np.fromfile(os.path.join(out, split + ".bin"), np.uint32)
        mask = np.fromfile(os.path.join(out, split + ".mask"), np.uint8)
        if (ids.tolist() != [i for w in want for i in w[0]] or
                mask.tolist() != [k for w in want for k in w[1]]):
            fail(f"render_chat.py {split}: the token or mask file differs from the reference")
    # The tokens data set: validation windows tile val.bin, targets -100 where the mask is 0.
    rc, err, _, samples = tool(chat_tool, os.path.join(work, "out"), "name=tokens",
                               f"root={out}", "token_format=uint32", "seq_len=32")
    ids = np.fromfile(os.path.join(out, "val.bin"), np.uint32).astype(np.int64)
    mask = np.fromfile(os.path.join(out, "val.mask"), np.uint8)
    val = [s for s in samples if s["split"] == "val"]
    if rc != 0 or not val:
        fail(f"the tokens data set on render_chat.py's files: exit {rc}: {err[-300:]}")
        return
    for s in val:
        a = s["index"] * 32
        want = np.where(mask[a + 1:a + 33] > 0, ids[a + 1:a + 33], -100).tolist()
        if s["inputs"] != ids[a:a + 32].tolist() or s["targets"] != want:
            fail(f"tokens data set: val sample {s['index']}'s targets ignore the mask")
            break
    else:
        print(f"another template: exit 2; render_chat.py's files equal the reference; the tokens "
              f"data set masks {len(val)} validation windows")
    with open(os.path.join(out, "val.mask"), "r+b") as f:
        f.truncate(len(mask) - 1)
    rc, err, _, _ = tool(chat_tool, os.path.join(work, "out"), "name=tokens", f"root={out}",
                         "token_format=uint32", "seq_len=32")
    if rc != 1 or f"val.mask: {len(mask) - 1} bytes for the {len(mask)} tokens" not in err:
        fail(f"a mask file one byte short: exit {rc}: {err[-300:]}")


def check_bad_input(chat_tool, work, small):
    """Each case a line naming the file and line; the small tokenizer's folder (the Qwen 2.5
    template): what is bad is the record, whatever the vocabulary."""
    d = small
    good = json.dumps({"messages": [{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "hello"}]})
    val = os.path.join(work, "good.jsonl")
    write_jsonl(val, [json.loads(good)] * 3)
    small_json = os.path.realpath(os.path.join(d, "tokenizer.json"))
    number_template = folder(work, "tpl-number", small_json, {"chat_template": 5})
    array_lines = json.dumps([json.loads(good), {"messages": [{"role": "user", "content": ["a"]}]}],
                             indent=4).splitlines()
    array_bad_line = [i for i, line in enumerate(array_lines) if line == "    {"][1] + 1
    cases = [  # (lines, settings, exit status, text the message holds)
        ([good, "", "{not json"], [], 2, "bad.jsonl:3:"),
        (['{"messages": [{"role": "user", "content": ["a"]}]}'], [], 2,
         "bad.jsonl:1: messages[0].content must be a string"),
        ([good], ["train_on=completion"], 2, "bad.jsonl:1: data.train_on: completion"),
        ([good, '{"messages": []}', good], [], 0, "bad.jsonl:2: an empty conversation; skipped"),
        ([good, '{"messages": [{"role": "user", "content": "a"}]}'], [], 0,
         "bad.jsonl:2: no token to train"),
        ([good], ["tokenizer=/nonexistent/tok"], 2, "data.tokenizer: /nonexistent/tok"),
        ([good, '{"messages": [{"role": "user", "content": 1e999}]}'], [], 2,
         "bad.jsonl:2: not JSON: number overflow parsing '1e999'"),
        ([good], [f"val_files={work}"], 2, f"data.val_files: {work} is a folder"),
        ([good], [f"tokenizer={number_template}"], 2,
         "tokenizer_config.json: chat_template is 5, not a template's text"),
        # A pretty-printed JSON array (as Alpaca's alpaca_data.json): a bad element names the
        # line it starts on; an array without a comma between elements, the line and column.
        (array_lines, [], 2, f"bad.jsonl:{array_bad_line}: messages[0].content must be a string"),
        (["[", good, good, "]"], [], 2,
         "bad.jsonl:3:1: expected ',' or ']' after the element that starts on line 2"),
    ] + tool_bad_cases(good, work)
    bad = os.path.join(work, "bad.jsonl")
    for lines, settings, status, message in cases:
        with open(bad, "w") as f:
            f.write("\n".join(lines) + "\n")
        args = [f"root={bad}", f"val_files={val}", f"tokenizer={d}"] + settings
        args = [a for a in args if not (a.startswith("tokenizer=") and any(
            s.startswith("tokenizer=") for s in settings) and a not in settings)]
        rc, err, _, _ = tool(chat_tool, os.path.join(work, "out"), *args)
        if rc != status or message not in err or "json.exception" in err:
            fail(f"bad input {message!r}: exit {rc}: {err[-400:]}")
    print(f"bad input: {len(cases)} cases, each one line naming the file and line")


def segments(sample):
    """(inputs, targets) of each document of a packed row, by its positions."""
    out = []
    for j, p in enumerate(sample["positions"]):
        if p == 0:
            out.append(([], []))
        out[-1][0].append(sample["inputs"][j])
        out[-1][1].append(sample["targets"][j])
    return out


def expected_rows(conversations, seq_len):
    """name -> (inputs, targets) of each conversation kept at seq_len; and the names cut off."""
    rows, cut = {}, []
    for name, c in conversations.items():
        ids, trained = c["ids"], c["trained"]
        if trained.index(1) > seq_len:
            cut.append(name)
            continue
        n = min(len(ids), seq_len + 1) - 1
        rows[name] = (ids[:n], [ids[j + 1] if trained[j + 1] else -100 for j in range(n)])
    return rows, cut


def check_samples(chat_tool, work, vocab):
    d = os.path.join(work, "tpl-qwen2.5-instruct")
    chat, pc = os.path.join(work, "chat.jsonl"), os.path.join(work, "pc.jsonl")
    pad = transformers.PreTrainedTokenizerFast(tokenizer_file=vocab["qwen3"]).convert_tokens_to_ids(
        "<|endoftext|>")
    seq = 96
    base = [f"root={chat}", f"val_files={pc}", f"tokenizer={d}", f"seq_len={seq}"]
    rc, err, convs, samples = tool(chat_tool, os.path.join(work, "out"), *base)
    if rc != 0:
        fail(f"samples: exit {rc}: {err[-300:]}")
        return
    rows, cut = expected_rows(convs, seq)
    names = [s["name"] for s in samples]
    if sorted(names) != sorted(rows) or any("positions" in s for s in samples):
        fail(f"unpacked: {len(names)} samples for {len(rows)} conversations kept")
    for s in samples:
        ins, tgt = rows[s["name"]]
        if (s["inputs"] != ins + [pad] * (seq - len(ins)) or
                s["targets"] != tgt + [-100] * (seq - len(tgt))):
            fail(f"unpacked sample {s['name']}: inputs or targets differ")
            break
    cut_train = sum(1 for n in cut if n.startswith(chat))
    if cut_train == 0 or f"({cut_train} more dropped" not in err:
        fail(f"{cut_train} training conversations cut off at data.seq_len {seq}: not in the log")
    print(f"unpacked: {len(samples)} samples of {seq} tokens; {len(cut)} conversations dropped")
    rc, err, _, packed = tool(chat_tool, os.path.join(work, "out"), *base, "pack=true")
    for split in ("train", "val"):
        want = sorted((tuple(i), tuple(t)) for n, (i, t) in rows.items()
                      if n.startswith(chat if split == "train" else pc))
        got, used = [], 0
        split_samples = [s for s in packed if s["split"] == split]
        for s in split_samples:
            segs = segments(s)
            if all(x == pad for x in segs[-1][0]) and all(x == -100 for x in segs[-1][1]):
                segs.pop()  # padding
            got += [(tuple(i), tuple(t)) for i, t in segs]
            used += sum(len(i) for i, _ in segs)
        if sorted(got) != want:
            fail(f"packed {split}: the rows do not hold each conversation once")
        if len(split_samples) >= len(want):
            fail(f"packed {split}: {len(want)} conversations in {len(split_samples)} rows")
        share = f"{100.0 * used / (len(split_samples) * seq):.1f}% of their positions used"
        if share not in err:
            fail(f"packed {split}: the log does not say {share!r}: {err[-400:]}")
        print(f"packed {split}: {len(want)} conversations in {len(split_samples)} rows, {share}")


def loss(model, samples, vocab_size, packed):
    """The mean cross-entropy of the rows' trained targets; packed rows block-causal. Each row is
    cut after its last trained target (the padding after it): a causal model's logits before a
    position do not see it."""
    total, count = 0.0, 0
    for s in samples:
        trained = [j for j, t in enumerate(s["targets"]) if t != -100]
        if not trained:
            continue
        n = trained[-1] + 1
        inputs, targets = torch.tensor([s["inputs"][:n]]), torch.tensor(s["targets"][:n])
        kw = {}
        if packed:
            pos = torch.tensor([s["positions"][:n]])
            doc = (pos == 0).cumsum(-1)
            t = torch.arange(n)
            allowed = (doc[:, :, None] == doc[:, None, :]) & (t[:, None] >= t[None, :])
            mask = torch.zeros(allowed.shape, dtype=torch.float64)
            kw = {"attention_mask": mask.masked_fill(~allowed, float("-inf"))[:, None],
                  "position_ids": pos}
        with torch.no_grad():
            logits = model(input_ids=inputs, **kw).logits
        total += torch.nn.functional.cross_entropy(logits.reshape(-1, vocab_size), targets,
                                                   ignore_index=-100, reduction="sum").item()
        count += len(trained)
    return total / count


def check_packed_loss(chat_tool, work, small):
    chat, pc = os.path.join(work, "chat.jsonl"), os.path.join(work, "pc.jsonl")
    base = [f"root={chat}", f"val_files={pc}", f"tokenizer={small}", "seq_len=512"]
    _, _, _, rows = tool(chat_tool, os.path.join(work, "out"), *base)
    rc, err, _, packs = tool(chat_tool, os.path.join(work, "out"), *base, "pack=true")
    if rc != 0 or not rows:
        fail(f"packed loss: exit {rc}: {err[-300:]}")
        return
    vocab_size = json.load(open(os.path.join(work, "out", "spec.json")))["vocab"]
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128,
                                      attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).double().eval()
    rows = [s for s in rows if s["split"] == "train"]
    packs = [s for s in packs if s["split"] == "train"]
    unpacked = loss(model, rows, vocab_size, None)
    packed = loss(model, packs, vocab_size, True)
    naive = loss(model, packs, vocab_size, False)  # one causal sequence a row: attends across
    diff = abs(packed - unpacked) / unpacked
    print(f"loss: unpacked {unpacked:.12f} ({len(rows)} rows), packed {packed:.12f} "
          f"({len(packs)} rows), relative difference {diff:.2e}; without the mask {naive:.12f}")
    if len(packs) >= len(rows):
        fail(f"{len(rows)} conversations packed into {len(packs)} rows: nothing to compare")
    if diff > 1e-5:
        fail(f"the packed rows' loss {packed} differs from the unpacked rows' {unpacked}")
    if abs(naive - unpacked) / unpacked < 1e-6:
        fail("the packed rows' loss without the block mask equals it too: the check is blind")


def train(trainer, config, run, *extra):
    r = subprocess.run([trainer, "--config", config, "--run-dir", run, *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"trainer {' '.join(extra)}: exit {r.returncode}: {r.stderr[-1500:]}")
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [x["loss"] for x in map(json.loads, f) if x["split"] == "train"]


def check_resume(trainer, work, small):
    for pack in ("false", "true"):
        config = os.path.join(work, f"chat-{pack}.yaml")
        with open(config, "w") as f:
            f.write(f"""seed: 3
device: cpu
model: {{name: llama, n_layer: 2, n_head: 2, n_kv_head: 1, n_embd: 32, intermediate_size: 64,
        block_size: 96, vocab_size: 0}}
data: {{name: chat, root: "{work}/chat.jsonl", val_files: "{work}/pc.jsonl",
       tokenizer: "{small}", seq_len: 96, pack: {pack}, batch_size: 4, workers: 2}}
optim: {{name: adamw, lr: 0.003}}
train: {{max_steps: 10}}
run: {{log_every: 1, checkpoint_every: 1, progress: never}}
""")
        try:
            whole = train(trainer, config, os.path.join(work, f"a-{pack}"))
            b = os.path.join(work, f"b-{pack}")
            train(trainer, config, b, "--set", "train.stop_at_step=4")
            resumed = train(trainer, config, b, "--resume", "auto")
        except RuntimeError as e:
            fail(str(e))
            continue
        if len(whole) != 10 or resumed != whole:
            fail(f"pack {pack}: the resumed run's losses {resumed} differ from {whole}")
        else:
            print(f"pack {pack}: 10 steps, resumed after step 4 equal bit for bit "
                  f"(loss {whole[0]:.4f} -> {whole[-1]:.4f})")


def main():
    chat_tool, trainer = sys.argv[1], sys.argv[2]
    rng = random.Random(20251206)
    records = {"chat": [conversation(rng) for _ in range(200)],
               "pc": [prompt_completion(rng) for _ in range(60)]}
    with tempfile.TemporaryDirectory() as work:
        for name, recs in records.items():
            write_jsonl(os.path.join(work, name + ".jsonl"), recs)
        vocab = {v: qj.write(v, os.path.join(work, "vocab-" + v)) for v in ("llama3", "qwen3")}
        small, _, _ = small_tokenizer(work, records["chat"] + records["pc"])
        check_templates(chat_tool, work, vocab, records)
        check_tool_calls(chat_tool, work, vocab, sys.modules[__name__])
        check_forced(chat_tool, work, vocab, records)
        check_other_template(chat_tool, work, vocab, records)
        check_bad_input(chat_tool, work, small)
        check_samples(chat_tool, work, vocab)
        check_packed_loss(chat_tool, work, small)
        check_resume(trainer, work, small)
    if failures:
        sys.exit(f"{len(failures)} failures; the first: {failures[0]}")
    print("chat data: all checks pass")


if __name__ == "__main__":
    main()
