"""What the llama and LoRA checks (tests/llama_check.py, tests/lora_check.py) share: random
weights for a transformers model, token windows written as `tokens` folders, the trainer's config
that trains on every window in every batch, and the plain PyTorch AdamW loop it is compared with."""
import os

import numpy as np
import torch
import torch.nn.functional as F


def relative(ours, theirs):
    """The largest |ours - theirs| relative to the largest |theirs|."""
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


def randomize(model):
    """Weights of `model` away from their init: norms U(0.7, 1.3), biases N(0, 0.2), the rest
    N(0, 0.08)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.7, 1.3)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.2)
            else:
                p.normal_(0.0, 0.08)


def write_windows(work, vocab, seq, count):
    """`count` one-window token folders (train.bin and val.bin, seq + 1 uint16 tokens each);
    returns (folders, windows [count, seq + 1])."""
    g = torch.Generator().manual_seed(11)
    windows = torch.randint(0, vocab, (count, seq + 1), generator=g)
    folders = []
    for i, w in enumerate(windows):
        folder = os.path.join(work, f"window{i}")
        os.makedirs(folder, exist_ok=True)
        for split in ("train.bin", "val.bin"):
            w.numpy().astype(np.uint16).tofile(os.path.join(folder, split))
        folders.append(folder)
    return folders, windows


def window_config(model, folders, seq, steps, optim, clip, stop=0, checkpoint_every=0):
    """The trainer's config (a dict: JSON is YAML) training `model` on every window of `folders`
    in every batch (data.mix of one-window token sets), AdamW `optim`, clipping, a constant rate,
    every step logged."""
    return {
        "seed": 0,
        "model": model,
        "data": {"name": "mix", "batch_size": len(folders), "workers": 0,
                 "mix": [{"name": "tokens", "root": f, "seq_len": seq, "weight": 1}
                         for f in folders]},
        "train": {"max_steps": steps, "clip_grad_norm": clip, "eval_at_end": False,
                  "stop_at_step": stop},
        "optim": {"name": "adamw", **optim},
        "sched": {"name": "constant"},
        "run": {"log_every": 1, "eval_every": 10 * steps,
                "checkpoint_every": checkpoint_every or 10 * steps, "progress": "never",
                "tensorboard": False, "threads": 1},
    }


def adamw_losses(model, groups, windows, steps, optim, clip):
    """The plain loop over `model` (a transformers causal LM in training mode): torch.optim.AdamW
    over `groups`, clipping, a constant rate, every window in every batch. Returns (losses, opt)."""
    params = [p for g in groups for p in g["params"]]
    opt = torch.optim.AdamW(groups, lr=optim["lr"], betas=tuple(optim["betas"]), eps=optim["eps"],
                            weight_decay=optim["weight_decay"])
    x, y = windows[:, :-1], windows[:, 1:]
    losses = []
    for _ in range(steps):
        logits = model(x).logits  # [B, SEQ, V]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, opt
