#!/usr/bin/env python3
"""LoRA DPO (train.objective: dpo, data.name: preference) against TRL 1.16's DPOTrainer with PEFT
(CTest Dpo.EqualsTrl).

  dpo_check.py TRAINER --tool PREFERENCE_TOOL [--keep DIR]

The base: a tiny random LlamaForCausalLM that transformers builds here, saved by save_pretrained
with a byte-level BPE tokenizer `tokenizers` trains on a few words (bos added by its
post-processor, as Llama 3's) and the Llama 3 Instruct template (tests/data/chat_templates); and
a tiny random Qwen3ForCausalLM with Qwen 3's template (no bos), for the conversational format with
the sigmoid loss and its tokens.
The data: 8 training pairs and 4 validation pairs of preference records, in TRL's standard format
with an implicit prompt (text; TRL's extract_prompt and add_eos apply) and in its conversational
format with an explicit prompt (messages; the chat template).

Tokens: each pair's two rows (token ids, and the completion labels rebuilt from the trainer's
next-token targets) equal those of DPOTrainer's dataset and collator, in both formats, at a
max_length that keeps the rows whole, one that cuts completions and one that drops pairs whose
prompt reaches it (tests/preference_tool.cpp dumps the trainer's).

For each format and for the sigmoid and ipo losses: the trainer's step-0 adapters (a one-step run
at learning rate 0, exported with `export --format peft`) are loaded into PEFT over the same base;
then 20 steps of the trainer (every pair in every batch, AdamW, clipping at 1.0, a constant rate)
and 20 of DPOTrainer over the same base, adapters and data give the same loss and the same
rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen,
logps/rejected, logits/chosen, logits/rejected, entropy and mean_token_accuracy at every step,
within 1e-5 relative. Near 0, relative to what the value is computed from: the rewards (0 at step
1, crossing 0 later) to beta times the summed log-probabilities they are differences of, the mean
logits (means of logits of either sign, crossing 0) to 1e-2.

Bad input, one line naming FILE:LINE and the fault and exit 2 each: a record without "chosen" or
"rejected", an empty completion (text, or messages without content), roles out of order (a user
message in a completion, the prompt repeated in the completions), conversations whose prompts
differ (no "prompt": trl.extract_prompt's common start would leave the user's turn in the
completions); preference pairs with train.objective supervised (naming the keys). Pairs whose
prompt reaches max_length: dropped as DPOTrainer drops them, each named in a warning, counted.

Exits 77 (skipped) when trl, peft, transformers or tokenizers is not installed.
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import torch
    from datasets import Dataset
    from peft import LoraConfig, PeftModel
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM,
                              PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM,
                              TrainerCallback)
    from trl import DPOConfig, DPOTrainer
    from trl.experimental.cpo import CPOConfig, CPOTrainer
    from window_runs import randomize
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

STEPS, PAIRS, RANK, ALPHA, LR, BETA = 20, 8, 8, 16, 2e-3, 0.1
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOL = 1e-5
LOGIT_FLOOR = 1e-2  # logits/*: means of logits of either sign (each ~0.1 in size) cross 0
METRICS = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
           "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected", "entropy",
           "mean_token_accuracy"]
SIMPO_METRICS = METRICS[:8] + ["nll_loss"]  # CPOTrainer's
TEMPLATES = {"llama": os.path.join(HERE, "data", "chat_templates", "llama3-instruct.json"),
             "qwen3": os.path.join(HERE, "data", "chat_templates", "qwen3.json")}
SPECIALS = {"llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                      "<|end_header_id|>", "<|eot_id|>"],
            "qwen3": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}
WORDS = ["apple", "bread", "cloud", "dance", "eagle", "flame", "grape", "honey", "island",
         "jelly", "kite", "lemon", "mango", "night", "ocean", "piano"]


def save_base(folder, family="llama"):
    """The tokenizer, the template and a random untied model in `folder`: Llama 3's (a bos token
    its post-processor adds) or Qwen 3's (no bos; per-head q/k norms, an explicit head width)."""
    os.makedirs(folder, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = ([" " + w for w in WORDS] + ["user", "assistant", "Answer:", "Say"]) * 4
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS[family],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    with open(TEMPLATES[family], encoding="utf-8") as f:
        config = json.load(f)
    eos = tok.token_to_id(config["eos_token"])
    torch.manual_seed(0)
    if family == "llama":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
            special_tokens=[("<|begin_of_text|>", bos)])
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=bos,
            eos_token_id=eos))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(
            vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
            max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1e6,
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos))
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({**config, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    randomize(model)
    model.save_pretrained(folder, safe_serialization=True)


def records(count, seed, conversational, longest=3):
    """`count` preference records: text with an implicit prompt, or messages with a prompt; the
    prompts of 1 to `longest` words after "Say", in turn."""
    import random
    rng = random.Random(seed)
    out = []
    for i in range(count):
        a, b, c, d, *more = rng.sample(WORDS, 6)
        question = " ".join(["Say", a, b] + more[:i % longest])
        good, bad = f" {a} {b} {c}", f" {b} {d}"
        if conversational:
            out.append({"prompt": [{"role": "user", "content": question}],
                        "chosen": [{"role": "assistant", "content": good.strip()}],
                        "rejected": [{"role": "assistant", "content": bad.strip()}]})
        else:
            out.append({"chosen": question + " Answer:" + good,
                        "rejected": question + " Answer:" + bad})
    return out


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def run(args, what, expect=0):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != expect:
        sys.exit(f"{what}: exit {r.returncode} (expected {expect}): {r.stderr[-3000:]}")
    return r


def trainer_config(work, name, base, train, val, loss_type, steps, lr):
    config = {
        "seed": 0,
        "model": {"name": "llama", "pretrained": base,
                  "lora": {"rank": RANK, "alpha": ALPHA, "dropout": 0.0, "targets": TARGETS}},
        "data": {"name": "preference", "files": train, "val_files": val, "max_length": 64,
                 "batch_size": PAIRS, "workers": 0},
        "train": {"objective": "dpo", "max_steps": steps, "clip_grad_norm": 1.0,
                  "eval_at_end": False},
        "dpo": {"loss_type": loss_type, "beta": BETA},
        "optim": {"name": "adamw", "lr": lr, "betas": [0.9, 0.999], "eps": 1e-8,
                  "weight_decay": 0.0},
        "sched": {"name": "constant"},
        "run": {"log_every": 1, "eval_every": 100 * STEPS, "checkpoint_every": 100 * STEPS,
                "progress": "never", "tensorboard": False, "threads": 1},
    }
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def trainer_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r.get("split") == "train"]


class Logged(TrainerCallback):
    """The train records (those with rewards/chosen) and the evaluation records a trainer logs."""

    def __init__(self):
        self.logs, self.eval_logs = [], []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "rewards/chosen" in logs:
            self.logs.append(dict(logs))
        elif logs and "eval_loss" in logs:
            self.eval_logs.append(dict(logs))


def recording_losses(trainer_class):
    """trainer_class recording each compute_loss's unrounded loss (Trainer logs it rounded to 4
    digits) in step_losses."""

    class Recording(trainer_class):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            self.step_losses.append((loss[0] if return_outputs else loss).item())
            return loss

    return Recording


def trl_train(trainer_class, config_class, base, adapters, train_rows, work, eval_rows=None,
              **config):
    """STEPS steps of TRL's trainer_class (DPOTrainer, CPOTrainer, ORPOTrainer) with PEFT from
    `adapters` over `base` (None: every weight of `base` trained), AdamW, clipping at 1.0, a
    constant rate, every pair in every batch; then evaluate() on `eval_rows` if given: (the
    steps' losses, their records, the evaluation's record or None). `config`: the trainer's own
    options (beta, loss_type, ...)."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(base)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token  # CPO and ORPO ask for one
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapters is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = PeftModel.from_pretrained(model, adapters, is_trainable=True)
    args = config_class(
        output_dir=os.path.join(work, "trl"), max_length=64, per_device_train_batch_size=PAIRS,
        gradient_accumulation_steps=1, learning_rate=LR, lr_scheduler_type="constant",
        warmup_steps=0, max_steps=STEPS, logging_steps=1, optim="adamw_torch", adam_beta1=0.9,
        adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0, report_to=[],
        use_cpu=True, seed=0, save_strategy="no", dataloader_num_workers=0,
        gradient_checkpointing=False, disable_tqdm=True, bf16=False, fp16=False,
        prediction_loss_only=True, **config)
    logged = Logged()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = recording_losses(trainer_class)(
            model=model, args=args, train_dataset=Dataset.from_list(train_rows),
            eval_dataset=None if eval_rows is None else Dataset.from_list(eval_rows),
            processing_class=tokenizer, callbacks=[logged])
    trainer.step_losses = []
    trainer.train()
    losses = trainer.step_losses[:]
    if eval_rows is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.evaluate()
    return losses, logged.logs, (logged.eval_logs[-1] if logged.eval_logs else None)


def trl_run(base, adapters, train_rows, loss_type, work):
    return trl_train(DPOTrainer, DPOConfig, base, adapters, train_rows, work, beta=BETA,
                     loss_type=[loss_type])[:2]


def trl_tokens(base, rows, max_length, work):
    """Each pair DPOTrainer keeps, as its collator batches it alone: (input_ids, labels) of the
    two rows [chosen, rejected], without the padding."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    args = DPOConfig(output_dir=os.path.join(work, "trl-tokens"), max_length=max_length,
                     report_to=[], use_cpu=True, save_strategy="no")
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer)
    out = []
    for example in trainer.train_dataset:
        batch = trainer.data_collator([example])
        ids, keep, completion = (batch["input_ids"], batch["attention_mask"],
                                 batch["completion_mask"])
        labels = ids.masked_fill(completion == 0, -100)
        out.append([(ids[r][keep[r] == 1].tolist(), labels[r][keep[r] == 1].tolist())
                    for r in range(2)])
    return out, [len(example["prompt_ids"]) for example in trainer.train_dataset]


