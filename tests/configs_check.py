#!/usr/bin/env python3
"""The shipped configs resolve, and the Hugging Face recipes train (CTest
Configs.ShippedConfigsResolve).

  configs_check.py TRAINER REPO

1. Every configs/*.yaml and configs/bench/*.yaml: `trainer --config F --print-config` exits 0
   (every key exists, every value validates; without a GPU, a float16 config is resolved with
   amp.dtype bfloat16 when the GPU is all it lacks). A config that sets model.pretrained resolves
   against a tiny random folder that transformers saves here, of the model_type the file names
   (Qwen 3 for qwen3_*, else Llama), so that config.json's keys fill the model and agree with
   the YAML's.
2. The recipes run as shipped, only the folder, the data and the sizes set with --set:
   configs/hf_pretrained.yaml (model.pretrained alone) trains 3 steps from a tiny Llama folder
   on uint32 token files that `trainer tokenize` writes with the folder's tokenizer.json;
   configs/qwen3_lora_chat.yaml trains 3 LoRA steps from a tiny Qwen 3 folder (tokenizer.json
   with ChatML's tokens, Qwen 3's published tokenizer_config.json) on a JSONL chat file;
   configs/llama3_8b_qlora.yaml trains 3 QLoRA steps (an NF4 base) from a tiny Llama folder on
   that chat file; configs/llama2_70b_lora_mlperf.yaml trains 3 LoRA steps on Parquet token rows
   in the Hub's layout its comment gives. Each writes a checkpoint; the loss is finite.
Exits 77 (skipped) when transformers or tokenizers is not installed.
"""
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = [f"Note {i}: the {w} runs {i % 7} times before the {v} sleeps.\n"
        for i in range(300) for w, v in [("fox", "dog"), ("cat", "owl")]]
SMALL = ["--set", "data.workers=0", "--set", "run.threads=2", "--set", "run.progress=never",
         "--set", "train.max_steps=3", "--set", "train.epochs=1", "--set", "run.log_every=1",
         "--set", "run.eval_every=3", "--set", "run.checkpoint_every=3",
         "--set", "launch.nproc_per_node=1", "--set", "dist.strategy=ddp",
         "--set", "model.checkpointing=none"]


