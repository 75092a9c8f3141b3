#!/usr/bin/env python3
"""PyTorch reference side of the activation-checkpointing benchmark.

Usage:
    bench_checkpointing.py --model resnet50|gpt --checkpointing none|blocks
        [--batch N] [--steps N] [--warmup N] [--threads N]
        [--block-size N] [--n-layer N]

Defaults: batch 32 (resnet50) / 8 (gpt), steps 3, warmup 1, threads 2,
block-size 1024, n-layer 12 (gpt only). Prints exactly one JSON line on stdout.

Models:
  resnet50  torchvision resnet50(num_classes=1000), input randn(B,3,224,224).
            "blocks": every Bottleneck of layer1..4 runs through
            torch.utils.checkpoint.checkpoint(use_reentrant=False); the stem,
            avgpool and fc are not checkpointed.
  gpt       nanoGPT-style GPT-2 (n_embd 768, 12 heads, vocab 50257, tied
            lm_head, dropout 0, GPT-2 init), input randint(0,V,(B,T)).
            "blocks": every transformer block is checkpointed.

Protocol (mirrored by the C++ side):
  manual_seed(0); set_num_threads(threads); train mode; SGD(lr=0.01, momentum=0.9).
  A step = zero_grad(set_to_none=True); cross_entropy(model(x), y).backward();
  optimizer.step(). `warmup` steps run untimed. For each timed step, zero_grad
  is called outside the timed region, then: rss_before = /proc/self/statm[1] *
  page size; write "5" to /proc/self/clear_refs to reset VmHWM ("peak_reset"
  records success); time forward + backward + optimizer.step() with
  perf_counter; step_peak_bytes = VmHWM (from /proc/self/status) * 1024 -
  rss_before. No gc.collect() is called.
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from reference_models import GPT


def resnet_forward(m, x, ckpt):
    """Mirror of torchvision ResNet._forward_impl with optional per-Bottleneck checkpointing."""
    x = m.maxpool(m.relu(m.bn1(m.conv1(x))))
    for layer in (m.layer1, m.layer2, m.layer3, m.layer4):
        for blk in layer:
            x = checkpoint(blk, x, use_reentrant=False) if ckpt else blk(x)
    return m.fc(torch.flatten(m.avgpool(x), 1))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def vm_hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found in /proc/self/status")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["resnet50", "gpt"], required=True)
    ap.add_argument("--checkpointing", choices=["none", "blocks"], required=True)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--n-layer", type=int, default=12)
    a = ap.parse_args()
    B = a.batch or (32 if a.model == "resnet50" else 8)
    ckpt = a.checkpointing == "blocks"

    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    if a.model == "resnet50":
        import torchvision
        model = torchvision.models.resnet50(num_classes=1000)
        fwd = lambda inp: resnet_forward(model, inp, ckpt)
        x = torch.randn(B, 3, 224, 224)
        y = torch.randint(0, 1000, (B,))
        T = None
    else:
        T = a.block_size
        model = GPT(block_size=T, n_layer=a.n_layer, ckpt=ckpt)
        fwd = model
        x = torch.randint(0, 50257, (B, T))
        y = torch.randint(0, 50257, (B, T))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def run_step():  # forward + backward + optimizer.step (zero_grad done by caller)
        logits = fwd(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    for _ in range(a.warmup):
        opt.zero_grad(set_to_none=True)
        run_step()

    times, peaks, rss_before, peak_ok, loss = [], [], 0, True, None
    for _ in range(a.steps):
        opt.zero_grad(set_to_none=True)
        rss_before = rss_bytes()
        peak_ok = reset_peak() and peak_ok
        t0 = time.perf_counter()
        loss = run_step()
        times.append(time.perf_counter() - t0)
        peaks.append(vm_hwm_bytes() - rss_before)

    params = {id(p): p for p in model.parameters()}.values()  # unique (tied wte/lm_head once)
    print(json.dumps({
        "impl": "python", "model": a.model, "checkpointing": a.checkpointing,
        "batch": B, "threads": a.threads, "block_size": T, "steps": a.steps,
        "step_s": times, "step_s_median": statistics.median(times) if times else None,
        "rss_before_mb": rss_before / 1e6,
        "step_peak_mb": max(peaks) / 1e6 if peaks else None,
        "params_mb": sum(p.numel() for p in params) * 4 / 1e6,
        "loss": float(loss) if loss is not None else None,
        "torch": torch.__version__, "peak_reset": peak_ok,
    }))


if __name__ == "__main__":
    main()
