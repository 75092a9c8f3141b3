#!/usr/bin/env python3
"""Chat records in Parquet and Arrow files train as the same records in JSONL (CTest
Chat.ParquetTrainsAsJsonl).

  chat_parquet_check.py TRAINER

The records: 240 conversations in OpenAI's `messages` form (system prompts in some, one to three
rounds), the same in ShareGPT's form, 240 Alpaca records (`instruction`, `input` empty in some,
`output`, `system` and `history` in some: datasets writes nulls where a record lacks them) and
120 OpenAI tool-call conversations (`tool_calls` with arguments, `tool` messages, `tools`; some
without: nulls again) in the Qwen 2.5 template. `datasets` writes them as
the Hugging Face Hub lays a data set out (Dataset.to_parquet of three shards,
data/train-0000N-of-00003.parquet, and data/validation-00000-of-00001.parquet), as
Dataset.save_to_disk does (two shards, data-0000N-of-00002.arrow with state.json), as a
DatasetDict's save_to_disk (dataset_dict.json, train/ and test/), and as one Parquet file of a
JSONL file's records, and as pretty-printed JSON arrays (json.dump with indent 4, as Alpaca's
alpaca_data.json). Each trains 20 steps of a tiny random Llama (the llama3-instruct template of
tests/data/chat_templates/ with a byte-level BPE `tokenizers` trains here) and must give the
train and validation losses of the same records in JSONL, bit for bit: with data.val_files (a
glob), with data.val_fraction (row N of a Parquet file and element N of a JSON array draw their split as line N + 1 of a JSONL file), packed, Alpaca rows (format auto and alpaca), ShareGPT rows and tool calls. A Parquet run stopped at step 8 and
resumed gives the whole run's losses.

Bad input, each exit 2 with one line on stderr naming the file (and the row and column where
they apply): a truncated Parquet file, a text file named .parquet, a Feather (Arrow IPC file)
named .arrow, a column of another type (Alpaca's output as integers), a column missing (format
alpaca without output), a row whose message lacks its content.
Exits 77 (skipped) when datasets, pyarrow or tokenizers is not installed.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread, report

one_intra_op_thread()
try:
    import datasets
    import pyarrow as pa
    import pyarrow.feather as feather
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "data", "chat_templates", "llama3-instruct.json")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
WORDS = ("apple bread cloud dance eagle flame grape honey island jelly kite lemon mango night "
         "ocean piano queen river stone tiger violin water zebra amber breeze candle").split()
STEPS = 20
failures = []


def text(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9)))


def conversation(rng):
    msgs = [{"role": "system", "content": text(rng)}] if rng.random() < 0.3 else []
    for _ in range(rng.randint(1, 3)):
        msgs += [{"role": "user", "content": text(rng)},
                 {"role": "assistant", "content": text(rng)}]
    return {"messages": msgs}


def alpaca(rng, first):
    r = {"instruction": text(rng), "input": text(rng) if rng.random() < 0.5 else "",
         "output": text(rng)}
    if first or rng.random() < 0.3:
        r["system"] = text(rng)
    if first or rng.random() < 0.3:
        r["history"] = [[text(rng), text(rng)] for _ in range(rng.randint(1, 2))]
    return r


def tool_conversation(rng):
    """OpenAI tool calls: an assistant message's tool_calls, tool messages, the record's tools."""
    call = {"type": "function", "function": {"name": "weather", "arguments": {
        "city": rng.choice(WORDS), "days": rng.randint(1, 5)}}}
    msgs = [{"role": "user", "content": text(rng)},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": text(rng)},
            {"role": "assistant", "content": text(rng)}]
    if rng.random() < 0.5:
        msgs = msgs[:1] + [{"role": "assistant", "content": text(rng)}]
    return {"messages": msgs, "tools": [WEATHER]}


WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}


def tokenizer_folder(work, name="tok", template=TEMPLATE, specials=SPECIALS):
    """A byte-level BPE trained on the words and the template's text, and the template."""
    d = os.path.join(work, name)
    os.makedirs(d)
    with open(template, encoding="utf-8") as f:
        config = json.load(f)
    texts = [config["chat_template"], json.dumps(WEATHER)] * 4
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(([" " + w for w in WORDS] + WORDS) * 4 + texts,
                            trainers.BpeTrainer(vocab_size=1000, special_tokens=specials,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({**config, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    return d


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def layouts(work, name, train, val):
    """The records as JSONL and as datasets writes them; the data settings of each layout."""
    d = os.path.join(work, name)
    os.makedirs(os.path.join(d, "hub", "data"))
    write_jsonl(os.path.join(d, "train.jsonl"), train)
    write_jsonl(os.path.join(d, "val.jsonl"), val)
    write_jsonl(os.path.join(d, "all.jsonl"), train + val)
    for file, records in (("train.json", train), ("val.json", val), ("all.json", train + val)):
        with open(os.path.join(d, file), "w") as f:  # a pretty-printed array, as alpaca_data.json
            json.dump(records, f, indent=4)
    ds, vs = datasets.Dataset.from_list(train), datasets.Dataset.from_list(val)
    for i in range(3):
        ds.shard(3, i, contiguous=True).to_parquet(
            os.path.join(d, "hub", "data", f"train-{i:05d}-of-00003.parquet"))
    vs.to_parquet(os.path.join(d, "hub", "data", "validation-00000-of-00001.parquet"))
    ds.save_to_disk(os.path.join(d, "disk"), num_shards=2)
    vs.save_to_disk(os.path.join(d, "disk_val"))
    datasets.DatasetDict({"train": ds, "test": vs}).save_to_disk(os.path.join(d, "dict"))
    datasets.Dataset.from_list(train + val).to_parquet(os.path.join(d, "all.parquet"))
    return {
        "jsonl": {"root": f"{d}/train.jsonl", "val_files": f"{d}/val.jsonl"},
        "hub parquet shards": {"root": f"{d}/hub", "val_files": "data/validation-*.parquet"},
        "save_to_disk": {"root": f"{d}/disk", "val_files": f"{d}/disk_val/data-*.arrow"},
        "DatasetDict save_to_disk": {"root": f"{d}/dict", "val_files": "test/data-*.arrow"},
        "jsonl, val_fraction": {"files": f"{d}/all.jsonl", "val_fraction": 0.2},
        "parquet, val_fraction": {"files": f"{d}/all.parquet", "val_fraction": 0.2},
        "json arrays": {"files": f"{d}/train.json", "val_files": f"{d}/val.json"},
        "json array, val_fraction": {"files": f"{d}/all.json", "val_fraction": 0.2},
    }


def config(work, name, tok, data, steps=STEPS):
    path = os.path.join(work, name + ".yaml")
    data = {"seq_len": 160, **data}
    with open(path, "w") as f:
        json.dump({
            "seed": 5, "device": "cpu",
            "model": {"name": "llama", "n_layer": 2, "n_head": 2, "n_kv_head": 1, "n_embd": 32,
                      "intermediate_size": 64, "block_size": data["seq_len"], "vocab_size": 0},
            "data": {"name": "chat", "tokenizer": tok, "batch_size": 8,
                     "workers": 0, **data},
            "optim": {"name": "adamw", "lr": 0.003},
            "train": {"max_steps": steps},
            "run": {"log_every": 1, "eval_every": 10, "checkpoint_every": 4, "progress": "never",
                    "threads": 1},
        }, f)
    return path


def train(trainer, cfg, run, *extra):
    """(train losses, val losses) of a run, or None after recording the failure."""
    r = subprocess.run([trainer, "--config", cfg, "--run-dir", run, "--log-level", "warn", *extra],
                       capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{cfg} {' '.join(extra)}: exit {r.returncode}: {r.stderr[-1500:]}")
        return None
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [json.loads(x) for x in f]
    return ([x["loss"] for x in rows if x["split"] == "train"],
            [x["loss"] for x in rows if x["split"] == "val"])


def check_equal(trainer, work, tok, name, settings, reference, extra=None):
    """Every layout of `settings` trains as the `reference` one."""
    got = {}
    for layout, data in settings.items():
        run = os.path.join(work, "runs", f"{name}-{layout}".replace(" ", "_").replace(",", ""))
        got[layout] = train(trainer, config(work, os.path.basename(run), tok,
                                            {**data, **(extra or {})}), run)
    for ref, layouts_ in reference.items():
        want = got[ref]
        for layout in layouts_:
            if want is None or got[layout] is None:
                continue
            if len(want[0]) != STEPS or not want[1]:
                failures.append(f"{name} {ref}: {len(want[0])} train losses, {want[1]} val")
            elif got[layout] != want:
                failures.append(f"{name} {layout}: losses {got[layout]} differ from {ref}'s {want}")
            else:
                print(f"{name}: {layout} trains as {ref}: {STEPS} losses equal "
                      f"({want[0][0]:.4f} -> {want[0][-1]:.4f}, val {want[1][-1]:.4f})")


def check_resume(trainer, work, tok, data):
    whole = train(trainer, config(work, "resume", tok, data), os.path.join(work, "whole"))
    run = os.path.join(work, "resumed")
    cfg = config(work, "resume", tok, data)
    if whole is None or train(trainer, cfg, run, "--set", "train.stop_at_step=8") is None:
        return
    resumed = train(trainer, cfg, run, "--resume", "auto")
    if resumed is not None and resumed[0] != whole[0]:
        failures.append(f"parquet resumed after step 8: {resumed[0]} differ from {whole[0]}")
    elif resumed is not None:
        print("parquet: resumed after step 8, the losses equal the whole run's")


def expect_refusal(trainer, work, tok, what, data, *needles):
    run = os.path.join(work, "runs", "bad")
    r = subprocess.run([trainer, "--config", config(work, "bad", tok, data), "--run-dir", run,
                        "--log-level", "warn"], capture_output=True, text=True)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    if r.returncode != 2 or len(lines) != 1 or not all(n in lines[0] for n in needles):
        failures.append(f"{what}: want exit 2 and one line naming {needles}; got exit "
                        f"{r.returncode}: {r.stderr[-800:]!r}")
    else:
        print(f"{what}: exit 2: {lines[0]}")


def check_bad_input(trainer, work, tok, chat):
    bad = os.path.join(work, "bad")
    os.makedirs(bad)
    good = os.path.join(chat, "all.parquet")
    val = {"val_files": os.path.join(chat, "val.jsonl")}
    cut = os.path.join(bad, "truncated.parquet")
    with open(good, "rb") as f, open(cut, "wb") as g:
        g.write(f.read()[: os.path.getsize(good) * 2 // 3])
    expect_refusal(trainer, work, tok, "a truncated Parquet file", {"files": cut, **val}, cut)
    text_file = os.path.join(bad, "records.parquet")
    with open(os.path.join(chat, "train.jsonl")) as f, open(text_file, "w") as g:
        g.write(f.read())
    expect_refusal(trainer, work, tok, "a JSONL file named .parquet", {"files": text_file, **val},
                   text_file, "not a Parquet file")
    fea = os.path.join(bad, "data-00000-of-00001.arrow")
    feather.write_feather(pa.Table.from_pylist([{"instruction": "a", "output": "b"}]), fea)
    expect_refusal(trainer, work, tok, "a Feather file named .arrow", {"root": bad, **val}, fea,
                   "Feather")
    os.remove(fea)
    rows = [{"instruction": text(random.Random(i)), "output": "x"} for i in range(6)]
    typed = os.path.join(bad, "typed.parquet")
    datasets.Dataset.from_list([{**r, "output": i} for i, r in enumerate(rows)]).to_parquet(typed)
    expect_refusal(trainer, work, tok, "a column of another type",
                   {"files": typed, "format": "alpaca", **val}, typed, "row 0", "output")
    missing = os.path.join(bad, "missing.parquet")
    datasets.Dataset.from_list([{"instruction": r["instruction"]} for r in rows]).to_parquet(missing)
    expect_refusal(trainer, work, tok, "a column missing",
                   {"files": missing, "format": "alpaca", **val}, missing, "row 0", "output")
    msgs = [{"messages": [{"role": "user", "content": "apple"},
                          {"role": "assistant", "content": None if i == 4 else "bread"}]}
            for i in range(6)]
    hole = os.path.join(bad, "hole.parquet")
    datasets.Dataset.from_list(msgs).to_parquet(hole)
    expect_refusal(trainer, work, tok, "a message without its content", {"files": hole, **val},
                   hole, "row 4", "content")


def main():
    trainer = sys.argv[1]
    rng = random.Random(52)
    chats = [conversation(rng) for _ in range(240)]
    alpacas = [alpaca(rng, i in (0, 200)) for i in range(240)]  # datasets: the first's keys
    with tempfile.TemporaryDirectory() as work:
        tok = tokenizer_folder(work)
        chat = layouts(work, "chat", chats[:200], chats[200:])
        al = layouts(work, "alpaca", alpacas[:200], alpacas[200:])
        same = {"jsonl": ["hub parquet shards", "save_to_disk", "DatasetDict save_to_disk",
                          "json arrays"],
                "jsonl, val_fraction": ["parquet, val_fraction", "json array, val_fraction"]}
        check_equal(trainer, work, tok, "messages", chat, same)
        check_equal(trainer, work, tok, "messages packed",
                    {k: chat[k] for k in ("jsonl", "hub parquet shards")},
                    {"jsonl": ["hub parquet shards"]}, {"pack": True})
        check_equal(trainer, work, tok, "alpaca",
                    {k: al[k] for k in ("jsonl", "hub parquet shards", "save_to_disk",
                                        "json arrays")},
                    {"jsonl": ["hub parquet shards", "save_to_disk", "json arrays"]})
        sharegpt = [{"conversations": [{"from": {"user": "human", "assistant": "gpt"}.get(
            m["role"], m["role"]), "value": m["content"]} for m in c["messages"]]}
            for c in chats]
        sg = layouts(work, "sharegpt", sharegpt[:200], sharegpt[200:])
        check_equal(trainer, work, tok, "sharegpt",
                    {k: sg[k] for k in ("jsonl", "hub parquet shards")},
                    {"jsonl": ["hub parquet shards"]})
        qwen = tokenizer_folder(work, "qwen", os.path.join(HERE, "data", "chat_templates",
                                                           "qwen2.5-instruct.json"),
                                ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tools = [tool_conversation(rng) for _ in range(120)]
        tl = layouts(work, "tools", tools[:100], tools[100:])
        check_equal(trainer, work, qwen, "tool calls (Qwen 2.5 template)",
                    {k: tl[k] for k in ("jsonl", "hub parquet shards")},
                    {"jsonl": ["hub parquet shards"]}, {"seq_len": 320})
        check_equal(trainer, work, tok, "alpaca format alpaca",
                    {k: al[k] for k in ("jsonl", "hub parquet shards")},
                    {"jsonl": ["hub parquet shards"]}, {"format": "alpaca"})
        check_resume(trainer, work, tok, chat["hub parquet shards"])
        check_bad_input(trainer, work, tok, os.path.join(work, "chat"))
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
