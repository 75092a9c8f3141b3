#!/usr/bin/env python3
"""A checkpoint used without its base folder or its data (CTest Checkpoint.UsedWithoutItsBase).

  moved_base_check.py TRAINER

A tiny random Llama (transformers) with a tokenizer `tokenizers` trains here and ChatML's
published template, saved by save_pretrained in shards (an index), is model.pretrained of a full
fine-tune and of a LoRA run on chat data.

- A full fine-tune's checkpoint holds every weight: once the base folder and the JSONL moved,
  `generate --chat --tokenizer NEW` prints transformers' greedy reply of the checkpoint's weights
  (exported before the move) to apply_chat_template's prompt; `eval --set model.pretrained=NEW
  --set data.val_files=NEW` gives the loss it gave before the move.
- generate reads no data: with the JSONL moved away, and with --config and a data.batch_size the
  chat data cannot fill, it prints transformers' greedy reply.
- A LoRA run's base is recognised by its contents: a copy at another path (with an extra
  .safetensors its index does not list) evaluates as the original did; with the base gone,
  eval exits 2 naming model.pretrained; a copy with other weights exits 2 ("another base");
  another model.lora.rank exits 2 naming it, in words for loading, not resuming.
- Eval with the base moved and no tokenizer given: exit 2, one line naming data.tokenizer and
  the folder.
Exits 77 (skipped) when transformers or tokenizers is not installed.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from window_runs import randomize
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

NEW = 8
failures = []


def fail(what):
    failures.append(what)
    print("FAIL:", what)


def run(args, expect=0):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != expect:
        fail(f"{' '.join(args[1:4])}: exit {r.returncode} (expected {expect}): {r.stderr[-2000:]}")
    return r


def make_base(folder, seed):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world how are you the quick brown fox user assistant"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=[
                                "<|im_start|>", "<|im_end|>", "<|endoftext|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False))
    randomize(model)
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="100KB")
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(HERE, "data", "chat_templates", "chatml.json")) as f:
        config = json.load(f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({**config, "tokenizer_class": "PreTrainedTokenizerFast"}, f)


def write_config(work, name, base, data, lora):
    model = {"pretrained": base}
    if lora:
        model["lora"] = {"rank": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}
    config = {"seed": 0, "model": model,
              "data": {"name": "chat", "files": data, "val_files": data, "seq_len": 32,
                       "batch_size": 2, "workers": 0},
              "train": {"max_steps": 3}, "optim": {"name": "adamw", "lr": 3e-3},
              "run": {"progress": "never", "tensorboard": False, "threads": 1}}
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        json.dump(config, f)  # JSON is YAML
    return path


def eval_loss(trainer, *args, expect=0):
    r = run([trainer, "eval", "--json", *args], expect)
    return json.loads(r.stdout)["loss"] if r.returncode == 0 and expect == 0 else r


def greedy_reply(folder, tokenizer_dir, prompt):
    """transformers' greedy reply to `prompt` as a user message, up to <|im_end|>."""
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                  add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        x = torch.tensor([ids])
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW,
                             do_sample=False, eos_token_id=end, pad_token_id=end)
    reply = [t for t in out[0, len(ids):].tolist() if t != end]
    return tok.decode(reply)


def generate(trainer, *args, expect=0):
    r = run([trainer, "generate", "--chat", "--prompt", "hello 3", "--temperature", "0",
             "--max-new-tokens", str(NEW), *args], expect)
    return r.stdout.rstrip("\n") if r.returncode == 0 else r


