#!/usr/bin/env python3
"""GPT-2 weights between the trainer and Hugging Face transformers, both ways (CTest
Interop.Gpt2WeightsMoveBetweenTrainerAndTransformers).

  hf_check.py TRAINER INTEROP_TOOL

1. A small random GPT2LMHeadModel, saved by save_pretrained, loaded by the trainer's gpt (the
   model.pretrained path: Conv1D weights transposed, the tied head): logits on the same tokens
   equal transformers' within 1e-4.
2. A gpt trained a few steps by the trainer, with and without biases (model.bias), exported with
   `trainer export --format hf`: GPT2LMHeadModel.from_pretrained loads it with no missing or
   unexpected keys, and its logits equal the trainer's within 1e-4.
Exits 77 (skipped) when transformers or safetensors is not installed.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

VOCAB, CTX, WIDTH, LAYERS, HEADS = 50, 16, 32, 2, 2
SIZES = [f"n_layer={LAYERS}", f"n_head={HEADS}", f"n_embd={WIDTH}", f"block_size={CTX}",
         f"vocab_size={VOCAB}"]


def trainer_logits(tool, weights, tokens, work, extra=()):
    x = os.path.join(work, "x.safetensors")
    out = os.path.join(work, "logits.safetensors")
    save_file({"x": tokens}, x)
    subprocess.run([tool, "gpt", str(VOCAB), weights, x, out, *SIZES, *extra], check=True)
    return load_file(out)["logits"]


def compare(name, ours, theirs):
    diff = (ours - theirs).abs().max().item()
    print(f"{name}: max |diff| {diff:.3g}")
    if diff > 1e-4:
        sys.exit(f"{name}: logits differ by {diff}")


def hf_to_trainer(tool, tokens, work):
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS)
    model = GPT2LMHeadModel(cfg).eval()
    folder = os.path.join(work, "hf")
    model.save_pretrained(folder, safe_serialization=True)
    with torch.no_grad():
        theirs = model(tokens).logits
    ours = trainer_logits(tool, os.path.join(folder, "model.safetensors"), tokens, work)
    compare("transformers -> trainer", ours, theirs)


def trainer_to_hf(trainer, tool, tokens, work, bias):
    run = os.path.join(work, f"run_{bias}")
    common = ["--config", "configs/synthetic.yaml", "--set", "model.name=gpt",
              "--set", "data.name=synthetic_tokens", "--set", f"data.num_classes={VOCAB}",
              "--set", "train.max_steps=3", "--set", "run.progress=never",
              "--set", f"model.bias={bias}", "--set", "model.dropout=0"]
    for s in SIZES:
        common += ["--set", "model." + s]
    subprocess.run([trainer, *common, "--run-dir", run], check=True, capture_output=True)
    ckpt = os.path.join(run, "checkpoints", "step_00000003.safetensors")
    folder = os.path.join(work, f"export_{bias}")
    subprocess.run([trainer, "export", "--checkpoint", ckpt, "--out", folder, "--format", "hf"],
                   check=True)
    plain = os.path.join(work, f"plain_{bias}.safetensors")
    subprocess.run([trainer, "export", "--checkpoint", ckpt, "--out", plain], check=True)
    model, info = GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"from_pretrained(bias={bias}) reported {problems}")
    with open(os.path.join(folder, "config.json")) as f:
        assert json.load(f)["n_head"] == HEADS
    with torch.no_grad():
        theirs = model.eval()(tokens).logits
    ours = trainer_logits(tool, plain, tokens, work, [f"bias={bias}"])
    compare(f"trainer (bias={bias}) -> transformers", ours, theirs)


def main():
    trainer, tool = sys.argv[1], sys.argv[2]
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as work:
        hf_to_trainer(tool, tokens, work)
        for bias in ("true", "false"):
            trainer_to_hf(trainer, tool, tokens, work, bias)
    print("OK")


if __name__ == "__main__":
    main()
