#!/usr/bin/env python3
"""PyTorch's all-reduce bus bandwidth, measured as `trainer doctor --perf` measures it.

  python -m torch.distributed.run --standalone --nproc-per-node 2 \
      scripts/allreduce_reference.py [--bytes N] [--iters K] [--json FILE]

One float32 tensor of N bytes (default 64 MiB), one untimed all_reduce, then K timed (default 5);
the mean time of one, the slowest rank's; bus bandwidth with nccl-tests' formula,
algbw * 2 (n - 1) / n. Gloo on the CPU, NCCL on CUDA. Rank 0 prints (and writes) one JSON object.
"""
import argparse
import json
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bytes", type=int, default=64 << 20)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", dist.get_rank() % torch.cuda.device_count()) if cuda else "cpu"
    x = torch.ones(a.bytes // 4, dtype=torch.float32, device=device)
    dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(a.iters):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = torch.tensor([(time.perf_counter() - start) / a.iters], dtype=torch.float64,
                           device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    n = dist.get_world_size()
    busbw = a.bytes / seconds.item() / 1e9 * 2 * (n - 1) / n
    if dist.get_rank() == 0:
        out = {"bytes": a.bytes, "seconds": seconds.item(), "busbw_gbps": busbw, "ranks": n,
               "backend": dist.get_backend(), "torch": torch.__version__}
        print(json.dumps(out))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