def our_tokens(tool, base, train, val, max_length, work):
    """The trainer's pairs (preference_tool): (inputs, labels) of each row, the labels rebuilt
    from the next-token targets, cut to each row's own length (TRL's unpadded rows)."""
    out_dir = os.path.join(work, "tool")
    os.makedirs(out_dir, exist_ok=True)
    run([tool, out_dir, f"files={train}", f"val_files={val}", f"max_length={max_length}",
         f"pretrained={base}"], "preference_tool")
    pairs = []
    with open(os.path.join(out_dir, "pairs.jsonl")) as f:
        for line in f:
            p = json.loads(line)
            pairs.append([(inputs, [-100] + targets[:-1])
                          for inputs, targets in zip(p["inputs"], p["targets"])])
    return pairs


def check_tokens(tool, work, base, conversational, failures, tag=""):
    """The pairs' token ids and completion labels equal DPOTrainer's, at a max_length that keeps
    every row whole, one that cuts every completion after its first two tokens, and one that
    drops the pairs of the longest prompts."""
    name = tag + ("messages" if conversational else "text")
    rows = records(PAIRS, 5, conversational)
    train, val = os.path.join(work, f"tok-{name}.jsonl"), os.path.join(work, f"tok-{name}-v.jsonl")
    write_jsonl(train, rows)
    write_jsonl(val, records(2, 6, conversational, longest=1))
    whole, prompts = trl_tokens(base, rows, None, work)
    longest_row = max(len(r[0]) for pair in whole for r in pair)
    lengths = (longest_row, min(prompts) + 2, max(prompts))
    if min(prompts) == max(prompts):
        failures.append(f"{name} tokens: the prompts are all {max(prompts)} tokens long")
    for max_length in lengths:
        theirs = trl_tokens(base, rows, max_length, work)[0]
        ours = our_tokens(tool, base, train, val, max_length, work)
        # Padding: ours to the longer row of the pair (its pad id), TRL's cut by attention_mask.
        ours = [[(i[:len(t[0])], l[:len(t[0])]) for (i, l), t in zip(pair, their)]
                for pair, their in zip(ours, theirs)]
        what = f"{name} tokens at max_length {max_length}"
        if len(ours) != len(theirs):
            failures.append(f"{what}: {len(ours)} pairs kept, TRL keeps {len(theirs)}")
        elif ours != theirs:
            bad = next(k for k in range(len(ours)) if ours[k] != theirs[k])
            failures.append(f"{what}: pair {bad}: trainer {ours[bad]}, TRL {theirs[bad]}")
        else:
            print(f"{what}: {len(ours)} pairs equal TRL's")


