#!/usr/bin/env python3
"""trainer generate --chat against transformers' apply_chat_template (CTest
Chat.GeneratePromptMatchesApplyChatTemplate).

  chat_generate_check.py TRAINER

A tokenizer `tokenizers` trains here (byte-level BPE with Llama 3's and ChatML's special tokens),
in folders whose tokenizer_config.json holds a published chat template (tests/data/chat_templates/,
the copies tests/chat_check.py compares the chat data set with), and a tiny random Llama
(transformers, float32) saved by save_pretrained.

- Prompt ids: for every published template and prompts with and without a system message (the text
  of several scripts, whitespace at the edges that the Llama templates trim, a special token
  written in the text, an empty user message, a prompt file), the ids generate --chat logs
  (--log-level debug) equal apply_chat_template(messages, add_generation_prompt=True,
  tokenize=True).
- The model reads them: generate --chat --ignore-eos prints exactly transformers' decoding of its
  greedy tokens after those ids (the reply alone, no prompt).
- The end of a turn: with the end-of-turn token's output row made to win (Llama 3's <|eot_id|>,
  ChatML's <|im_end|>; neither an eos id of the folder), the reply stops where transformers'
  generate(eos_token_id=that token) stops, the token itself not printed.
- A run on chat data: its data.chat_template (llama3, llama3.1 with data.chat_date) and
  data.tokenizer (a folder without a template) render the prompt as the published templates do.
- --chat-template NAME on a run on token data with a folder without a template (llama3,
  llama3.1, qwen2.5, chatml) renders the prompt as the published template does.
- Without --chat, a tokenizer whose post-processor adds Llama 3's bos: the prompt's ids equal
  tokenizers' encode(prompt), a prompt starting with <|begin_of_text|> too ([bos, bos, ...]).
- Bad input, exit 2 naming --chat-template and --chat: a folder without a chat template, a
  template none of the built-in ones; --system or --chat-template without --chat, and a
  --chat-template that names no format, are exit 2.
Exits 77 (skipped) when transformers or tokenizers is not installed.
"""
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from chat_reference import hf_tokenizer
from run_check import one_intra_op_thread

one_intra_op_thread()  # before torch is imported

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

TEMPLATES = os.path.join(HERE, "data", "chat_templates")
CASES = ["llama3-instruct", "llama3.1-instruct", "llama3.2-instruct", "qwen2-instruct",
         "qwen2.5-instruct", "qwen3", "qwen3-first-release", "chatml"]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# (system message or None, user message)
PROMPTS = [
    (None, "Hello there, how are you?"),
    ("Be brief.", "What is 2+2?"),
    ("  Réponds en français.\n", " Ünïcödé — 日本語のテキスト, Ελληνικά\n\n"),
    (None, "a <|im_start|> and <|eot_id|> in the text"),
    ("You reverse words.", ""),
]
NEW = 6  # tokens generated
failures = []


def fail(what):
    failures.append(what)
    print("FAIL:", what)