def check_whole(trainer, work, base, data):
    run_dir = os.path.join(work, "full")
    run([trainer, "--config", write_config(work, "full", base, data, False), "--run-dir", run_dir,
         "--log-level", "warn"])
    before = eval_loss(trainer, "--checkpoint", run_dir)
    exported = os.path.join(work, "full_hf")
    run([trainer, "export", "--checkpoint", run_dir, "--format", "hf", "--out", exported])
    want = greedy_reply(exported, base, "hello 3")
    moved, moved_data = base + "_moved", data + ".moved"
    os.rename(base, moved)
    os.rename(data, moved_data)
    try:
        got = generate(trainer, "--checkpoint", run_dir, "--tokenizer", moved)
        if got != want:
            fail(f"full fine-tune, base and data moved: generate printed {got!r}, "
                 f"transformers {want!r}")
        after = eval_loss(trainer, "--checkpoint", run_dir, "--set", f"model.pretrained={moved}",
                          "--set", f"data.val_files={moved_data}", "--set",
                          f"data.files={moved_data}")
        if not isinstance(after, float) or abs(after - before) > 1e-6 * abs(before):
            fail(f"full fine-tune, base moved: eval loss {after}, before the move {before}")
        r = eval_loss(trainer, "--checkpoint", run_dir, "--set", f"model.pretrained={moved}",
                      expect=2)
        if r.returncode == 2 and "data.val_files" not in r.stderr and "data.files" not in r.stderr:
            fail(f"eval with the data moved: {r.stderr!r} names no data key")
        # The chat data's tokenizer was the folder's: one line naming where it is looked for.
        r = eval_loss(trainer, "--checkpoint", run_dir, expect=2)
        lines = r.stderr.strip().splitlines() if r.returncode == 2 else []
        if len(lines) != 1 or base not in lines[0] or "data.tokenizer" not in lines[0]:
            fail(f"eval with the base moved, no tokenizer given: {r.stderr!r}")
        print(f"full fine-tune: eval {before:.6f} before the move, {after} after; "
              f"generate {got!r}")
    finally:
        os.rename(moved, base)
        os.rename(moved_data, data)
    # --config alone (the base's weights) with a batch the 12 conversations cannot fill.
    big = write_config(work, "big", base, data + ".absent", False)
    got = generate(trainer, "--config", big, "--set", "data.batch_size=64")
    want = greedy_reply(base, base, "hello 3")
    if got != want:
        fail(f"generate --config without its data: printed {got!r}, transformers {want!r}")


def check_lora(trainer, work, base, data):
    run_dir = os.path.join(work, "lora")
    run([trainer, "--config", write_config(work, "lora", base, data, True), "--run-dir", run_dir,
         "--log-level", "warn"])
    before = eval_loss(trainer, "--checkpoint", run_dir)
    copy, gone = os.path.join(work, "elsewhere", "base"), base + "_gone"
    shutil.copytree(base, copy)
    shutil.copy(os.path.join(base, "model-00001-of-00002.safetensors")
                if os.path.exists(os.path.join(base, "model-00001-of-00002.safetensors"))
                else os.path.join(base, sorted(f for f in os.listdir(base)
                                               if f.endswith(".safetensors"))[0]),
                os.path.join(copy, "unlisted.safetensors"))
    os.rename(base, gone)
    try:
        r = eval_loss(trainer, "--checkpoint", run_dir, expect=2)
        lines = r.stderr.strip().splitlines() if r.returncode == 2 else []
        if len(lines) != 1 or "model.pretrained" not in lines[0] or "not there" not in lines[0]:
            fail(f"LoRA, base gone: {r.stderr!r}")
        after = eval_loss(trainer, "--checkpoint", run_dir, "--set", f"model.pretrained={copy}")
        if not isinstance(after, float) or abs(after - before) > 1e-6 * abs(before):
            fail(f"LoRA on a copy of its base elsewhere: eval loss {after}, before {before}")
        r = eval_loss(trainer, "--checkpoint", run_dir, "--set", f"model.pretrained={copy}",
                      "--set", "model.lora.rank=8", expect=2)
        if r.returncode == 2 and ("model.lora.rank" not in r.stderr or "resume" in r.stderr):
            fail(f"eval with another model.lora.rank: {r.stderr!r}")
        other = os.path.join(work, "other")
        make_base(other, seed=5)
        r = eval_loss(trainer, "--checkpoint", run_dir, "--set", f"model.pretrained={other}",
                      expect=2)
        if r.returncode == 2 and "another base" not in r.stderr:
            fail(f"LoRA on another base: {r.stderr!r}")
        print(f"LoRA: eval {before:.6f} on its base, {after} on a copy elsewhere")
    finally:
        os.rename(gone, base)


def main():
    trainer = sys.argv[1]
    with tempfile.TemporaryDirectory() as work:
        base = os.path.join(work, "base")
        make_base(base, seed=0)
        if not os.path.exists(os.path.join(base, "model.safetensors.index.json")):
            fail("the base was not saved in shards")
        data = os.path.join(work, "chat.jsonl")
        with open(data, "w") as f:
            for i in range(12):
                f.write(json.dumps({"messages": [
                    {"role": "user", "content": f"hello {i}"},
                    {"role": "assistant", "content": "world how are you"}]}) + "\n")
        check_whole(trainer, work, base, data)
        check_lora(trainer, work, base, data)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