def relative(name, a, b, record, loss_scale=None):
    """|a - b| over the size of b, or of what b is computed from where b nears 0: a reward is
    beta times a difference of summed log-probabilities (their float32 rounding), ORPO's log odds
    a difference of averaged ones, a mean logit is a mean of logits of either sign (the size of
    the step's larger mean logit, at least LOGIT_FLOOR), a loss `loss_scale` of the record where
    given (the size of the terms it is a difference of)."""
    scale = abs(b)
    logps = max(abs(record["logps/chosen"]), abs(record["logps/rejected"]))
    if name.startswith("rewards/"):
        scale = max(scale, BETA * logps)
    elif name == "log_odds_chosen":
        scale = max(scale, logps)
    elif name.startswith("logits/"):
        scale = max(scale, LOGIT_FLOOR, abs(record["logits/chosen"]),
                    abs(record["logits/rejected"]))
    elif name == "loss" and loss_scale:
        scale = max(scale, loss_scale(record))
    return abs(a - b) / max(scale, 1e-12)


def compare(what, ours, losses, logs, failures, metrics=METRICS, loss_scale=None):
    if len(ours) != STEPS or len(losses) != STEPS or len(logs) != STEPS:
        failures.append(f"{what}: steps logged: trainer {len(ours)}, TRL {len(losses)} losses, "
                        f"{len(logs)} metric records")
        return
    worst = (0.0, "")
    for step, (mine, loss, theirs) in enumerate(zip(ours, losses, logs), 1):
        pairs = [("loss", mine["loss"], loss)] + [(m, mine.get(m), theirs[m]) for m in metrics]
        for name, a, b in pairs:
            if a is None:
                failures.append(f"{what}: step {step}: the trainer logged no {name}")
                return
            difference = relative(name, a, b, theirs, loss_scale)
            if difference > worst[0]:
                worst = (difference, f"step {step} {name}: trainer {a!r}, TRL {b!r}")
    print(f"{what}: loss {ours[0]['loss']:.6f} -> {ours[-1]['loss']:.6f}; worst relative "
          f"difference {worst[0]:.2e} ({worst[1]})")
    if worst[0] > TOL:
        failures.append(f"{what}: {worst[1]} (relative {worst[0]:.2e} > {TOL})")


