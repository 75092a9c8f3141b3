#!/usr/bin/env python3
"""The date a run on the Llama 3.2 chat template renders (CTest Chat.RunDateResolvedOnce).

  chat_date_check.py TRAINER

The template dates its system header today (transformers' strftime_now). A training run resolves
the date once and keeps it:
- recorded as data.chat_date in the run's config.yaml: today's, as transformers'
  apply_chat_template renders it without date_string;
- a resume renders the recorded date: with config.yaml's made 01 Jan 2020 (a run started that
  day), the resumed steps equal, bit for bit, a resume given data.chat_date: 01 Jan 2020, and
  differ from steps on today's date; the resumed run's config.yaml keeps 01 Jan 2020;
- generate --chat on the run renders it: ids as apply_chat_template(date_string="01 Jan 2020");
- two ranks whose clocks give different dates (TZ 25 hours apart) train on rank 0's date: losses
  equal, bit for bit, those of two ranks both in rank 0's zone.
Data: chat_check.py's 200 conversations and 60 prompt/completion records; a small byte-level BPE
with Llama 3's special tokens that `tokenizers` trains here. Exits 77 (skipped) when
transformers, tokenizers or quicktok is not installed.
"""
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile

import chat_check as c  # exits 77 without transformers, tokenizers or quicktok
from chat_check import (Tokenizer, as_messages, decoders, fail, failures, folder, hf_tokenizer,
                        models, pre_tokenizers, render, template_file, train, trainers)


def llama32_folder(work, records):
    """A small byte-level BPE with Llama 3's special tokens, under the Llama 3.2 template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"]
    texts = [m["content"] for r in records for m in as_messages(r)[0]]
    texts.append("Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2020 system user")
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = os.path.join(work, "l32.json")
    tok.save(path)
    config = template_file("llama3.2-instruct")
    return folder(work, "l32", path, config), path, config


def recorded_date(run):
    with open(os.path.join(run, "config.yaml")) as f:
        m = re.search(r"^\s+chat_date: *(.*)$", f.read(), re.M)
    return m.group(1).strip().strip("'\"") if m else None


def check_run_date(trainer, work, records):
    d, vocab_json, template = llama32_folder(work, records["chat"])
    t = hf_tokenizer(vocab_json, template)
    hi = [{"role": "user", "content": "hi"}]
    # transformers' render without date_string: strftime_now, today's date.
    today = re.search(r"Today Date: ([^\n]*)", render(t, hi)).group(1)
    config = os.path.join(work, "l32.yaml")
    with open(config, "w") as f:
        f.write(f"""seed: 5
device: cpu
model: {{name: llama, n_layer: 1, n_head: 2, n_kv_head: 1, n_embd: 32, intermediate_size: 64,
        block_size: 128, vocab_size: 0}}
data: {{name: chat, root: "{work}/chat.jsonl", val_files: "{work}/pc.jsonl",
       tokenizer: "{d}", seq_len: 128, batch_size: 4, workers: 0}}
