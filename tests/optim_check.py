#!/usr/bin/env python3
"""The trainer's optimizers against torch.optim on the same gradients (CTest: Optim.*).

  optim_check.py OPTIM_TOOL

For sgd (momentum, Nesterov, none), adam and adamw (with and without amsgrad, with weight decay
on the 2-D parameters only, as the trainer groups them), and adamw and sgd after gradient clipping: 50
steps on random gradients with a learning rate that changes every step, by each of the trainer's
implementations (optim.impl fused, foreach, loop) and by torch.optim with fused=True,
foreach=True and the single-tensor path (foreach=False). The parameters after the last step must
equal torch's within 1e-6 relative (the largest difference over the largest magnitude).
Clipping is torch.nn.utils.clip_grad_norm_(foreach=True) before each step. Exits 77 (skipped)
when torch or safetensors is not installed.
"""
import math
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import load_file, save_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

STEPS = 50
TOLERANCE = 1e-6
SHAPES = [(16, 8), (16,), (4, 16), (4,)]
# (name, torch class, trainer keys, torch keyword arguments, clip norm)
CASES = [
    ("sgd", torch.optim.SGD, {"momentum": "0.9", "weight_decay": "0.01"},
     {"momentum": 0.9, "weight_decay": 0.01}, 0.0),
    ("sgd", torch.optim.SGD, {"momentum": "0.9", "nesterov": "true", "weight_decay": "0.01"},
     {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}, 0.0),
    ("sgd", torch.optim.SGD, {"momentum": "0", "weight_decay": "0"}, {"momentum": 0.0}, 0.0),
    ("adam", torch.optim.Adam, {"weight_decay": "0.01", "betas": "0.8,0.99", "eps": "1e-6"},
     {"weight_decay": 0.01, "betas": (0.8, 0.99), "eps": 1e-6}, 0.0),
    ("adam", torch.optim.Adam, {"weight_decay": "0.01", "amsgrad": "true"},
     {"weight_decay": 0.01, "amsgrad": True}, 0.0),
    ("adamw", torch.optim.AdamW, {"weight_decay": "0.05"}, {"weight_decay": 0.05}, 0.0),
    ("adamw", torch.optim.AdamW, {"weight_decay": "0.05", "amsgrad": "true"},
     {"weight_decay": 0.05, "amsgrad": True}, 0.0),
    ("adamw", torch.optim.AdamW, {"weight_decay": "0.05"}, {"weight_decay": 0.05}, 0.5),
    ("sgd", torch.optim.SGD, {"momentum": "0.9", "weight_decay": "0.01"},
     {"momentum": 0.9, "weight_decay": 0.01}, 1.0),
]
IMPLS = [("fused", {"fused": True}), ("foreach", {"foreach": True}), ("loop", {"foreach": False})]


def torch_run(cls, kwargs, impl_kwargs, params, grads, lrs, clip):
    ps = [p.clone().requires_grad_(True) for p in params]
    decay = kwargs.get("weight_decay", 0.0)
    groups = [{"params": [p for p in ps if p.dim() > 1]},
              {"params": [p for p in ps if p.dim() <= 1], "weight_decay": 0.0}]
    opt = cls(groups, lr=lrs[0], **{**kwargs, "weight_decay": decay}, **impl_kwargs)
    for step, lr in enumerate(lrs):
        for p, g in zip(ps, grads[step]):
            p.grad = g.clone()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(ps, clip, foreach=True)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    return [p.detach() for p in ps]


def main():
    tool = sys.argv[1]
    torch.manual_seed(0)
    params = [torch.randn(s) for s in SHAPES]
    grads = [[torch.randn(s) * (1 + step % 3) for s in SHAPES] for step in range(STEPS)]
    lrs = [0.01 * (1.2 + math.sin(step)) for step in range(STEPS)]
    failures = []
    with tempfile.TemporaryDirectory(prefix="trainer_optim_") as tmp:
        data = {f"p.{i}": p for i, p in enumerate(params)}
        data.update({f"g.{t}.{i}": g for t, gs in enumerate(grads) for i, g in enumerate(gs)})
        data["lr"] = torch.tensor(lrs, dtype=torch.float64)
        inputs = os.path.join(tmp, "in.safetensors")
        save_file(data, inputs)
        for name, cls, keys, kwargs, clip in CASES:
            for impl, impl_kwargs in IMPLS:
                out = os.path.join(tmp, "out.safetensors")
                args = [tool, inputs, out, name, impl] + [f"{k}={v}" for k, v in keys.items()]
                if clip > 0:
                    args.append(f"clip={clip}")
                r = subprocess.run(args, capture_output=True, text=True)
                if r.returncode != 0:
                    failures.append(f"{name} {impl}: {r.stderr.strip()}")
                    continue
                ours = load_file(out)
                ref = torch_run(cls, kwargs, impl_kwargs, params, grads, lrs, clip)
                diff = max((ours[f"p.{i}"] - p).abs().max().item() for i, p in enumerate(ref))
                scale = max(p.abs().max().item() for p in ref)
                case = f"{name} {keys} clip {clip} {impl} vs torch {impl_kwargs}"
                print(f"{case}: max |diff| / max |p| = {diff / scale:.3g}")
                if not diff <= TOLERANCE * scale:
                    failures.append(f"{case}: {diff / scale:.3g}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