def check_format(binary, work, base, conversational, loss_type, failures, tag=""):
    name = tag + ("messages" if conversational else "text") + "-" + loss_type
    train_rows = records(PAIRS, 1, conversational)
    train, val = os.path.join(work, f"{name}-train.jsonl"), os.path.join(work, f"{name}-val.jsonl")
    write_jsonl(train, train_rows)
    write_jsonl(val, records(4, 2, conversational))
    start = os.path.join(work, f"{name}-start")
    run([binary, "--config", trainer_config(work, f"{name}-start", base, train, val, loss_type,
                                            1, 0.0), "--run-dir", start], f"{name}: step 0")
    adapters = os.path.join(work, f"{name}-adapters")
    run([binary, "export", "--checkpoint", start, "--out", adapters, "--format", "peft"],
        f"{name}: export")
    run_dir = os.path.join(work, name)
    run([binary, "--config", trainer_config(work, name, base, train, val, loss_type, STEPS, LR),
         "--run-dir", run_dir], f"{name}: train")
    losses, logs = trl_run(base, adapters, train_rows, loss_type, work)
    compare(name, trainer_records(run_dir), losses, logs, failures)


def bad_record_cases():
    """(what, record, words the message names besides FILE:LINE): records trainer refuses."""
    say = [{"role": "user", "content": "Say apple"}]
    other = [{"role": "user", "content": "Say bread"}]
    answer = [{"role": "assistant", "content": "apple"}]
    wrong = [{"role": "assistant", "content": "bread"}]
    return [
        ("a record without chosen", {"prompt": "Say apple", "rejected": " bread"}, ["chosen"]),
        ("a record without rejected", {"chosen": "Say apple Answer: apple"}, ["rejected"]),
        ("an empty text completion", {"prompt": "Say apple", "chosen": "", "rejected": " bread"},
         ["chosen", "empty"]),
        ("an empty message completion",
         {"prompt": say, "chosen": answer, "rejected": [{"role": "assistant", "content": ""}]},
         ["rejected", "empty"]),
        ("roles out of order (a user message in the completion)",
         {"prompt": say, "chosen": answer + say, "rejected": wrong}, ["chosen[1]", "out of order"]),
        ("roles out of order (the prompt repeated in the completion)",
         {"prompt": say, "chosen": say + answer, "rejected": say + wrong},
         ["chosen[0]", "out of order"]),
        ("prompts that differ (implicit, conversational)",
         {"chosen": say + answer, "rejected": other + wrong}, ["message 0", "prompt"]),
    ]