optim: {{name: adamw, lr: 0.003}}
train: {{max_steps: 6}}
run: {{log_every: 1, checkpoint_every: 1, progress: never}}
""")
    old = "01 Jan 2020"
    try:
        a = os.path.join(work, "date-a")
        train(trainer, config, a, "--set", "train.stop_at_step=3")
        first = recorded_date(a)
        if first != today:
            fail(f"a Llama 3.2 run records data.chat_date {first!r} in config.yaml, expected "
                 f"today's {today!r} (transformers' render)")
        # As if the run had started on 01 Jan 2020: its resume renders that date.
        with open(os.path.join(a, "config.yaml")) as f:
            text = re.sub(r"^(\s+chat_date:).*$", rf"\1 {old}", f.read(), flags=re.M)
        with open(os.path.join(a, "config.yaml"), "w") as f:
            f.write(text)
        resumed = train(trainer, config, a, "--resume", "auto")
        b = os.path.join(work, "date-b")
        train(trainer, config, b, "--set", f"data.chat_date={today}", "--set",
              "train.stop_at_step=3")
        given = train(trainer, config, b, "--resume", "auto", "--set", f"data.chat_date={old}")
        c = os.path.join(work, "date-c")
        todays = train(trainer, config, c, "--set", f"data.chat_date={today}")
    except RuntimeError as e:
        fail(str(e))
        return
    if recorded_date(a) != old:
        fail(f"the resumed run's config.yaml records {recorded_date(a)!r}, not {old!r}")
    if len(resumed) != 6 or resumed != given:
        fail(f"the resume of a run recorded on {old}: losses {resumed}, a resume given "
             f"data.chat_date {old}: {given}")
    elif resumed[3:] == todays[3:]:
        fail(f"the resumed steps' losses equal those on today's date: the check is blind")
    else:
        print(f"Llama 3.2 run: data.chat_date {today} recorded; resumed with {old} recorded, "
              f"losses equal a resume given it, bit for bit")
    want = list(t.apply_chat_template(hi, add_generation_prompt=True, tokenize=True,
                                      date_string=old))
    r = subprocess.run([trainer, "generate", "--checkpoint", a, "--chat", "--prompt", "hi",
                        "--max-new-tokens", "1", "--log-level", "debug"],
                       capture_output=True, text=True, errors="replace")
    m = re.search(r"the prompt's \d+ token ids:((?: \d+)*)", r.stderr)
    ids = [int(x) for x in m.group(1).split()] if m else None
    if r.returncode != 0 or ids != want:
        fail(f"generate --chat on the run: exit {r.returncode}, ids {ids}, "
             f"apply_chat_template(date_string={old!r}) {want}; {r.stderr[-400:]}")


def two_ranks(trainer, config, run, zones):
    """Losses of a two-process run, rank r in time zone zones[r] (torchrun's variables)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, zone in enumerate(zones):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TZ=zone)
        procs.append(subprocess.Popen([trainer, "--config", config, "--run-dir", run], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))
    errs = [p.communicate(timeout=300)[1] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"two ranks in {zones}: exits {[p.returncode for p in procs]}: "
                           f"{errs[0][-800:]}")
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [x["loss"] for x in map(json.loads, f) if x["split"] == "train"]


def check_ranks_date(trainer, work):
    """Ranks on either side of midnight render rank 0's date."""
    config = os.path.join(work, "l32.yaml")
    east, west = "Pacific/Kiritimati", "Pacific/Pago_Pago"  # UTC+14, UTC-11: never one date
    try:
        mixed = two_ranks(trainer, config, os.path.join(work, "ranks-mixed"), (east, west))
        same = two_ranks(trainer, config, os.path.join(work, "ranks-same"), (east, east))
        apart = two_ranks(trainer, config, os.path.join(work, "ranks-west"), (west, west))
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        fail(str(e))
        return
    if mixed != same:
        fail(f"ranks in {east} and {west}: losses {mixed}, both in {east}: {same}")
    elif same == apart:
        fail("the runs in either time zone have equal losses: the check is blind")
    else:
        print(f"two ranks in time zones 25 h apart train on rank 0's date: losses equal both "
              f"ranks in its zone, bit for bit")


def main():
    trainer = sys.argv[1]
    rng = random.Random(20251206)
    records = {"chat": [c.conversation(rng) for _ in range(200)],
               "pc": [c.prompt_completion(rng) for _ in range(60)]}
    with tempfile.TemporaryDirectory() as work:
        for name, recs in records.items():
            c.write_jsonl(os.path.join(work, name + ".jsonl"), recs)
        check_run_date(trainer, work, records)
        check_ranks_date(trainer, work)
    if failures:
        sys.exit(f"{len(failures)} failures; the first: {failures[0]}")
    print("the chat date: all checks pass")


if __name__ == "__main__":
    main()
