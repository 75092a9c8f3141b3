#!/usr/bin/env python3
"""Preference pairs (data.name: preference) in Parquet, Arrow and JSON array files train as the
same records in JSONL (CTest Preference.ParquetAndJsonArraysTrainAsJsonl).

  preference_files_check.py TRAINER

The records: 96 pairs in TRL's standard form (text; the prompt left out in some, so that it is
the implicit prompt, and null in their Parquet rows) and 96 in its conversational form (lists of
{role, content} messages). `datasets` writes each set as the Hugging Face Hub lays a data set out
(Dataset.to_parquet of three shards, data/train-0000N-of-00003.parquet, and
data/validation-00000-of-00001.parquet), as Dataset.save_to_disk does (two Arrow stream
shards), and as one Parquet file of all of them; json.dump writes them as pretty-printed JSON
arrays (indent 2, as LLaMA-Factory's and Alpaca's .json files are). Each trains 20 DPO steps of a
tiny random Llama with LoRA (the llama3-instruct template of tests/data/chat_templates/ and a
byte-level BPE that `tokenizers` trains here) and must give the train and validation losses of
the JSONL files bit for bit: with data.val_files, and with data.val_fraction (row N of a Parquet
file and element N of an array draw their split as line N + 1 of a JSONL file).

Bad input, each exit 2 with one line on stderr: a column of another type (chosen as integers:
the file, row 0 and the column), a row whose message has no content (a null: the file, the row and
the column's message), a file without the chosen column, a JSON array without a comma between two
elements (FILE:LINE:COLUMN), a bad element of an array (its first line).
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
# The tokenizer and the writers of every layout are the chat data's check's (it exits 77 without
# datasets, pyarrow or tokenizers).
from chat_parquet_check import layouts as chat_layouts  # noqa: E402
from chat_parquet_check import tokenizer_folder, write_jsonl  # noqa: E402

import datasets  # noqa: E402

WORDS = ("apple bread cloud dance eagle flame grape honey island jelly kite lemon mango night "
         "ocean piano").split()
STEPS, PAIRS = 20, 4
failures = []


def records(count, seed, conversational):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        a, b, c, d, e = rng.sample(WORDS, 5)
        question = " ".join(["Say", a, b] + [e] * (i % 3))
        good, bad = f"{a} {b} {c}", f"{b} {d}"
        if conversational:
            system = [{"role": "system", "content": e}] if i % 4 == 0 else []
            out.append({"prompt": system + [{"role": "user", "content": question}],
                        "chosen": [{"role": "assistant", "content": good}],
                        "rejected": [{"role": "assistant", "content": bad}]})
        elif i % 3 == 1:  # the implicit prompt (not in the first: from_list takes its keys)
            out.append({"chosen": f"{question} Answer: {good}",
                        "rejected": f"{question} Answer: {bad}"})
        else:
            out.append({"prompt": f"{question} Answer:", "chosen": " " + good,
                        "rejected": " " + bad})
    return out


def layouts(work, name, train, val):
    """The records as JSONL, JSON arrays and as datasets writes them (chat_parquet_check's
    layouts but a DatasetDict's); each layout's settings."""
    return {k: v for k, v in chat_layouts(work, name, train, val).items()
            if k != "DatasetDict save_to_disk"}


def config(work, name, tok, data):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        json.dump({
            "seed": 3, "device": "cpu",
            "model": {"name": "llama", "n_layer": 2, "n_head": 2, "n_kv_head": 1, "n_embd": 32,
                      "intermediate_size": 64, "block_size": 64, "vocab_size": 0,
                      "lora": {"rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}},
            "data": {"name": "preference", "tokenizer": tok, "max_length": 64,
                     "batch_size": PAIRS, "workers": 0, **data},
            "train": {"objective": "dpo", "max_steps": STEPS},
            "optim": {"name": "adamw", "lr": 0.01},
            "run": {"log_every": 1, "eval_every": 10, "progress": "never", "threads": 1},
        }, f)
    return path


def train(trainer, cfg, run):
    """(train losses, val losses) of a run, or None after recording the failure."""
    r = subprocess.run([trainer, "--config", cfg, "--run-dir", run, "--log-level", "warn"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"{cfg}: exit {r.returncode}: {r.stderr[-1500:]}")
        return None
    with open(os.path.join(run, "metrics.jsonl")) as f:
        rows = [json.loads(x) for x in f]
    return ([x["loss"] for x in rows if x["split"] == "train"],
            [x["loss"] for x in rows if x["split"] == "val"])


def check_equal(trainer, work, tok, name, settings):
    """Each layout trains as the JSONL files of the same split rule."""
    got = {}
    for layout, data in settings.items():
        run = os.path.join(work, "runs", f"{name}-{layout}".replace(" ", "_").replace(",", ""))
        got[layout] = train(trainer, config(work, os.path.basename(run), tok, data), run)
    for layout, result in got.items():
        ref = "jsonl, val_fraction" if "val_fraction" in layout else "jsonl"
        want = got[ref]
        if want is None or result is None:
            continue
        if len(want[0]) != STEPS or len(want[1]) < 2:
            failures.append(f"{name} {ref}: {len(want[0])} train losses, val {want[1]}")
        elif result != want:
            failures.append(f"{name} {layout}: losses {result} differ from {ref}'s {want}")
        elif layout != ref:
            print(f"{name}: {layout} trains as {ref}: {STEPS} losses equal "
                  f"({want[0][0]:.5f} -> {want[0][-1]:.5f}, val {want[1][-1]:.5f})")


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


def check_bad_input(trainer, work, tok, val):
    bad = os.path.join(work, "bad")
    os.makedirs(bad)
    rows = records(6, 9, conversational=True)
    typed = os.path.join(bad, "typed.parquet")
    datasets.Dataset.from_list([{**r, "chosen": i} for i, r in enumerate(rows)]).to_parquet(typed)
    expect_refusal(trainer, work, tok, "a column of another type",
                   {"files": typed, "val_files": val}, typed, "row 0", '"chosen"', "int64")
    hole = os.path.join(bad, "hole.parquet")
    holed = [dict(r) for r in rows]
    holed[4] = {**holed[4], "chosen": [{"role": "assistant", "content": None}]}
    datasets.Dataset.from_list(holed).to_parquet(hole)
    expect_refusal(trainer, work, tok, "a message without content",
                   {"files": hole, "val_files": val}, hole + ": row 4", "chosen[0]")
    missing = os.path.join(bad, "missing.parquet")
    datasets.Dataset.from_list([{"prompt": r["prompt"], "rejected": r["rejected"]}
                                for r in rows]).to_parquet(missing)
    expect_refusal(trainer, work, tok, "a column missing", {"files": missing, "val_files": val},
                   missing, '"chosen"')
    text = json.dumps(rows[:3], indent=2).splitlines()
    starts = [i + 1 for i, line in enumerate(text) if line == "  {"]
    no_comma = os.path.join(bad, "no_comma.json")
    with open(no_comma, "w") as f:  # the comma after the first element taken out
        end = starts[1] - 2  # the line of the first element's closing "},"
        f.write("\n".join(text[:end] + [text[end].rstrip(",")] + text[end + 1:]) + "\n")
    expect_refusal(trainer, work, tok, "a JSON array without a comma",
                   {"files": no_comma, "val_files": val},
                   f"{no_comma}:{starts[1]}:3: expected ',' or ']' after the element that starts "
                   f"on line {starts[0]}")
    element = os.path.join(bad, "element.json")
    with open(element, "w", encoding="utf-8") as f:
        json.dump(rows[:2] + [{"prompt": rows[2]["prompt"], "rejected": rows[2]["rejected"]}], f,
                  indent=2)
    expect_refusal(trainer, work, tok, "an element without chosen",
                   {"files": element, "val_files": val}, f"{element}:{starts[2]}:", '"chosen"')


def main():
    trainer = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as work:
        tok = tokenizer_folder(work)
        for name, conversational in (("standard", False), ("conversational", True)):
            rows = records(96, 1 if conversational else 2, conversational)
            check_equal(trainer, work, tok, name, layouts(work, name, rows[:80], rows[80:]))
        check_bad_input(trainer, work, tok, os.path.join(work, "conversational", "val.jsonl"))
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
