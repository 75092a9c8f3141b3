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

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from bench_common import (add_gpt_args, adamw, build_gpt, emit, fixed_batch, gather,
                          gpt_json_args, held_bytes, mean_over_ranks, param_count_bytes,
                          peak_rss, probe_fused, seq_len, step_stats, timed_loop)
from bench_reference import count_operators, no_phase


def make_optimizer(params, a, impl):
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return adamw([{"params": decay, "weight_decay": a.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}], a, impl)


def probe_module(strategy):
    """A tiny module wrapped the same way (DTensor params for fsdp) for probe_fused."""
    m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    if strategy == "fsdp":
        fully_shard(m)
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_gpt_args(ap, "samples per step and rank")
    ap.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction,
                    default=True)
    ap.add_argument("--strategy", choices=["fsdp", "ddp"], default="fsdp")
    ap.add_argument("--json", default=None, help="also write the JSON line to this file")
    a = ap.parse_args()
    seq = seq_len(ap, a)

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    model = build_gpt(a)
    n_params, param_bytes = param_count_bytes(model)  # tied wte/lm_head counted once
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

    impl = "fused" if probe_fused(probe_module(a.strategy), make_optimizer, a) else "foreach"
    params = list(net.parameters())
    opt = make_optimizer(params, a, impl)

    x, y = fixed_batch(a, seq, a.seed * 1000 + rank)  # [B, T] each

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

    losses, times, seconds = timed_loop(step, a.warmup, a.steps, barrier=True)
    # Top-level ATen operators and host reads per step, as `trainer bench` counts them (untimed).
    ops, syncs = count_operators(step, 3)

    mean_losses = mean_over_ranks(losses, True)
    per_rank = gather(held_bytes(params, opt), world, True)
    rss = peak_rss()
    rss_all = gather(rss, world, True)

    if rank == 0:
        step_ms_median, step_ms_mean, samples_per_sec = step_stats(times, seconds, a.steps,
                                                                   world * a.batch)
        emit({
            "impl": "python", "strategy": a.strategy, "model": "gpt", "world_size": world,
            **gpt_json_args(a, seq),
            "reshard_after_forward": a.reshard_after_forward if a.strategy == "fsdp" else None,
            "optimizer_impl": impl, "seconds": seconds,
            "step_ms_median": step_ms_median, "step_ms_mean": step_ms_mean,
            "samples_per_sec": samples_per_sec,
            "params": n_params, "param_bytes": param_bytes, **comm,
            "state_bytes_per_rank": per_rank, "peak_rss_bytes": rss,
            "peak_rss_bytes_per_rank": rss_all,
            "losses": [float(v) for v in mean_losses], "torch": torch.__version__,
            "ops_per_step": ops, "host_syncs_per_step": syncs,
        }, a.json)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
