#!/usr/bin/env python3
"""LoRA learns a chat task, answered through `trainer generate --chat` (CTest
Lora.LearnsAChatTask).

  lora_chat_learns.py TRAINER [--pretrain-steps N] [--steps N] [--keep DIR]

The task, made here: the user gives three distinct words of a 32-word vocabulary, numbered, one
a line ("1 apple\n2 river\n3 stone"); the assistant replies with them in reverse order, each with
its number ("3 stone\n2 river\n1 apple"). 100 word triples are held out (none of their word sets,
in any order, is in the training data); conversations of the others, in the Llama 3 Instruct
template (tests/data/chat_templates/llama3-instruct.json), are the training data (data.name:
chat).

The base: a tiny random LlamaForCausalLM that transformers builds here (2 layers, width 64, tied
embeddings), saved by save_pretrained with a byte-level BPE tokenizer `tokenizers` trains on the
words (each word one token) and the template in its tokenizer_config.json. LoRA alone does not
learn the task on the random base (its frozen random embeddings give attention nothing to find a
word by: rank 32, 1000 steps, the loss stays at 1.7, above guessing among the 32 words), so the
base is first pretrained briefly by a full fine-tune of the trainer on another task, the words repeated
in their order (copy), and exported (`export --format hf`). Then LoRA (rank 32, alpha 64, on
every projection, the base frozen) learns the reversal, and 50 of the held-out prompts go through
`trainer generate --chat --temperature 0`: at least 95% of the replies must be exactly the
reversed lines (the reply ends at <|eot_id|>, which is not printed).

Prints each stage's wall time and steps, and the accuracy (docs/benchmarks.md, "LoRA learns a
chat task"). --keep DIR keeps the folders and the runs there.
Exits 77 (skipped) when transformers or tokenizers is not installed.
"""
import argparse
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from run_check import one_intra_op_thread

one_intra_op_thread()  # before torch is imported
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

WORDS = ["apple", "bread", "cloud", "dance", "eagle", "flame", "grape", "honey", "island",
         "jelly", "kite", "lemon", "mango", "night", "ocean", "piano", "queen", "river", "stone",
         "tiger", "umbrella", "violin", "water", "yellow", "zebra", "amber", "breeze", "candle",
         "desert", "ember", "forest", "glacier"]
HELD_OUT = 100
ASKED = 50  # of the held-out triples, those answered through generate (a process each)
TRAIN = 4000
PRETRAIN_STEPS = 400
STEPS = 300
ACCURACY = 0.95
THREADS = 1  # intra-op threads: on 2 busy cores, 2 threads are several times slower than 1
EMBED_STD = 0.15  # tied: the logits' scale is the embeddings' (the final norm is frozen)
TEMPLATE = os.path.join(HERE, "data", "chat_templates", "llama3-instruct.json")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
COPY, REVERSE = [0, 1, 2], [2, 1, 0]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def split_triples():
    """(training triples, held-out triples): no held-out word set appears in training at all."""
    rng = random.Random(7)
    sets = list(itertools.combinations(WORDS, 3))
    rng.shuffle(sets)
    held = [list(s) for s in sets[:HELD_OUT]]
    for h in held:
        rng.shuffle(h)
    train = [list(p) for s in sets[HELD_OUT:] for p in itertools.permutations(s)]
    rng.shuffle(train)
    return train[:TRAIN], held


def numbered(words, order):
    """The words of `order` (indices into `words`), each a line after its number in `words`."""
    return "\n".join(f"{i + 1} {words[i]}" for i in order)


def conversation(words, order):
    return {"messages": [{"role": "user", "content": numbered(words, range(len(words)))},
                         {"role": "assistant", "content": numbered(words, order)}]}