def simpo_records(base, count, seed, length=25):
    """Text pairs whose rows all have `length` tokens: CPOTrainer's logits/* are means over every
    position of the padded rows, and its padding (attention-masked) is not the trainer's."""
    import random
    tokenizer = PreTrainedTokenizerFast.from_pretrained(base)
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        a, b, c, d, e = rng.sample(WORDS, 5)
        question = f"Say {a} {b} Answer:"
        record = {"chosen": f"{question} {a} {b} {c}", "rejected": f"{question} {b} {d} {e}"}
        if all(len(tokenizer(text)["input_ids"]) == length for text in record.values()):
            out.append(record)
    return out


def trl_cpo_run(base, adapters, train_rows, work):
    return trl_train(CPOTrainer, CPOConfig, base, adapters, train_rows, work, loss_type="simpo",
                     cpo_alpha=0.0, beta=BETA, simpo_gamma=0.5)[:2]


def check_simpo(binary, work, base, failures):
    """dpo.loss_type simpo (reference-free, cpo_alpha 0) against CPOTrainer with loss_type
    "simpo" and PEFT: 20 steps from the same adapters, the loss and every metric it logs."""
    name = "text-simpo"
    train_rows = simpo_records(base, PAIRS, 7)
    train, val = os.path.join(work, f"{name}-train.jsonl"), os.path.join(work, f"{name}-val.jsonl")
    write_jsonl(train, train_rows)
    write_jsonl(val, simpo_records(base, 4, 8))
    start = os.path.join(work, f"{name}-start")
    run([binary, "--config", trainer_config(work, f"{name}-start", base, train, val, "simpo",
                                            1, 0.0), "--run-dir", start], f"{name}: step 0")
    adapters = os.path.join(work, f"{name}-adapters")
    run([binary, "export", "--checkpoint", start, "--out", adapters, "--format", "peft"],
        f"{name}: export")
    run_dir = os.path.join(work, name)
    run([binary, "--config", trainer_config(work, name, base, train, val, "simpo", STEPS, LR),
         "--run-dir", run_dir], f"{name}: train")
    losses, logs = trl_cpo_run(base, adapters, train_rows, work)
    compare(name, trainer_records(run_dir), losses, logs, failures, SIMPO_METRICS)


def check_bad_input(binary, work, base, failures):
    """Each bad record on line 3 of the training file: exit 2, one line naming FILE:LINE and the
    fault; where TRL would train on it, what TRL makes of it (trl.extract_prompt's prompt)."""
    from trl.data_utils import extract_prompt
    for k, (what, record, words) in enumerate(bad_record_cases()):
        conversational = isinstance(record.get("chosen", record.get("rejected")), list)
        rows = records(4, 3, conversational)
        train = os.path.join(work, f"bad{k}-train.jsonl")
        val = os.path.join(work, f"bad{k}-val.jsonl")
        write_jsonl(train, rows[:2] + [record] + rows[2:])
        write_jsonl(val, records(2, 4, conversational))
        config = trainer_config(work, f"bad{k}", base, train, val, "sigmoid", 1, LR)
        r = run([binary, "--config", config, "--run-dir", os.path.join(work, f"bad{k}")], what,
                expect=2)
        lines = [line for line in r.stderr.splitlines() if f"{train}:3" in line]
        if len(lines) != 1 or not all(w in lines[0] for w in words):
            failures.append(f"{what}: no one line naming {train}:3 and {words}: "
                            f"{r.stderr.strip()[-400:]}")
        else:
            print(f"{what}: exit 2, {lines[0].strip()[-160:]}")
    # TRL's implicit prompt of conversations whose user turns differ is their common start (no
    # message), which would train on the user's turn as the chosen completion.
    split = extract_prompt({"chosen": bad_record_cases()[-1][1]["chosen"],
                            "rejected": bad_record_cases()[-1][1]["rejected"]})
    if split["prompt"] != [] or split["chosen"][0]["role"] != "user":
        failures.append(f"trl.extract_prompt of differing prompts: {split}")
    train = os.path.join(work, "bad-train.jsonl")
    write_jsonl(train, records(4, 3, False))
    config = trainer_config(work, "bad", base, train, train, "sigmoid", 1, LR)
    r = run([binary, "--config", config, "--run-dir", os.path.join(work, "bad2"),
             "--set", "train.objective=supervised"], "pairs without dpo", expect=2)
    if "data.name" not in r.stderr or "train.objective: dpo" not in r.stderr:
        failures.append(f"pairs without dpo: the message names neither data.name nor "
                        f"train.objective: dpo: {r.stderr.strip()[-400:]}")


