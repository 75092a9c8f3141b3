"""What the PyTorch reference sides of the distributed benchmarks share (bench_ddp.py,
bench_fsdp.py, bench_tp.py): the GPT model/batch/optimizer flags, the timed loop and its step
statistics, the held-bytes and peak-RSS figures, the AdamW fused-or-foreach probe, writing the
JSON line, and the Gloo teardown.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from reference_models import GPT


def add_gpt_args(ap, batch_help):
    """The GPT model, batch, loop and optimizer flags (bench_fsdp.py's and bench_tp.py's)."""
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--bias", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--batch", type=int, default=8, help=batch_help)
    ap.add_argument("--seq", type=int, default=None, help="sequence length (default block size)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0, help="max grad norm (0 = none)")


def seq_len(ap, a):
    """--seq, defaulting to --block-size; an argparse error when it exceeds it."""
    seq = a.seq or a.block_size
    if seq > a.block_size:
        ap.error(f"--seq {seq} exceeds --block-size {a.block_size}")
    return seq


def gpt_json_args(a, seq):
    """The model/batch/loop/optimizer arguments as the JSON line reports them."""
    return {"vocab": a.vocab, "block_size": a.block_size, "n_layer": a.n_layer,
            "n_head": a.n_head, "n_embd": a.n_embd, "bias": a.bias, "batch": a.batch,
            "seq": seq, "threads": a.threads, "steps": a.steps, "warmup": a.warmup,
            "seed": a.seed, "lr": a.lr, "weight_decay": a.weight_decay, "clip": a.clip}


def build_gpt(a):
    """reference_models.GPT of the flags, dropout 0, after torch.manual_seed(seed)."""
    torch.manual_seed(a.seed)
    return GPT(vocab=a.vocab, block_size=a.block_size, n_layer=a.n_layer, n_head=a.n_head,
               C=a.n_embd, bias=a.bias, dropout=0.0)


def param_count_bytes(model):
    """(parameters, bytes) of the model's parameters, a tied one counted once."""
    params = list(model.parameters())
    return (sum(p.numel() for p in params),
            sum(p.numel() * p.element_size() for p in params))


def fixed_batch(a, seq, seed):
    """One batch torch.randint(vocab, (batch, seq + 1)) from a generator seeded `seed`:
    inputs x[:, :-1], targets x[:, 1:], [B, T] each."""
    g = torch.Generator()
    g.manual_seed(seed)
    data = torch.randint(a.vocab, (a.batch, seq + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


def adamw(groups, a, impl):
    """AdamW(lr, betas (0.9, 0.99), eps 1e-8) over the parameter groups; impl fused or foreach."""
    return torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.99), eps=1e-8, **{impl: True})


def probe_fused(m, make_optimizer, a, clip=None):
    """True when fused AdamW (make_optimizer(params, a, "fused")) steps the tiny module m, wrapped
    as the benchmark wraps its model, after a backward (and clip(params, 1.0) when given); every
    rank of an initialized process group picks the same answer."""
    ok = True
    try:
        params = list(m.parameters())
        opt = make_optimizer(params, a, "fused")
        m(torch.ones(2, 8)).sum().backward()
        if clip is not None:
            clip(params, 1.0)
        opt.step()
    except Exception as e:  # noqa: BLE001 - any failure means "use foreach"
        print(f"fused AdamW unavailable ({type(e).__name__}: {e}); using foreach",
              file=sys.stderr)
        ok = False
    if dist.is_initialized():
        flag = torch.tensor([int(ok)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank picks the same implementation
        ok = bool(flag.item())
    return ok


def timed_loop(step, warmup, steps, barrier):
    """`warmup` untimed steps, then (barrier: a dist.barrier()) perf_counter around each of
    `steps` steps. Returns (every step's result, warmup included; the timed steps' seconds;
    the whole timed loop's seconds)."""
    out = [step() for _ in range(warmup)]
    if barrier:
        dist.barrier()
    times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        s = time.perf_counter()
        out.append(step())
        times.append(time.perf_counter() - s)
    return out, times, time.perf_counter() - t0


def step_stats(times, seconds, steps, samples_per_step):
    """(median step ms, mean step ms, samples per second); None where there is nothing to divide."""
    return (1000 * statistics.median(times) if times else None,
            1000 * seconds / steps if steps else None,
            samples_per_step * steps / seconds if seconds > 0 else None)


def mean_over_ranks(losses, distributed):
    """The per-step losses stacked, averaged over the ranks with one all_reduce (distributed)."""
    mean = torch.stack(losses) if losses else torch.zeros(0)
    if distributed:
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    return mean


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def nbytes(t):
    t = local(t)
    return t.numel() * t.element_size()


def held_bytes(params, opt):
    """This rank's bytes of parameters, gradients and optimizer state (DTensors: local shards)."""
    state = {"params": sum(nbytes(p) for p in params),
             "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
             "optimizer": sum(nbytes(v) for s in opt.state.values() for v in s.values()
                              if torch.is_tensor(v))}
    state["total"] = sum(state.values())
    return state


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def gather(obj, world, distributed):
    """[obj of each rank] (all_gather_object), or [obj] without a process group."""
    if not distributed:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def emit(fields, path):
    """Prints the JSON line on stdout, and writes it to path too when one is given."""
    line = json.dumps(fields)
    print(line, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")


def finish(launched, status):
    """Ends the process. Under torchrun: destroy the process group, flush, and os._exit(status),
    skipping the interpreter's teardown, where Gloo's threads sometimes abort the process after
    the results are out ("terminate called without an active exception", about one run in three
    with DTensor here), which torchrun would report as a failure."""
    if not launched:
        sys.exit(status)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
