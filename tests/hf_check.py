#!/usr/bin/env python3
"""GPT-2 weights between the trainer and Hugging Face transformers, both ways (CTest
Interop.Gpt2WeightsMoveBetweenTrainerAndTransformers).

  hf_check.py TRAINER INTEROP_TOOL

1. A small random GPT2LMHeadModel, saved by save_pretrained, loaded by the trainer's gpt (the
   model.pretrained path: Conv1D weights transposed, the tied head): logits on the same tokens
   equal transformers' within 1e-4.
2. A gpt trained a few steps by the trainer, with and without biases (model.bias) and with an
   untied head (model.tie_embeddings: false), exported with `trainer export --format hf`:
   GPT2LMHeadModel.from_pretrained loads it with no missing or unexpected keys, and its logits
   equal the trainer's within 1e-4.
3. A GPT2LMHeadModel whose lm_head differs from wte (tie_word_embeddings: false): a tied gpt
   refuses it with exit 2 naming both tensors and model.tie_embeddings; an untied one loads it
   and computes transformers' logits.
4. The config.json beside the weights is read: an activation, layer-norm epsilon or head count
   gpt does not compute is refused naming the field; an export loads back as the same model
   (with model.bias: false too); another vocabulary's message names the file's tensor.
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


def untied_hf_to_trainer(trainer, tool, tokens, work):
    torch.manual_seed(2)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS,
                     tie_word_embeddings=False)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.05)
    assert not torch.equal(model.lm_head.weight, model.transformer.wte.weight)
    folder = os.path.join(work, "hf_untied")
    model.save_pretrained(folder, safe_serialization=True)
    weights = os.path.join(folder, "model.safetensors")
    assert "lm_head.weight" in load_file(weights)
    with torch.no_grad():
        theirs = model(tokens).logits
    args = [trainer, "--config", "configs/synthetic.yaml", "--set", "model.name=gpt",
            "--set", "data.name=synthetic_tokens", "--set", f"data.num_classes={VOCAB}",
            "--set", "train.max_steps=1", "--set", "run.progress=never",
            "--set", f"model.pretrained={weights}", "--run-dir", os.path.join(work, "untied_run")]
    for s in SIZES:
        args += ["--set", "model." + s]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 2 or "lm_head.weight" not in r.stderr or "model.tie_embeddings" not in r.stderr:
        sys.exit(f"a tied gpt loading an untied head: exit {r.returncode}, {r.stderr!r}")
    print("tied gpt refuses an untied head:", r.stderr.strip().splitlines()[-1])
    ours = trainer_logits(tool, weights, tokens, work, ["tie_embeddings=false"])
    compare("transformers (untied) -> trainer", ours, theirs)
    # The same on 2 and 3 ranks: refused tied, trained untied (the head stays the file's, not wte).
    at = args.index("--run-dir")
    base = args[1:at] + args[at + 2:]  # the trainer's arguments without the run dir
    for ranks in (2, 3):
        launch = [trainer, "launch", "--standalone", "--nproc-per-node", str(ranks), "--"]
        r = subprocess.run(launch + base + ["--run-dir", os.path.join(work, f"tied{ranks}")],
                           capture_output=True, text=True)
        if r.returncode != 2 or "model.tie_embeddings" not in r.stderr:
            sys.exit(f"tied on {ranks} ranks: exit {r.returncode}, {r.stderr[-400:]!r}")
        run_dir = os.path.join(work, f"untied{ranks}")
        r = subprocess.run(launch + base + ["--set", "model.tie_embeddings=false",
                                                  "--set", "optim.lr=1e-6",
                                                  "--set", "data.batch_size=3",
                                                  "--run-dir", run_dir],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"untied on {ranks} ranks: exit {r.returncode}, {r.stderr[-400:]!r}")
        ckpt = load_file(os.path.join(run_dir, "checkpoints", "step_00000001.safetensors"))
        head, wte = ckpt["model.lm_head.weight"], ckpt["model.transformer.wte.weight"]
        expect = model.lm_head.weight.detach()
        if (head - expect).abs().max() > 1e-3 or (head - wte).abs().max() < 1e-2:
            sys.exit(f"untied on {ranks} ranks: the trained head is not the file's")
        print(f"untied head on {ranks} ranks: loaded and trained")


def pretrained_run(trainer, weights, work, name, extra=()):
    """A one-step gpt run initialised from `weights` (the model sizes of SIZES)."""
    args = [trainer, "--config", "configs/synthetic.yaml", "--set", "model.name=gpt",
            "--set", "data.name=synthetic_tokens", "--set", f"data.num_classes={VOCAB}",
            "--set", "train.max_steps=1", "--set", "run.progress=never",
            "--set", f"model.pretrained={weights}", "--run-dir", os.path.join(work, name)]
    for s in SIZES:
        args += ["--set", "model." + s]
    for e in extra:
        args += ["--set", e]
    return subprocess.run(args, capture_output=True, text=True)


def config_json_is_checked(trainer, work):
    """4. The config.json beside the weights: settings gpt does not compute are refused (exit 2,
    naming the field); the file save_pretrained writes for gpt's own architecture loads. A
    vocabulary the model does not have names the file's tensor, not lm_head.weight (which the
    file lacks), and offers no classifier hint."""
    torch.manual_seed(3)
    folder = os.path.join(work, "hf_cfg")
    GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=WIDTH, n_layer=LAYERS,
                               n_head=HEADS)).save_pretrained(folder, safe_serialization=True)
    weights = os.path.join(folder, "model.safetensors")
    r = pretrained_run(trainer, weights, work, "cfg_ok")
    if r.returncode != 0:
        sys.exit(f"save_pretrained's own config.json refused: {r.stderr}")
    with open(os.path.join(folder, "config.json")) as f:
        good = json.load(f)
    for field, value in (("activation_function", "relu"), ("layer_norm_epsilon", 1e-2),
                         ("n_head", HEADS * 2)):
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump({**good, field: value}, f)
        r = pretrained_run(trainer, weights, work, "cfg_" + field)
        if r.returncode != 2 or field not in r.stderr or "config.json" not in r.stderr:
            sys.exit(f"config.json with {field} {value}: exit {r.returncode}, {r.stderr!r}")
        print(f"config.json with {field}={value} refused:", r.stderr.strip().splitlines()[-1][:140])
    os.remove(os.path.join(folder, "config.json"))  # the weights alone: their shapes decide
    r = pretrained_run(trainer, weights, work, "cfg_vocab", ["model.vocab_size=64",
                                                             "data.num_classes=64"])
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    if r.returncode != 2 or "transformer.wte.weight" not in last or "lm_head.weight" in last \
            or "pretrained_skip_head" in last:
        sys.exit(f"a vocabulary of 64 against the file's {VOCAB}: exit {r.returncode}, {last!r}")
    print("another vocabulary:", last[:160])


def trainer_to_hf(trainer, tool, tokens, work, bias, tie="true"):
    run = os.path.join(work, f"run_{bias}_{tie}")
    common = ["--config", "configs/synthetic.yaml", "--set", "model.name=gpt",
              "--set", "data.name=synthetic_tokens", "--set", f"data.num_classes={VOCAB}",
              "--set", "train.max_steps=3", "--set", "run.progress=never",
              "--set", f"model.bias={bias}", "--set", "model.dropout=0",
              "--set", f"model.tie_embeddings={tie}"]
    for s in SIZES:
        common += ["--set", "model." + s]
    subprocess.run([trainer, *common, "--run-dir", run], check=True, capture_output=True)
    ckpt = os.path.join(run, "checkpoints", "step_00000003.safetensors")
    folder = os.path.join(work, f"export_{bias}_{tie}")
    subprocess.run([trainer, "export", "--checkpoint", ckpt, "--out", folder, "--format", "hf"],
                   check=True)
    plain = os.path.join(work, f"plain_{bias}_{tie}.safetensors")
    subprocess.run([trainer, "export", "--checkpoint", ckpt, "--out", plain], check=True)
    model, info = GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"from_pretrained(bias={bias}) reported {problems}")
    with open(os.path.join(folder, "config.json")) as f:
        hf_config = json.load(f)
    assert hf_config["n_head"] == HEADS
    assert hf_config["tie_word_embeddings"] == (tie == "true"), hf_config
    # No token id beyond the vocabulary: transformers' generate() runs on the export.
    assert hf_config["eos_token_id"] is None or hf_config["eos_token_id"] < VOCAB, hf_config
    generated = model.eval().generate(tokens[:, :4], max_new_tokens=3, do_sample=False,
                                      pad_token_id=0)
    assert generated.shape == (2, 7), generated.shape
    if tie == "false":
        assert not torch.equal(model.lm_head.weight, model.transformer.wte.weight)
    with torch.no_grad():
        theirs = model.eval()(tokens).logits
    ours = trainer_logits(tool, plain, tokens, work, [f"bias={bias}", f"tie_embeddings={tie}"])
    compare(f"trainer (bias={bias}, tie_embeddings={tie}) -> transformers", ours, theirs)
    # And back: the export initialises the same model (its zero biases left out without bias).
    r = pretrained_run(trainer, os.path.join(folder, "model.safetensors"), work,
                       f"back_{bias}_{tie}", [f"model.bias={bias}", f"model.tie_embeddings={tie}"])
    if r.returncode != 0:
        sys.exit(f"the export (bias={bias}, tie={tie}) does not load back: {r.stderr}")
    back = trainer_logits(tool, os.path.join(folder, "model.safetensors"), tokens, work,
                          [f"bias={bias}", f"tie_embeddings={tie}"])
    compare(f"export (bias={bias}) -> trainer", back, theirs)


def main():
    trainer, tool = sys.argv[1], sys.argv[2]
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as work:
        hf_to_trainer(tool, tokens, work)
        untied_hf_to_trainer(trainer, tool, tokens, work)
        config_json_is_checked(trainer, work)
        for bias in ("true", "false"):
            trainer_to_hf(trainer, tool, tokens, work, bias)
        trainer_to_hf(trainer, tool, tokens, work, "true", tie="false")
    print("OK")


if __name__ == "__main__":
    main()