def template_file(name):
    with open(os.path.join(TEMPLATES, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


def train_tokenizer(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [s or "" for p in PROMPTS for s in p] + [
        "the quick brown fox jumps over the lazy dog; user assistant system " * 20,
        "Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024 You are Qwen, created by "
        "Alibaba Cloud. You are a helpful assistant. <think> </think>"]
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)
    return tok.get_vocab_size()


def tokenizer_folder(work, name, vocab_json, config):
    """A folder with the tokenizer.json and `config` as tokenizer_config.json."""
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    shutil.copy(vocab_json, os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({**config, "tokenizer_class": "PreTrainedTokenizerFast"}, f, ensure_ascii=False)
    return d


def messages(system, user):
    return ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": user}]


def write_config(work, name, folder, vocab, data=None):
    """A config whose model is the folder's (weights as saved: one step at learning rate 0)."""
    data = data or {"name": "synthetic_tokens", "num_classes": vocab, "seq_len": 16,
                    "train_samples": 8, "val_samples": 4}
    config = {"seed": 1, "model": {"pretrained": folder},
              "data": {**data, "batch_size": 2, "workers": 0},
              "train": {"max_steps": 1}, "optim": {"name": "sgd", "lr": 0},
              "run": {"progress": "never", "tensorboard": False, "threads": 1}}
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        json.dump(config, f)  # JSON is YAML
    return path


def generate(trainer, config, system, user, *extra, prompt_file=None):
    """(exit status, stdout bytes, stderr text, the prompt ids logged or None)."""
    args = [trainer, "generate", "--config", config, "--chat", "--temperature", "0",
            "--max-new-tokens", str(NEW), "--log-level", "debug", *extra]
    if system is not None:
        args += ["--system", system]
    args += ["--prompt-file", prompt_file] if prompt_file else ["--prompt", user]
    r = subprocess.run(args, capture_output=True)
    err = r.stderr.decode(errors="replace")
    m = re.search(r"the prompt's \d+ token ids:((?: \d+)*)", err)
    ids = [int(x) for x in m.group(1).split()] if m else None
    return r.returncode, r.stdout, err, ids


def greedy(model, ids, eos=None):
    with torch.no_grad():
        x = torch.tensor([ids])  # the mask given: id 0 is <|begin_of_text|>, not padding
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW,
                             do_sample=False, eos_token_id=eos, pad_token_id=0)
    return out[0, len(ids):].tolist()


def decode(t, ids):
    return t.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def check_templates(trainer, work, vocab_json, config, model):
    for case in CASES:
        template = template_file(case)
        folder = tokenizer_folder(work, case, vocab_json, template)
        t = hf_tokenizer(vocab_json, template)
        for k, (system, user) in enumerate(PROMPTS):
            want = list(t.apply_chat_template(messages(system, user), add_generation_prompt=True,
                                              tokenize=True))
            prompt_file = None
            if k == 2:  # the prompt as a file: its bytes as they are
                prompt_file = os.path.join(work, "prompt.txt")
                with open(prompt_file, "w", encoding="utf-8") as f:
                    f.write(user)
            code, out, err, ids = generate(trainer, config, system, user, "--tokenizer", folder,
                                           "--ignore-eos", prompt_file=prompt_file)
            if code != 0 or ids != want:
                fail(f"{case}, prompt {k}: exit {code}, ids {ids}, apply_chat_template {want}; "
                     f"{err[-600:]}")
                continue
            reply = decode(t, greedy(model, want)) + "\n"
            if out.decode("utf-8", errors="replace") != reply:
                fail(f"{case}, prompt {k}: printed {out!r}, transformers' greedy reply {reply!r}")
        print(f"{case}: {len(PROMPTS)} prompts, ids as apply_chat_template(add_generation_prompt="
              f"True), greedy replies as transformers'")


def check_end_of_turn(trainer, work, vocab_json, model, vocab):
    """The template's end-of-turn token ends the reply and is not printed."""
    for case, end in (("llama3-instruct", "<|eot_id|>"), ("chatml", "<|im_end|>")):
        template = template_file(case)
        folder = tokenizer_folder(work, case, vocab_json, template)
        t = hf_tokenizer(vocab_json, template)
        end_id = t.convert_tokens_to_ids(end)
        system, user = PROMPTS[1]
        ids = t.apply_chat_template(messages(system, user), add_generation_prompt=True,
                                    tokenize=True)
        free = greedy(model, ids)
        stopping = LlamaForCausalLM(model.config)
        for k, scale in itertools.product(range(2, NEW), (1.2, 1.5, 2.0)):
            # The end token's output row a multiple of a later greedy token's: it wins somewhere.
            stopping.load_state_dict(model.state_dict())
            with torch.no_grad():
                stopping.lm_head.weight[end_id] = scale * model.lm_head.weight[free[k]]
            stopping.eval()
            theirs = greedy(stopping, ids, eos=end_id)
            if theirs[-1] == end_id and len(theirs) > 1:
                break
        if theirs[-1] != end_id or len(theirs) >= NEW:
            fail(f"{case}: the reference does not stop at {end} ({theirs}); the check is void")
            continue
        model_dir = os.path.join(work, "stop-" + case)
        stopping.save_pretrained(model_dir, safe_serialization=True)
        config = write_config(work, "stop-" + case, model_dir, vocab)
        code, out, err, _ = generate(trainer, config, system, user, "--tokenizer", folder)
        want = decode(t, theirs[:-1]) + "\n"
        if code != 0 or out.decode("utf-8", errors="replace") != want:
            fail(f"{case}: exit {code}, printed {out!r}, expected {want!r} ({theirs}); "
                 f"{err[-600:]}")
        else:
            print(f"{case}: the reply stops at {end} after {len(theirs) - 1} tokens, as "
                  f"transformers', {end} not printed")


def check_chat_run(trainer, work, vocab_json, model_dir, vocab):
    """A run on chat data: data.chat_template and data.tokenizer render generate's prompt."""
    bare = tokenizer_folder(work, "bare", vocab_json,
                            {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
    records = os.path.join(work, "chat.jsonl")
    with open(records, "w") as f:
        for _ in range(4):
            f.write(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    for fmt, case, date, kw in (("llama3", "llama3-instruct", "", {}),
                                ("llama3.1", "llama3.1-instruct", "01 Jan 2025",
                                 {"date_string": "01 Jan 2025"})):
        data = {"name": "chat", "root": records, "val_files": records, "tokenizer": bare,
                "chat_template": fmt, "chat_date": date, "seq_len": 64}
        config = write_config(work, "run-" + fmt, model_dir, vocab, data)
        t = hf_tokenizer(vocab_json, {**template_file(case), "bos_token": "<|begin_of_text|>"})
        for system, user in PROMPTS[:2]:
            want = list(t.apply_chat_template(messages(system, user), add_generation_prompt=True,
                                              tokenize=True, **kw))
            code, _, err, ids = generate(trainer, config, system, user)
            if code != 0 or ids != want:
                fail(f"data.chat_template {fmt}: exit {code}, ids {ids}, expected {want}; "
                     f"{err[-600:]}")
        print(f"a chat run's data.chat_template {fmt} and data.tokenizer: ids as the published "
              f"template's")


def check_chat_template_flag(trainer, work, vocab_json, config):
    """--chat-template on a run on token data renders as the published template named."""
    bare = tokenizer_folder(work, "flag-bare", vocab_json,
                            {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
    for fmt, case in (("llama3", "llama3-instruct"), ("llama3.1", "llama3.1-instruct"),
                      ("qwen2.5", "qwen2.5-instruct"), ("chatml", "chatml")):
        t = hf_tokenizer(vocab_json, {**template_file(case), "bos_token": "<|begin_of_text|>"})
        for system, user in PROMPTS[:2]:
            want = list(t.apply_chat_template(messages(system, user), add_generation_prompt=True,
                                              tokenize=True))
            code, _, err, ids = generate(trainer, config, system, user, "--tokenizer", bare,
                                         "--chat-template", fmt)
            if code != 0 or ids != want:
                fail(f"--chat-template {fmt}: exit {code}, ids {ids}, expected {want}; "
                     f"{err[-600:]}")
        print(f"--chat-template {fmt} on a token-data run: ids as the published template's")


def check_text_prompt_bos(trainer, work, vocab_json, config):
    """Without --chat: the prompt's ids as tokenizers' encode with a bos-adding post-processor."""
    tok = Tokenizer.from_file(vocab_json)
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    folder = os.path.join(work, "bos-adding")
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": bos, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    for prompt in ("Hello there", bos + "Hello there", bos + bos + "hi", "a " + bos + " b"):
        want = tok.encode(prompt).ids
        r = subprocess.run([trainer, "generate", "--config", config, "--tokenizer", folder,
                            "--prompt", prompt, "--max-new-tokens", "1", "--log-level", "debug"],
                           capture_output=True, text=True, errors="replace")
        m = re.search(r"the prompt's \d+ token ids:((?: \d+)*)", r.stderr)
        ids = [int(x) for x in m.group(1).split()] if m else None
        if r.returncode != 0 or ids != want:
            fail(f"prompt {prompt!r}: exit {r.returncode}, ids {ids}, tokenizers' encode {want}; "
                 f"{r.stderr[-400:]}")
    print("prompts with and without <|begin_of_text|>: ids as tokenizers' encode")


def check_bad_input(trainer, work, vocab_json, config):
    bare = tokenizer_folder(work, "no-template", vocab_json, {"bos_token": "<|begin_of_text|>"})
    other = tokenizer_folder(work, "other-template", vocab_json,
                             {"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})
    for what, folder in (("no template", bare), ("another template", other)):
        code, _, err, _ = generate(trainer, config, None, "hi", "--tokenizer", folder)
        line = err.strip().splitlines()[-1] if err.strip() else ""
        if code != 2 or "--chat-template llama3|" not in line:
            fail(f"{what}: exit {code} (expected 2), last line {line!r}")
        else:
            print(f"{what}: exit 2: {line}")
    r = subprocess.run([trainer, "generate", "--config", config, "--system", "x", "--prompt", "y"],
                       capture_output=True, text=True)
    if r.returncode != 2 or "--chat" not in r.stderr:
        fail(f"--system without --chat: exit {r.returncode}, {r.stderr[-300:]!r}")
    r = subprocess.run([trainer, "generate", "--config", config, "--chat-template", "llama3",
                        "--prompt", "y"], capture_output=True, text=True)
    if r.returncode != 2 or "add --chat" not in r.stderr:
        fail(f"--chat-template without --chat: exit {r.returncode}, {r.stderr[-300:]!r}")
    code, _, err, _ = generate(trainer, config, None, "hi", "--tokenizer", bare,
                               "--chat-template", "llama4")
    line = err.strip().splitlines()[-1] if err.strip() else ""
    if code != 2 or "--chat-template" not in line or "llama3.1" not in line:
        fail(f"--chat-template llama4: exit {code} (expected 2), last line {line!r}")
    else:
        print(f"--chat-template llama4: exit 2: {line}")


def main():
    trainer = sys.argv[1]
    with tempfile.TemporaryDirectory() as work:
        vocab_json = os.path.join(work, "vocab.json")
        vocab = train_tokenizer(vocab_json)
        torch.manual_seed(3)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab, max_position_embeddings=256, num_hidden_layers=2, hidden_size=64,
            intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
            initializer_range=0.3, tie_word_embeddings=False, bos_token_id=None,
            eos_token_id=None)).eval()
        model_dir = os.path.join(work, "model")
        model.save_pretrained(model_dir, safe_serialization=True)
        config = write_config(work, "model", model_dir, vocab)
        check_templates(trainer, work, vocab_json, config, model)
        check_end_of_turn(trainer, work, vocab_json, model, vocab)
        check_chat_run(trainer, work, vocab_json, model_dir, vocab)
        check_chat_template_flag(trainer, work, vocab_json, config)
        check_text_prompt_bos(trainer, work, vocab_json, config)
        check_bad_input(trainer, work, vocab_json, config)
    if failures:
        sys.exit(f"{len(failures)} failures; the first: {failures[0]}")
    print("generate --chat: all checks pass")


if __name__ == "__main__":
    main()
