#!/usr/bin/env python3
"""PyTorch reference side of the FSDP benchmark: GPT trained with FSDP2 (or DDP) on Gloo, CPU.

Usage:
    torchrun --standalone --nproc-per-node N bench_fsdp.py [--strategy fsdp|ddp]
        [--vocab N] [--block-size N] [--n-layer N] [--n-head N] [--n-embd N] [--bias|--no-bias]
        [--batch N] [--seq N] [--steps N] [--warmup N] [--threads N] [--seed N]
        [--lr F] [--weight-decay F] [--clip F] [--reshard-after-forward|--no-reshard-after-forward]
        [--json FILE]

Defaults: vocab 256, block size 128, 4 layers, 4 heads, n_embd 128, no biases, batch 8 per rank,
seq = block size, steps 20, warmup 5, threads 1, seed 0, lr 1e-3, weight decay 0.1, clip 1.0
(0 = none), reshard after forward, strategy fsdp. Rank 0 prints exactly one JSON line on stdout
(and writes it to --json FILE too).

Model: reference_models.GPT (the trainer's models/gpt.cpp: tied lm_head, GPT-2 init), dropout 0,
fp32. Every rank seeds torch.manual_seed(seed) before building it, so all ranks start equal.

Protocol: init_process_group("gloo") from torchrun's environment, torch.set_num_threads(threads).
  fsdp  FSDP2, the torchtitan pattern: fully_shard(block, reshard_after_forward=...) for every
        transformer block, then fully_shard(model, ...) on the root; fp32, no MixedPrecisionPolicy.
  ddp   DistributedDataParallel(model) with default bucket settings, for comparison.
AdamW(lr, betas (0.9, 0.99), eps 1e-8), weight decay on parameters with dim >= 2 only; fused=True
when a probe step on a tiny module of the same kind (DTensor for fsdp) works, else foreach=True
("optimizer_impl" in the JSON). Data: one fixed batch per rank made before the loop,
torch.randint(vocab, (batch, seq + 1)) from a generator seeded seed * 1000 + rank; inputs
x[:, :-1], targets x[:, 1:]; cross_entropy over the flattened logits. Each step: zero_grad
(set_to_none), forward, loss, backward, clip_grad_norm_ (global; on DTensor grads with FSDP2),
optimizer.step. `warmup` steps run untimed; then a barrier, and perf_counter around each of the
`steps` steps (no per-step barrier). The per-step local losses are kept as detached tensors and
averaged over ranks with one all_reduce after the timed loop ("losses", warmup included).
samples_per_sec is global: world_size * batch * steps / seconds. state_bytes_per_rank is the
local bytes of parameters + gradients + optimizer state after the last step (DTensor shards via
to_local()); peak_rss_bytes is rank 0's ru_maxrss. comm_bytes_per_step_theoretical: fsdp
3 x parameter bytes with reshard after forward (all-gather forward, all-gather backward,
reduce-scatter), 2 x without; ddp 1 x parameter bytes ("allreduce_bytes", the payload all-reduced).
"""
import argparse
import json
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from bench_reference import count_operators, no_phase
from reference_models import GPT


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(t):
    t = local(t)
    return t.numel() * t.element_size()


def make_optimizer(params, a, impl):
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.99), eps=1e-8, **{impl: True})


