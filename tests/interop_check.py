#!/usr/bin/env python3
"""Weights move between trainer and PyTorch by name (CTest: Interop.*).

  interop_check.py TRAINER INTEROP_TOOL SOURCE_DIR

For resnet18, resnet50 and vit (a small one: 2 blocks of 2 heads, 32 wide, 16x16 patches, as
torchvision.models.VisionTransformer builds it):
  trainer -> torchvision: a short trainer run, `trainer export` of its checkpoint, loaded with
      torchvision.models.<arch>().load_state_dict(safetensors.torch.load_file(...)) (strict); its
      logits on a fixed input equal the trainer model's (interop_tool) within 1e-4.
  torchvision -> trainer: torchvision's random initialisation saved with safetensors, loaded by
      interop_tool and by `trainer --dry-run --set model.pretrained=...`; same logits.
Exits 77 (skipped) when torch, torchvision or safetensors is not installed.
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    import torchvision
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

TOLERANCE = 1e-4

# The small ViT: trainer's model keys and torchvision.models.VisionTransformer's arguments.
VIT = {"patch_size": 16, "embed_dim": 32, "depth": 2, "num_heads": 2}


def torchvision_model(arch):
    if arch == "vit":
        return torchvision.models.VisionTransformer(
            image_size=64, patch_size=VIT["patch_size"], num_layers=VIT["depth"],
            num_heads=VIT["num_heads"], hidden_dim=VIT["embed_dim"],
            mlp_dim=4 * VIT["embed_dim"], num_classes=10)
    return getattr(torchvision.models, arch)(num_classes=10)


def model_keys(arch):
    """The model section's own keys of `arch`, as YAML and as interop_tool's KEY=N arguments."""
    keys = VIT if arch == "vit" else {}
    return "".join(f", {k}: {v}" for k, v in keys.items()), [f"{k}={v}" for k, v in keys.items()]


def run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r


def main():
    trainer, tool, source = sys.argv[1:4]
    failures = []
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="trainer_interop_") as tmp:
        x = torch.randn(2, 3, 64, 64)
        x_path = os.path.join(tmp, "x.safetensors")
        save_file({"x": x}, x_path)
        for arch in ("resnet18", "resnet50", "vit"):
            yaml_keys, tool_keys = model_keys(arch)
            # trainer -> torchvision
            run_dir = os.path.join(tmp, arch)
            cfg = os.path.join(tmp, arch + ".yaml")
            with open(cfg, "w") as f:
                f.write(
                    f"model: {{name: {arch}, num_classes: 10{yaml_keys}}}\n"
                    "data: {name: synthetic, shape: [3, 64, 64], num_classes: 10, "
                    "train_samples: 16, val_samples: 4, batch_size: 8, workers: 0}\n"
                    "train: {max_steps: 2}\noptim: {name: sgd, lr: 0.01}\n"
                    "run: {progress: never, tensorboard: false}\n")
            run([trainer, "--config", cfg, "--run-dir", run_dir], source)
            exported = os.path.join(tmp, arch + "_trainer.safetensors")
            ckpt = os.path.join(run_dir, "checkpoints", "step_00000002.safetensors")
            run([trainer, "export", "--checkpoint", ckpt, "--out", exported], source)
            ours = os.path.join(tmp, arch + "_ours_logits.safetensors")
            run([tool, arch, "10", exported, x_path, ours] + tool_keys, source)
            model = torchvision_model(arch)
            model.load_state_dict(load_file(exported), strict=True)
            with torch.no_grad():
                theirs = model.eval()(x)
            diff = (theirs - load_file(ours)["logits"]).abs().max().item()
            print(f"{arch} trainer -> torchvision: max |logit diff| {diff:.3g}")
            if not diff <= TOLERANCE:
                failures.append(f"{arch} trainer -> torchvision: {diff}")

            # torchvision -> trainer
            model = torchvision_model(arch).eval()
            weights = os.path.join(tmp, arch + "_torchvision.safetensors")
            save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
            with torch.no_grad():
                theirs = model(x)
            ours = os.path.join(tmp, arch + "_tv_logits.safetensors")
            run([tool, arch, "10", weights, x_path, ours] + tool_keys, source)
            diff = (theirs - load_file(ours)["logits"]).abs().max().item()
            print(f"{arch} torchvision -> trainer: max |logit diff| {diff:.3g}")
            if not diff <= TOLERANCE:
                failures.append(f"{arch} torchvision -> trainer: {diff}")
            run([trainer, "--config", cfg, "--dry-run", "--set", f"model.pretrained={weights}"],
                source)
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