def tokenizer(folder):
    """A byte-level BPE that `tokenizers` trains on TEXT, ChatML's tokens special, into `folder`;
    its vocabulary size."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(folder, "tokenizer.json"))
    return tok.get_vocab_size()


def hf_folder(path, kind, vocab=512):
    """A tiny random Hugging Face folder of `kind` (llama or qwen3) with a tokenizer."""
    os.makedirs(path, exist_ok=True)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                  eos_token_id=SPECIAL.index("<|im_end|>"))
    torch.manual_seed(0)
    if kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, tie_word_embeddings=True, **common))
    else:
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **common))
    model.save_pretrained(path, safe_serialization=True)
    tokenizer(path)
    template = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                            "chat_templates", "qwen3.json")
    shutil.copy(template, os.path.join(path, "tokenizer_config.json"))
    return path


def run(args, what, failures, cwd=None):
    r = subprocess.run(args, capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        failures.append(f"{what}: exit {r.returncode}: {(r.stderr or r.stdout)[-1500:]}")
    return r


def check_resolve(trainer, repo, folders, failures):
    files = sorted(glob.glob(os.path.join(repo, "configs", "*.yaml")) +
                   glob.glob(os.path.join(repo, "configs", "bench", "*.yaml")))
    for path in files:
        name = os.path.relpath(path, repo)
        with open(path) as f:
            pretrained = "pretrained:" in f.read()
        args = [trainer, "--config", path, "--print-config"]
        if pretrained:
            kind = "qwen3" if os.path.basename(path).startswith("qwen3") else "llama"
            args += ["--set", f"model.pretrained={folders[kind]}"]
        r = subprocess.run(args, capture_output=True, text=True)
        errors = [line for line in r.stderr.splitlines() if line.strip()]
        if r.returncode == 2 and errors and all("CUDA" in e for e in errors) and \
                not torch.cuda.is_available():
            # float16 autocast needs a GPU: the rest of the config must still resolve.
            args += ["--set", "amp.dtype=bfloat16"]
            r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"{name} --print-config: exit {r.returncode}: {r.stderr[-1500:]}")
        if r.returncode == 0 and pretrained and "name: llama" not in r.stdout:
            failures.append(f"{name}: the folder did not make the model llama")
    print(f"{len(files)} configs resolve")


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r["loss"] for r in records if r.get("split") == "train"]


def check_trained(name, run_dir, failures):
    got = losses(run_dir) if os.path.exists(os.path.join(run_dir, "metrics.jsonl")) else []
    ckpts = glob.glob(os.path.join(run_dir, "checkpoints", "step_*.safetensors"))
    if len(got) != 3 or not all(math.isfinite(x) for x in got) or not ckpts:
        failures.append(f"{name}: losses {got}, checkpoints {ckpts}")
    else:
        print(f"{name}: 3 steps, loss {got[0]:.4f} -> {got[-1]:.4f}")


def train_hf_pretrained(trainer, repo, work, folder, failures):
    data = os.path.join(work, "my_text")
    os.makedirs(data)
    text = os.path.join(work, "text.txt")
    with open(text, "w") as f:
        f.write("".join(TEXT))
    for split in ("train", "val"):
        run([trainer, "tokenize", "--tokenizer", folder, "--format", "uint32", "--out",
             os.path.join(data, f"{split}.bin"), text], f"tokenize {split}", failures)
    run_dir = os.path.join(work, "run_hf")
    run([trainer, "--config", os.path.join(repo, "configs", "hf_pretrained.yaml"),
         "--run-dir", run_dir, "--set", f"model.pretrained={folder}", "--set",
         f"data.root={data}", "--set", "data.seq_len=32", "--set", "data.batch_size=2", *SMALL],
        "hf_pretrained.yaml", failures)
    check_trained("configs/hf_pretrained.yaml", run_dir, failures)


def train_qwen3_lora_chat(trainer, repo, work, folder, failures):
    chat = os.path.join(work, "chat.jsonl")
    with open(chat, "w") as f:
        for i in range(40):
            msgs = [{"role": "user", "content": f"How often does the fox run on day {i}?"},
                    {"role": "assistant", "content": f"The fox runs {i % 7} times."}]
            if i % 2:
                msgs.insert(0, {"role": "system", "content": "Be brief."})
            f.write(json.dumps({"messages": msgs}) + "\n")
    run_dir = os.path.join(work, "run_chat")
    run([trainer, "--config", os.path.join(repo, "configs", "qwen3_lora_chat.yaml"),
         "--run-dir", run_dir, "--set", f"model.pretrained={folder}", "--set",
         f"data.root={chat}", "--set", "data.seq_len=96", "--set", "data.batch_size=2",
         "--set", "data.val_fraction=0.1", *SMALL], "qwen3_lora_chat.yaml", failures)
    check_trained("configs/qwen3_lora_chat.yaml", run_dir, failures)


def train_llama3_qlora(trainer, repo, work, folder, failures):
    """configs/llama3_8b_qlora.yaml: 3 QLoRA steps (nf4 base) on the JSONL chat file."""
    run_dir = os.path.join(work, "run_qlora")
    run([trainer, "--config", os.path.join(repo, "configs", "llama3_8b_qlora.yaml"),
         "--run-dir", run_dir, "--set", f"model.pretrained={folder}", "--set",
         f"data.root={os.path.join(work, 'chat.jsonl')}", "--set", "data.seq_len=96", "--set",
         "data.batch_size=2", "--set", "data.val_fraction=0.1", "--set",
         "train.grad_accum_steps=1", *SMALL], "llama3_8b_qlora.yaml", failures)
    check_trained("configs/llama3_8b_qlora.yaml", run_dir, failures)


def train_mlperf_layout(trainer, repo, work, folder, failures):
    data = os.path.join(work, "govreport_mlperf")
    os.makedirs(os.path.join(data, "data"))
    g = np.random.default_rng(0)
    for split in ("train", "validation"):
        ids = g.integers(0, 512, size=(20, 64))  # rows of 64 ids, the first half a prompt
        labels = np.where(np.arange(64) < 32, -100, ids)
        rows = pa.table({"input_ids": ids.tolist(), "labels": labels.tolist(),
                         "attention_mask": np.ones_like(ids).tolist()})
        pq.write_table(rows, os.path.join(data, "data", f"{split}-00000-of-00001.parquet"))
    run_dir = os.path.join(work, "run_mlperf")
    run([trainer, "--config", os.path.join(repo, "configs", "llama2_70b_lora_mlperf.yaml"),
         "--run-dir", run_dir, "--set", f"model.pretrained={folder}", "--set",
         f"data.root={data}", "--set", "data.seq_len=64", *SMALL],
        "llama2_70b_lora_mlperf.yaml", failures)
    check_trained("configs/llama2_70b_lora_mlperf.yaml", run_dir, failures)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: configs_check.py TRAINER REPO")
    trainer, repo = sys.argv[1], os.path.abspath(sys.argv[2])
    torch.set_num_threads(2)
    failures = []
    with tempfile.TemporaryDirectory() as work:
        folders = {k: hf_folder(os.path.join(work, k), k) for k in ("llama", "qwen3")}
        check_resolve(trainer, repo, folders, failures)
        train_hf_pretrained(trainer, repo, work, folders["llama"], failures)
        train_qwen3_lora_chat(trainer, repo, work, folders["qwen3"], failures)
        train_llama3_qlora(trainer, repo, work, folders["llama"], failures)
        train_mlperf_layout(trainer, repo, work, folders["llama"], failures)
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else "failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
