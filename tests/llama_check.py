#!/usr/bin/env python3
"""The trainer's llama against Hugging Face transformers (CTest Interop.LlamaEqualsTransformers).

  llama_check.py TRAINER INTEROP_TOOL

Four tiny random models that transformers builds here (no download), saved by save_pretrained
sharded over at least 3 safetensors files with their model.safetensors.index.json (a folder that
is not sharded so fails the check):
Llama 3.1-style (grouped-query attention 4:1, llama3 rope scaling, untied head), Llama 3.2-style
(tied head, llama3 scaling with factor 32), Qwen 2-style (q/k/v biases, eps 1e-6, theta 1e6) and
Qwen 3-style (per-head q/k RMSNorm, head_dim 32 != hidden / heads 16, tied head). Their weights are
redrawn so that no part is near the identity (biases, norm weights). For each:

1. Logits: interop_tool builds the trainer's llama from the keys below and loads the saved
   folder's shards as model.pretrained does (a tied model's folder has no lm_head.weight); its
   float32 logits of a
   [2, 64] token batch equal transformers' within 1e-5 relative (max |diff| / max |logit|). The
   Llama 3.1 model computed without its rope scaling misses that tolerance: the comparison sees
   the scaling.
2. Training: `trainer train` from the saved folder (model.pretrained, with the keys below, which
   config.json must agree with), 30 steps of full fine-tuning
   (AdamW with weight decay, clipping at 1.0, a constant learning rate) on four 64-token windows
   (data.mix of four one-window token folders: every batch holds all four), against a plain
   PyTorch loop over the transformers model on the same windows: every step's loss within 1e-4
   relative.

Exits 77 (skipped) when transformers or safetensors is not installed.
"""
import copy
import json
import os
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread

one_intra_op_thread()  # before torch is imported

try:
    import torch
    from window_runs import adamw_losses, randomize, relative, window_config, write_windows
    from safetensors.torch import load_file, save_file
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                              Qwen3Config, Qwen3ForCausalLM)
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

VOCAB, SEQ, STEPS, WINDOWS = 256, 64, 30, 4
LOGITS_TOL, LOSS_TOL = 1e-5, 1e-4
SHARDS = 3  # at least this many safetensors files per saved model
OPTIM = {"lr": 2e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
CLIP = 1.0
COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, max_position_embeddings=16384,
              attention_dropout=0.0)

CASES = {
    "llama3.1": (LlamaForCausalLM, LlamaConfig(
        hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=2,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        **COMMON)),
    "llama3.2": (LlamaForCausalLM, LlamaConfig(
        hidden_size=64, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        **COMMON)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(
        hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, **COMMON)),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(
        hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, **COMMON)),
}


def trainer_keys(cfg, model_type):
    """The trainer's llama keys for a transformers config."""
    keys = {
        "n_layer": cfg.num_hidden_layers, "n_head": cfg.num_attention_heads,
        "n_kv_head": cfg.num_key_value_heads, "n_embd": cfg.hidden_size,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "intermediate_size": cfg.intermediate_size, "block_size": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size, "rms_norm_eps": float(cfg.rms_norm_eps),
        "rope_theta": float(cfg.rope_theta), "qkv_bias": model_type == "qwen2",
        "qk_norm": model_type == "qwen3", "tie_embeddings": bool(cfg.tie_word_embeddings),
    }
    scaling = cfg.rope_scaling or {}
    if scaling.get("rope_type") == "llama3":
        keys.update(rope_scaling="llama3", rope_factor=float(scaling["factor"]),
                    rope_low_freq_factor=float(scaling["low_freq_factor"]),
                    rope_high_freq_factor=float(scaling["high_freq_factor"]),
                    rope_original_context=int(scaling["original_max_position_embeddings"]))
    return keys


def option_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else repr(value)  # floats keep their point: 8.0


def save_sharded(model, folder):
    """save_pretrained over at least SHARDS safetensors files; the weight_map of the index.
    Exits when the folder is not sharded so: the check is of a sharded folder."""
    total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    model.save_pretrained(folder, max_shard_size=total // (SHARDS + 1), safe_serialization=True)
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index) or os.path.exists(os.path.join(folder, "model.safetensors")):
        sys.exit(f"{folder}: save_pretrained did not shard (no index, or a model.safetensors)")
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    files = sorted(set(weight_map.values()))
    if len(files) < SHARDS or not all(os.path.exists(os.path.join(folder, f)) for f in files):
        sys.exit(f"{folder}: {len(files)} shards {files}, not at least {SHARDS}")
    stored = set()
    for f in files:
        stored |= set(load_file(os.path.join(folder, f)))
    if stored != set(weight_map):
        sys.exit(f"{folder}: the shards hold other tensors than the index lists")
    return weight_map