def probe_fused(a, strategy):
    """True when fused AdamW steps a tiny module wrapped the same way (DTensor params for fsdp)."""
    m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    if strategy == "fsdp":
        fully_shard(m)
    ok = True
    try:
        opt = make_optimizer(list(m.parameters()), a, "fused")
        m(torch.ones(2, 8)).sum().backward()
        opt.step()
    except Exception as e:  # noqa: BLE001 - any failure means "use foreach"
        print(f"fused AdamW unavailable ({type(e).__name__}: {e}); using foreach",
              file=sys.stderr)
        ok = False
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank picks the same implementation
    return bool(flag.item())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--bias", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--batch", type=int, default=8, help="samples per step and rank")
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default block size)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="max grad norm (0 = none)")
    ap.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction,
                    default=True)
    ap.add_argument("--strategy", choices=["fsdp", "ddp"], default="fsdp")
    ap.add_argument("--json", default=None, help="also write the JSON line to this file")
    a = ap.parse_args()
    seq = a.seq or a.block_size
    if seq > a.block_size:
        ap.error(f"--seq {seq} exceeds --block-size {a.block_size}")

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(a.seed)
    model = GPT(vocab=a.vocab, block_size=a.block_size, n_layer=a.n_layer, n_head=a.n_head,
                C=a.n_embd, bias=a.bias, dropout=0.0)
    n_params = sum(p.numel() for p in model.parameters())  # tied wte/lm_head counted once
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.train()
    if a.strategy == "fsdp":
        for blk in model.h:
            fully_shard(blk, reshard_after_forward=a.reshard_after_forward)
        fully_shard(model, reshard_after_forward=a.reshard_after_forward)
        net = model
        comm = {"comm_bytes_per_step_theoretical":
                (3 if a.reshard_after_forward else 2) * param_bytes,
                "comm_kind": "allgather_fwd+allgather_bwd+reducescatter"
                if a.reshard_after_forward else "allgather_fwd+reducescatter"}
    else:
        net = nn.parallel.DistributedDataParallel(model)
        comm = {"comm_bytes_per_step_theoretical": param_bytes, "comm_kind": "allreduce_bytes"}

    impl = "fused" if probe_fused(a, a.strategy) else "foreach"
    params = list(net.parameters())
    opt = make_optimizer(params, a, impl)

    g = torch.Generator()
    g.manual_seed(a.seed * 1000 + rank)
    data = torch.randint(a.vocab, (a.batch, seq + 1), generator=g)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()  # [B, T] each

    def step(mark=no_phase):
        opt.zero_grad(set_to_none=True)
        with mark("forward"):
            logits = net(x)  # [B, T, vocab]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        with mark("backward"):
            loss.backward()
        with mark("optimizer"):
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(params, a.clip)
            opt.step()
        return loss.detach()

    losses = [step() for _ in range(a.warmup)]
    dist.barrier()
    times = []
    t0 = time.perf_counter()
    for _ in range(a.steps):
        s = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - s)
    seconds = time.perf_counter() - t0
    # Top-level ATen operators and host reads per step, as `trainer bench` counts them (untimed).
    ops, syncs = count_operators(step, 3)

    mean_losses = torch.stack(losses) if losses else torch.zeros(0)
    dist.all_reduce(mean_losses, op=dist.ReduceOp.AVG)
    state = {"params": sum(nbytes(p) for p in params),
             "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
             "optimizer": sum(nbytes(v) for s in opt.state.values() for v in s.values()
                              if torch.is_tensor(v))}
    state["total"] = sum(state.values())
    per_rank = [None] * world
    dist.all_gather_object(per_rank, state)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    rss_all = [None] * world
    dist.all_gather_object(rss_all, rss)

    if rank == 0:
        line = json.dumps({
            "impl": "python", "strategy": a.strategy, "model": "gpt", "world_size": world,
            "vocab": a.vocab, "block_size": a.block_size, "n_layer": a.n_layer,
            "n_head": a.n_head, "n_embd": a.n_embd, "bias": a.bias, "batch": a.batch,
            "seq": seq, "threads": a.threads, "steps": a.steps, "warmup": a.warmup,
            "seed": a.seed, "lr": a.lr, "weight_decay": a.weight_decay, "clip": a.clip,
            "reshard_after_forward": a.reshard_after_forward if a.strategy == "fsdp" else None,
            "optimizer_impl": impl, "seconds": seconds,
            "step_ms_median": 1000 * statistics.median(times) if times else None,
            "step_ms_mean": 1000 * seconds / a.steps if a.steps else None,
            "samples_per_sec": world * a.batch * a.steps / seconds if seconds > 0 else None,
            "params": n_params, "param_bytes": param_bytes, **comm,
            "state_bytes_per_rank": per_rank, "peak_rss_bytes": rss,
            "peak_rss_bytes_per_rank": rss_all,
            "losses": [float(v) for v in mean_losses], "torch": torch.__version__,
            "ops_per_step": ops, "host_syncs_per_step": syncs,
        })
        print(line, flush=True)
        if a.json:
            with open(a.json, "w") as f:
                f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