def check_dropped(binary, work, base, failures):
    """Pairs whose prompt reaches max_length: DPOTrainer's filter drops them; the trainer drops
    the same number, warns naming each FILE:LINE and counts them in its log, and trains on."""
    rows = records(PAIRS, 5, False)
    train, val = os.path.join(work, "drop-train.jsonl"), os.path.join(work, "drop-val.jsonl")
    write_jsonl(train, rows)
    write_jsonl(val, records(2, 6, False, longest=1))
    _, prompts = trl_tokens(base, rows, None, work)
    max_length = max(prompts)
    kept = len(trl_tokens(base, rows, max_length, work)[0])
    config = trainer_config(work, "drop", base, train, val, "sigmoid", 1, 0.0)
    r = run([binary, "--config", config, "--run-dir", os.path.join(work, "drop"), "--set",
             f"data.max_length={max_length}", "--set", "data.batch_size=2"],
            "pairs longer than max_length")
    dropped = PAIRS - kept
    named = [line for line in r.stderr.splitlines() if "dropped" in line and f"{train}:" in line]
    counted = f"{PAIRS - dropped} train and" in r.stderr and f"{dropped} pairs dropped" in r.stderr
    if dropped == 0 or len(named) != dropped or not counted:
        failures.append(f"max_length {max_length}: TRL drops {dropped} of {PAIRS} pairs; the "
                        f"trainer's log: {r.stderr.strip()[-600:]}")
    else:
        print(f"max_length {max_length}: {dropped} of {PAIRS} pairs dropped as TRL drops them, "
              f"each named, counted in the log")


@contextlib.contextmanager
def work_dir(keep, prefix):
    """The checks' folder: `keep` (made when missing, left afterwards), else a temporary one
    removed afterwards."""
    work = keep or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(work, exist_ok=True)
    try:
        yield work
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def base_and_work(prefix, program="trainer"):
    """For a check built on this one: its command line (PROGRAM [--keep DIR]), its work folder
    (work_dir) and this check's base saved in it, as (args, work, base)."""
    parser = argparse.ArgumentParser()
    parser.add_argument(program)
    parser.add_argument("--keep")
    args = parser.parse_args()
    with work_dir(args.keep, prefix) as work:
        base = os.path.join(work, "base")
        save_base(base)
        yield args, work, base


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trainer")
    parser.add_argument("--tool", required=True, help="tests/preference_tool")
    parser.add_argument("--keep")
    args = parser.parse_args()
    failures = []
    with work_dir(args.keep, "dpo_check_") as work:
        base = os.path.join(work, "base")
        save_base(base)
        for conversational, loss_type in ((False, "sigmoid"), (True, "sigmoid"), (False, "ipo")):
            check_format(args.trainer, work, base, conversational, loss_type, failures)
        check_simpo(args.trainer, work, base, failures)
        qwen3 = os.path.join(work, "qwen3")  # Qwen 3's template and model, messages
        save_base(qwen3, "qwen3")
        check_format(args.trainer, work, qwen3, True, "sigmoid", failures, tag="qwen3-")
        # After the runs: a DPOTrainer built over a plain model (no PEFT) changes later runs'
        # numbers in this process.
        for conversational in (False, True):
            check_tokens(args.tool, work, base, conversational, failures)
        check_tokens(args.tool, work, qwen3, True, failures, tag="qwen3-")
        check_bad_input(args.trainer, work, base, failures)
        check_dropped(args.trainer, work, base, failures)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