def build(name, work):
    """Case `name`: the transformers model with redrawn weights, saved sharded; (model, folder)."""
    cls, cfg = CASES[name]
    torch.manual_seed(sorted(CASES).index(name))
    model = cls(cfg).eval()
    randomize(model)
    folder = os.path.join(work, name)
    weight_map = save_sharded(model, folder)
    print(f"{name}: saved over {len(set(weight_map.values()))} safetensors files")
    tied = bool(cfg.tie_word_embeddings)
    if ("lm_head.weight" in weight_map) == tied:
        sys.exit(f"{name}: save_pretrained {'kept' if tied else 'dropped'} lm_head.weight")
    if model.model.config._attn_implementation != "sdpa":
        sys.exit(f"{name}: transformers chose {model.model.config._attn_implementation}, not sdpa")
    return model, folder


def trainer_logits(tool, saved, tokens, keys, work):
    x, out = os.path.join(work, "x.safetensors"), os.path.join(work, "logits.safetensors")
    save_file({"x": tokens}, x)
    options = [f"{k}={option_text(v)}" for k, v in keys.items()]
    r = subprocess.run([tool, "llama", str(VOCAB), saved, x, out, *options],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"interop_tool llama: exit {r.returncode}: {r.stderr}")
    return load_file(out)["logits"]


def check_logits(name, tool, model, saved, work, failures):
    keys = trainer_keys(model.config, model.config.model_type)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        theirs = model(tokens).logits  # [2, 64, V]
    ours = trainer_logits(tool, saved, tokens, keys, work)
    diff = relative(ours, theirs)
    print(f"{name}: logits relative max |diff| {diff:.3g}")
    if ours.shape != theirs.shape or not diff <= LOGITS_TOL:
        failures.append(f"{name}: logits {tuple(ours.shape)} differ from transformers' by {diff}")
    if keys.get("rope_scaling") == "llama3" and name == "llama3.1":
        unscaled = trainer_logits(tool, saved, tokens, {**keys, "rope_scaling": "none"}, work)
        missed = relative(unscaled, theirs)
        print(f"{name}: without the rope scaling {missed:.3g}")
        if not missed > LOGITS_TOL:
            failures.append(f"{name}: the logits do not depend on the rope scaling ({missed})")


def trainer_losses(trainer, name, saved, keys, folders, work):
    config = window_config({"name": "llama", "pretrained": saved, **keys}, folders, SEQ, STEPS,
                           OPTIM, CLIP)
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w") as f:
        json.dump(config, f)  # JSON is YAML
    run_dir = os.path.join(work, f"{name}_run")
    r = subprocess.run([trainer, "--config", path, "--run-dir", run_dir],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{name}: trainer exited {r.returncode}: {r.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [rec["loss"] for rec in records if rec.get("split") == "train"]


def torch_losses(model, windows):
    """The plain loop: AdamW with the trainer's parameter groups (1-D parameters without weight
    decay), clipping, a constant learning rate, every window in every batch."""
    model = copy.deepcopy(model).train()
    params = list(model.parameters())  # a tied weight once
    groups = [{"params": [p for p in params if p.dim() > 1]},
              {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
    return adamw_losses(model, groups, windows, STEPS, OPTIM, CLIP)[0]


def check_training(name, trainer, model, saved, folders, windows, work, failures):
    keys = trainer_keys(model.config, model.config.model_type)
    ours = trainer_losses(trainer, name, saved, keys, folders, work)
    theirs = torch_losses(model, windows)
    if len(ours) != STEPS:
        failures.append(f"{name}: the trainer logged {len(ours)} training steps, not {STEPS}")
        return
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    print(f"{name}: 30 steps, loss {theirs[0]:.4f} -> {theirs[-1]:.4f}, "
          f"worst relative step difference {worst:.3g}")
    if not theirs[-1] < 0.9 * theirs[0]:
        failures.append(f"{name}: the reference loop did not learn ({theirs[0]} -> {theirs[-1]})")
    for step, (a, b) in enumerate(zip(ours, theirs), 1):
        if not abs(a - b) <= LOSS_TOL * abs(b):
            failures.append(f"{name}: step {step}: trainer loss {a}, PyTorch loop {b}")
            break


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: llama_check.py TRAINER INTEROP_TOOL")
    trainer, tool = sys.argv[1:]
    torch.set_num_threads(1)
    failures = []
    with tempfile.TemporaryDirectory() as work:
        folders, windows = write_windows(work, VOCAB, SEQ, WINDOWS)
        for name in CASES:
            model, saved = build(name, work)
            check_logits(name, tool, model, saved, work, failures)
            check_training(name, trainer, model, saved, folders, windows, work, failures)
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else "failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