def save_base(folder):
    """The tokenizer (each word one token), the template and a random tied Llama in `folder`."""
    os.makedirs(folder, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = ([" " + w for w in WORDS] + ["user", "assistant"]) * 4
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=1000, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    for w in WORDS:
        if len(tok.encode(" " + w).ids) != 1:
            sys.exit(f"the tokenizer splits {' ' + w!r}: {tok.encode(' ' + w).tokens}")
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(TEMPLATE, encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({**config, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    vocab = tok.get_vocab_size()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, bos_token_id=tok.token_to_id("<|begin_of_text|>"),
        eos_token_id=tok.token_to_id("<|end_of_text|>")))
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, EMBED_STD)
    model.save_pretrained(folder, safe_serialization=True)
    return vocab


def write_config(work, name, base, steps, lr, data, lora=None):
    model = {"pretrained": base}
    if lora:
        model["lora"] = {"rank": lora, "alpha": 2 * lora, "targets": TARGETS}
    config = {
        "seed": 0,
        "model": model,
        "data": {"name": "chat", "root": data, "val_files": os.path.join(work, "val.jsonl"),
                 "batch_size": 32, "workers": 0},
        "optim": {"name": "adamw", "lr": lr, "weight_decay": 0.0},
        "sched": {"name": "cosine", "warmup_steps": 20},
        "train": {"max_steps": steps, "clip_grad_norm": 1.0, "eval_at_end": False},
        "run": {"log_every": 50, "eval_every": 10 * steps, "checkpoint_every": steps,
                "progress": "never", "tensorboard": False, "threads": THREADS},
    }
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        json.dump(config, f)  # JSON is YAML
    return path


def write_jsonl(path, conversations):
    with open(path, "w") as f:
        for c in conversations:
            f.write(json.dumps(c) + "\n")


def run(args, what):
    start = time.monotonic()
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{what}: exit {r.returncode}: {r.stderr[-3000:]}")
    return time.monotonic() - start


def train(trainer, config, run_dir, steps, what):
    """Trains; returns the wall time."""
    shutil.rmtree(run_dir, ignore_errors=True)
    took = run([trainer, "--config", config, "--run-dir", run_dir], what)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        losses = [(x["step"], x["loss"]) for x in map(json.loads, f) if x["split"] == "train"]
    print(f"{what}: {steps} steps of 32 conversations in {took:.1f} s wall; loss "
          f"{losses[0][1]:.3f} at step {losses[0][0]} -> {losses[-1][1]:.4f} at step "
          f"{losses[-1][0]}", flush=True)
    return took


def answer(trainer, run_dir, words):
    r = subprocess.run([trainer, "generate", "--checkpoint", run_dir, "--chat", "--prompt",
                        numbered(words, COPY), "--temperature", "0", "--max-new-tokens", "12"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"generate --chat: exit {r.returncode}: {r.stderr[-1500:]}")
    return r.stdout


def evaluate(trainer, run_dir, held):
    start = time.monotonic()
    right, wrong = 0, []
    with ThreadPoolExecutor(max_workers=2) as pool:  # a process each, two at a time
        replies = list(pool.map(lambda words: answer(trainer, run_dir, words), held))
    for words, got in zip(held, replies):
        if got == numbered(words, REVERSE) + "\n":
            right += 1
        else:
            wrong.append(f"{words} -> {got!r}")
    print(f"generate --chat: {right}/{len(held)} held-out prompts answered exactly "
          f"({right / len(held):.0%}) in {time.monotonic() - start:.1f} s")
    for w in wrong[:10]:
        print("  wrong:", w)
    return right / len(held)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trainer")
    parser.add_argument("--pretrain-steps", type=int, default=PRETRAIN_STEPS)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--keep", help="keep the folders and the runs in this folder")
    args = parser.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="lora_chat_")
    os.makedirs(work, exist_ok=True)
    try:
        triples, held = split_triples()
        copy, reverse = os.path.join(work, "copy.jsonl"), os.path.join(work, "reverse.jsonl")
        write_jsonl(copy, [conversation(t, COPY) for t in triples])
        write_jsonl(reverse, [conversation(t, REVERSE) for t in triples])
        write_jsonl(os.path.join(work, "val.jsonl"), [conversation(t, REVERSE) for t in held[:8]])
        random_base, base = os.path.join(work, "random"), os.path.join(work, "base")
        vocab = save_base(random_base)
        print(f"{len(triples)} training conversations, {len(held)} held out; vocabulary {vocab}")
        config = write_config(work, "pretrain", random_base, args.pretrain_steps, 3e-3, copy)
        pretrain = train(args.trainer, config, os.path.join(work, "pretrain"),
                         args.pretrain_steps, "pretraining (full fine-tune, copy)")
        shutil.rmtree(base, ignore_errors=True)
        export = run([args.trainer, "export", "--checkpoint", os.path.join(work, "pretrain"),
                      "--format", "hf", "--out", base], "export --format hf")
        config = write_config(work, "lora", base, args.steps, 5e-3, reverse, lora=32)
        lora = train(args.trainer, config, os.path.join(work, "lora"), args.steps,
                     "LoRA (rank 32, reverse)")
        print(f"training in all: {pretrain + export + lora:.1f} s wall (pretraining "
              f"{pretrain:.1f} s, export {export:.1f} s, LoRA {lora:.1f} s)")
        accuracy = evaluate(args.trainer, os.path.join(work, "lora"), held[:ASKED])
        if accuracy < ACCURACY:
            sys.exit(f"accuracy {accuracy:.2%} below {ACCURACY:.0%}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
