#!/usr/bin/env python3
"""PyTorch reference side of the data-parallel benchmark (scripts/bench_ddp.sh).

Usage:
    torchrun --standalone --nproc-per-node N bench_ddp.py --model lenet|mlp
        [--batch N] [--steps N] [--warmup N] [--threads N] [--seed N] [--root DIR]
    bench_ddp.py --no-ddp --model lenet|mlp ...      (one process, the plain model)

Defaults: batch 64 per rank, steps 300, warmup 30, threads 1, seed 0,
root /usr/share/datasets/fashion-mnist. Rank 0 prints exactly one JSON line on stdout.

Models (the trainer's models/lenet.cpp and models/mlp.cpp with configs/fashion_mnist_*.yaml):
  lenet  conv5x5(1->32, pad 2), relu, maxpool2, conv5x5(32->64, pad 2), relu, maxpool2,
         flatten, linear(3136->128), relu, dropout, linear(128->10)        454,922 parameters
  mlp    flatten, [linear, relu, dropout] for hidden 256, 128, 100, linear(100->10)
                                                                           247,766 parameters
  Dropout is 0 by default (the shell script sets model.dropout=0 for the trainer too).

Data (as the trainer's fashion_mnist dataset and loader): the train IDX files (raw or .gz) read
once into a uint8 tensor [60000, 1, 28, 28]; every batch is x / 255 normalised with the training
set's mean and (population) std, computed exactly from a byte histogram. Each rank's epoch is a
DistributedSampler-style shard: randperm(n) seeded with seed + epoch, samples rank::world_size of
the first n // world_size * world_size (drop_last), cut into full batches in order. Batches are
gathered by index in the main process (no DataLoader workers).

Protocol: init_process_group("gloo") from torchrun's environment, DistributedDataParallel(model)
with default bucket settings (none with --no-ddp), SGD(lr 0.05, momentum 0.9), cross_entropy,
torch.set_num_threads(threads). `warmup` steps run untimed; then a barrier, and perf_counter
around the loop of `steps` steps (each step: make the batch, zero_grad(set_to_none), forward,
loss, backward, optimizer.step; per-step times are taken too). samples_per_sec is global:
world_size * batch * steps / seconds.
"""
import argparse
import json

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from bench_common import step_stats, timed_loop
from reference_models import DEFAULT_ROOT, Lenet, Mlp, load_train


def batches(n, batch, rank, world, seed):
    """Index tensors of this rank's batches, epoch after epoch, forever."""
    per_rank = n // world
    epoch = 0
    while True:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=g)[:per_rank * world]
        mine = order[rank::world]
        for i in range(0, per_rank - batch + 1, batch):
            yield mine[i:i + batch]
        epoch += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["lenet", "mlp"], required=True)
    ap.add_argument("--batch", type=int, default=64, help="samples per step and rank")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--root", default=DEFAULT_ROOT)
    ap.add_argument("--no-ddp", action="store_true", help="one process, the plain model")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    use_ddp = not a.no_ddp
    if use_ddp:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1

    images, labels, mean, std = load_train(a.root)
    scale, shift = 1.0 / (255.0 * std), -mean / std
    if a.model == "lenet":
        model = Lenet(in_shape=tuple(images.shape[1:]), dropout=a.dropout)
    else:
        model = Mlp(in_features=images[0].numel(), dropout=a.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    model.train()
    net = nn.parallel.DistributedDataParallel(model) if use_ddp else model
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    it = batches(images.shape[0], a.batch, rank, world, a.seed)

    def step():
        idx = next(it)
        x = images.index_select(0, idx).float().mul_(scale).add_(shift)  # [B, 1, 28, 28]
        y = labels.index_select(0, idx)  # [B]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    losses, times, seconds = timed_loop(step, a.warmup, a.steps, barrier=use_ddp)

    if rank == 0:
        step_ms, step_ms_mean, samples_per_sec = step_stats(times, seconds, a.steps,
                                                            world * a.batch)
        print(json.dumps({
            "impl": "python", "mode": "ddp" if use_ddp else "plain", "model": a.model,
            "world_size": world, "batch": a.batch, "threads": a.threads, "steps": a.steps,
            "warmup": a.warmup, "seconds": seconds, "step_ms": step_ms,
            "step_ms_mean": step_ms_mean, "samples_per_sec": samples_per_sec,
            "parameters": n_params, "loss": float(losses[-1]) if a.steps else None,
            "torch": torch.__version__,
        }), flush=True)
    if use_ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
