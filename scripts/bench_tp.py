#!/usr/bin/env python3
"""PyTorch reference side of the tensor-parallel benchmark: GPT with DTensor TP on Gloo, CPU.

Usage:
    torchrun --standalone --nproc-per-node N bench_tp.py [--tp N]
        [--vocab N] [--block-size N] [--n-layer N] [--n-head N] [--n-embd N] [--bias|--no-bias]
        [--batch N] [--seq N] [--steps N] [--warmup N] [--threads N] [--seed N]
        [--lr F] [--weight-decay F] [--clip F] [--check] [--check-steps N] [--json FILE]
    python bench_tp.py --tp 1 ...      (single process, no parallelism: the held-bytes baseline)

Defaults: vocab 256, block size 128, 4 layers, 4 heads, n_embd 128, no biases, batch 8 per step
(every tensor-parallel rank sees the same batch), seq = block size, steps 20, warmup 5,
threads 1, seed 0, lr 1e-3, weight decay 0.1, clip 1.0 (0 = none), tp = the world size (the
only other value allowed is 1, in a single process). Rank 0 prints exactly one JSON line on
stdout (and writes it to --json FILE too).

Model: reference_models.GPT (the trainer's models/gpt.cpp: tied lm_head, GPT-2 init), dropout 0,
fp32. Every rank seeds torch.manual_seed(seed) before building it, so all ranks start equal.

Tensor parallelism (tp > 1): init_process_group("gloo"), a 1-D DeviceMesh of all ranks
(init_device_mesh("cpu", (tp,))) and torch.distributed.tensor.parallel.parallelize_module:
  per block   attn.c_attn ColwiseParallel, attn.c_proj RowwiseParallel,
              mlp.c_fc ColwiseParallel, mlp.c_proj RowwiseParallel (Megatron's MLP/attention)
  wte         RowwiseParallel(input_layouts=Replicate()): vocabulary-parallel embedding (each
              rank holds V/tp rows; the masked lookup's partial sums are all-reduced)
  lm_head     ColwiseParallel(output_layouts=Shard(-1), use_local_output=False): the logits
              stay sharded over the vocabulary, and F.cross_entropy runs (forward and backward)
              inside torch.distributed.tensor.parallel.loss_parallel(), so they are never gathered.
  wpe, the LayerNorms: plain replicated tensors, not DTensors (no SequenceParallel); their
              gradients are equal on every rank because the gradients into the replicated
              activations are all-reduced by the column-parallel layers' input conversion.
Fused q,k,v: c_attn's weight rows are q (C rows), k (C), v (C), each in head order. A plain
ColwiseParallel takes rank r's 3C/tp rows contiguously, which would hand a rank a mix of q and k
rows. This script PERMUTES THE ROWS before sharding (Megatron's interleaved layout, a fused
variant of torchtitan's separate wq/wk/wv ColwiseParallel): new row order [q_0 k_0 v_0 | q_1 k_1
v_1 | ...] with q_r the rows of rank r's n_head/tp heads, so the contiguous shard r is exactly its
heads' q, k and v. The attention forward (TPCausalSelfAttention) splits the local c_attn output
into three equal chunks and takes the head count from the local width (n_head / tp local heads);
c_proj's Shard(1) columns then line up with those heads. One fused matmul and one autograd input
per block for attention, as in the trainer's gpt. --check un-permutes to compare parameters.
Weight tie: wte (Shard(0) over the vocabulary) and lm_head (ColwiseParallel: Shard(0) over its
output rows = the vocabulary) have the same DTensor placement, so the tie is kept: after
parallelize_module, lm_head.weight is set back to the wte.weight DTensor Parameter (one
parameter, one gradient accumulated from both uses; "tied": true in the JSON).

Optimizer and clipping: AdamW(lr, betas (0.9, 0.99), eps 1e-8), weight decay on parameters with
dim >= 2 only, in separate parameter groups for DTensor and plain parameters (PyTorch's foreach and
fused kernels, and clip_grad_norm_, refuse lists that mix torch.Tensor and DTensor: "got mixed
torch.Tensor and DTensor"); fused=True when a probe step on a tiny module parallelized the same way
works, else foreach=True ("optimizer_impl"). Clipping: torch.nn.utils.get_total_norm over the
DTensor gradients (a Replicate DTensor: the local sums of squares all-reduced, a few bytes) and
over the plain ones, combined as sqrt(a^2 + b^2), then torch.nn.utils.clip_grads_with_norm_ on
each group -- what clip_grad_norm_ does, split in two because of the mixing.

Data: one fixed batch made before the loop, identical on every rank,
torch.randint(vocab, (batch, seq + 1)) from a generator seeded seed * 1000; inputs x[:, :-1],
targets x[:, 1:]; cross_entropy over the flattened logits. Each step: zero_grad (set_to_none),
forward, loss, backward, clipping, optimizer.step. `warmup` steps run untimed; then a barrier, and
perf_counter around each of the `steps` steps (no per-step barrier). Per-step losses ("losses",
warmup included; equal on every rank) are averaged over ranks with one all_reduce at the end.
steps_per_sec = steps / seconds; samples_per_sec = (world_size / tp) * batch * steps / seconds
(the data-parallel size is 1: every rank works on the same samples).

Held bytes: state_bytes_per_rank is the local bytes of parameters + gradients + optimizer state
after the last step (DTensor shards via to_local(); the tied weight once). Run --tp 1 for the
single-process figure to divide by.

Communication: comm_bytes_per_step(_by_kind, _by_phase) is measured over one untimed step (after
the timed ones) with a subclass of torch.distributed.tensor.debug.CommDebugMode. CommDebugMode
itself only counts calls (get_comm_counts(), given as "comm_counts_per_step"); the subclass also
adds up, for each collective it sees at the dispatcher (the _c10d_functional ops DTensor and
loss_parallel issue, and c10d's allreduce_ etc. from torch.distributed calls), the bytes of the
tensors passed, as the trainer counts them (src/distributed/process_group.cpp): all_reduce and
broadcast the buffer once, all_gather the gathered output, reduce_scatter the full input.
Analytic count ("analytic_comm_bytes_per_step"), tp > 1, batch B, sequence T, width C, L layers,
float32, each all-reduce's buffer counted once:
    forward   the embedding's all-reduce (B*T*C) + per layer 2 all-reduces of B*T*C (attention
              output, MLP output)
    backward  per layer 2 all-reduces of B*T*C (the gradients into the column-parallel layers'
              replicated inputs) + 1 for lm_head's input (B*T*C)
    loss      3 all-reduces of B*T values (max, target logit, sum of exponentials)
    total     4 * (B*T*C*(4L + 2) + 3*B*T)
Measured against it (PyTorch 2.11, 2 ranks): the activation all-reduces match it exactly
(forward 1 + 2L, backward 2L + 1, all all_reduce; no all_gather or reduce_scatter).
loss_parallel uses the same three B*T all-reduces in its forward (_log_softmax's max and sum of
exponentials, nll_loss's masked target-logit gather) and none in its backward (it fuses
log_softmax's and nll_loss's backward locally). The measured figure is larger only by the gradient
clipping's one all-reduce, which the analytic count leaves out: get_total_norm stacks the
per-tensor norms of the DTensor gradients (Partial) and all-reduces that vector, 4 bytes per
sharded parameter, 4 * (4L + 1) bytes ("comm_bytes_per_step_by_phase" shows it under "optimizer").

--check: runs --check-steps (5) steps with tensor parallelism and the same steps of the plain
model in this process (rank 0; the same seed, batch, optimizer implementation and clipping), prints
both losses per step, and the largest parameter difference after them (the full DTensors gathered,
c_attn un-permuted); the replicated parameters' spread over ranks too; rank 0 prints a JSON line
("match", "losses_tp", "losses_single", "rel_diff", ...; to --json FILE too). Exit status 1 when a
step's losses differ by more than 1e-5 relative.
"""
import argparse
import os
import sys
import warnings
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                               parallelize_module)

from bench_common import (add_gpt_args, adamw, build_gpt, emit, finish, fixed_batch, gather,
                          gpt_json_args, held_bytes, local, mean_over_ranks, param_count_bytes,
                          peak_rss, probe_fused, seq_len, step_stats, timed_loop)
from bench_reference import count_operators, no_phase
from reference_models import CausalSelfAttention

RTOL = 1e-5  # --check: the largest relative loss difference accepted


class TPCausalSelfAttention(CausalSelfAttention):
    """CausalSelfAttention over this rank's heads: c_attn's local output is [q_r k_r v_r] (rows
    permuted by permute_qkv), n_head / tp heads of C / n_head; c_proj is row-parallel."""

    def forward(self, x):  # x: [B, T, C], replicated
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).chunk(3, dim=2)  # [B, T, C/tp] each
        q, k, v = (t.reshape(B, T, -1, hs).transpose(1, 2) for t in (q, k, v))  # [B, nh/tp, T, hs]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, nh/tp, T, hs]
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))  # [B, T, C] after the all-reduce


def permute_qkv(t, tp, inverse=False):
    """c_attn rows [q; k; v] -> [q_0 k_0 v_0; q_1 k_1 v_1; ...] (q_r: rank r's heads), or back."""
    rows = t.shape[0]
    rest = t.shape[1:]
    if not inverse:
        return t.reshape(3, tp, rows // (3 * tp), *rest).transpose(0, 1).reshape(rows, *rest)
    return t.reshape(tp, 3, rows // (3 * tp), *rest).transpose(0, 1).reshape(rows, *rest)


def parallelize(model, mesh, tp):
    """Megatron-style tensor parallelism with DTensor over the 1-D mesh; keeps the weight tie."""
    with torch.no_grad():
        for blk in model.h:
            blk.attn.__class__ = TPCausalSelfAttention
            for p in blk.attn.c_attn.parameters():
                p.copy_(permute_qkv(p.detach().clone(), tp))
    for blk in model.h:
        parallelize_module(blk, mesh, {
            "attn.c_attn": ColwiseParallel(),
            "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(),
            "mlp.c_proj": RowwiseParallel(),
        })
    parallelize_module(model, mesh, {
        "wte": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    })
    # parallelize_module gave lm_head its own Parameter; both are Shard(0) over the vocabulary.
    w, h = model.wte.weight, model.lm_head.weight
    tied = (isinstance(w, DTensor) and isinstance(h, DTensor) and w.placements == h.placements
            and w.shape == h.shape and torch.equal(w.to_local(), h.to_local()))
    if tied:
        model.lm_head.weight = model.wte.weight
    return tied


def split_groups(params, weight_decay):
    """AdamW groups: decay on dim >= 2, and DTensor and plain parameters never in one group."""
    groups = []
    for decay in (True, False):
        for is_dt in (True, False):
            ps = [p for p in params
                  if (p.dim() >= 2) == decay and isinstance(p, DTensor) == is_dt]
            if ps:
                groups.append({"params": ps, "weight_decay": weight_decay if decay else 0.0})
    return groups


def make_optimizer(params, a, impl):
    return adamw(split_groups(params, a.weight_decay), a, impl)


def clip_grads(params, max_norm):
    """clip_grad_norm_ over a mix of DTensor and plain parameters (2-norm over all of them)."""
    groups = [[p for p in params if p.grad is not None and isinstance(p, DTensor) == is_dt]
              for is_dt in (True, False)]
    groups = [g for g in groups if g]
    norms = []
    for g in groups:
        n = torch.nn.utils.get_total_norm([p.grad for p in g])
        norms.append(n.full_tensor() if isinstance(n, DTensor) else n)
    total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    for g in groups:
        torch.nn.utils.clip_grads_with_norm_(g, max_norm, total)
    return total


def optimizer_impl(a, mesh):
    """"fused" when fused AdamW steps a tiny module parallelized the same way (DTensor params)
    with the same clipping, else "foreach"."""
    m = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16), nn.Linear(16, 8))
    if mesh is not None:
        parallelize_module(m, mesh, {"1": ColwiseParallel(), "2": RowwiseParallel()})
    return "fused" if probe_fused(m, make_optimizer, a, clip=clip_grads) else "foreach"


COMM_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "other")


def comm_kind(name):
    name = name.replace("allreduce", "all_reduce").replace("allgather", "all_gather")
    for kind in COMM_KINDS[:-1]:
        if kind in name:
            return kind
    return "other"


def tensors_in(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in tensors_in(e)]
    return []


class CommBytesMode(CommDebugMode):
    """CommDebugMode that also adds up the bytes of each collective, by kind and by phase
    (self.phase, set by mark()). Bytes as the trainer counts them: all_reduce / broadcast the
    buffer, all_gather the output, reduce_scatter the input."""

    def __init__(self):
        super().__init__()
        self.bytes = defaultdict(lambda: defaultdict(int))  # phase -> kind -> bytes
        self.calls = defaultdict(int)  # kind -> calls
        self.phase = "other"

    def __enter__(self):
        self.bytes.clear()
        self.calls.clear()
        return super().__enter__()

    def mark(self, name):
        mode = self

        class Phase:
            def __enter__(self):
                self.prev, mode.phase = mode.phase, name

            def __exit__(self, *exc):
                mode.phase = self.prev

        return Phase()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented:  # a DTensor op: it comes back here as local collectives
            return out
        from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops
        packet = func._overloadpacket
        if packet in self.comm_registry or packet in c10d_collective_ops:
            name = str(packet)
            if "wait" in name or "barrier" in name:
                return out
            kind = comm_kind(name)
            if kind == "all_gather":
                # functional: the result; c10d allgather ops: their first argument (the output)
                counted = tensors_in(out) if "_c10d_functional" in name else tensors_in(args[0])
            elif kind == "reduce_scatter" and "_c10d_functional" not in name:
                counted = tensors_in(args[1])  # c10d (output, input, ...): the input
            else:
                counted = tensors_in(args[0])
            self.bytes[self.phase][kind] += sum(t.numel() * t.element_size() for t in counted)
            self.calls[kind] += 1
        return out


def analytic_comm_bytes(a, seq, tp):
    if tp == 1:
        return 0
    bt = a.batch * seq
    return 4 * (bt * a.n_embd * (4 * a.n_layer + 2) + 3 * bt)


def build(a, mesh, tp):
    model = build_gpt(a)
    model.train()
    tied = True
    if tp > 1:
        tied = parallelize(model, mesh, tp)
    return model, tied


def make_step(model, params, opt, x, y, a, tp):
    loss_ctx = loss_parallel if tp > 1 else torch.enable_grad  # enable_grad: a no-op context

    def step(mark=no_phase):
        opt.zero_grad(set_to_none=True)
        with mark("forward"):
            logits = model(x)  # [B, T, vocab]; tp > 1: a DTensor, Shard(-1) over the vocabulary
            with loss_ctx():
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        with mark("backward"):
            with loss_ctx():
                loss.backward()
        with mark("optimizer"):
            if a.clip > 0:
                clip_grads(params, a.clip)
            opt.step()
        return local(loss.detach())

    return step


def full_params(model, tp):
    """name -> full parameter value (DTensors gathered, c_attn un-permuted)."""
    out = {}
    for name, p in model.named_parameters():
        v = p.detach().full_tensor() if isinstance(p, DTensor) else p.detach()
        if tp > 1 and ".c_attn." in name:
            v = permute_qkv(v, tp, inverse=True)
        out[name] = v
    return out


def check(a, seq, mesh, tp, rank, x, y):
    model, tied = build(a, mesh, tp)
    params = list(model.parameters())
    impl = optimizer_impl(a, mesh)
    step = make_step(model, params, make_optimizer(params, a, impl), x, y, a, tp)
    tp_losses = [float(step()) for _ in range(a.check_steps)]
    full = full_params(model, tp)  # collectives: every rank
    spread = 0.0
    if tp > 1:  # replicated (plain) parameters must be equal on every rank
        for p in params:
            if not isinstance(p, DTensor):
                hi, lo = p.detach().clone(), p.detach().clone()
                dist.all_reduce(hi, op=dist.ReduceOp.MAX)
                dist.all_reduce(lo, op=dist.ReduceOp.MIN)
                spread = max(spread, float((hi - lo).abs().max()))
    ok = True
    if rank == 0:
        ref, _ = build(a, None, 1)
        rparams = list(ref.parameters())
        rstep = make_step(ref, rparams, make_optimizer(rparams, a, impl), x, y, a, 1)
        ref_losses = [float(rstep()) for _ in range(a.check_steps)]
        rel = [abs(p - q) / max(abs(q), 1e-30) for p, q in zip(tp_losses, ref_losses)]
        ok = max(rel) <= RTOL
        param_diff = max(float((full[n] - r.detach()).abs().max())
                         for n, r in ref.named_parameters())
        print(f"bench_tp --check: tp {tp} vs one process, {a.check_steps} steps, optimizer "
              f"{impl}", file=sys.stderr)
        print("step  loss tp               loss single         rel diff", file=sys.stderr)
        for i, (p, q, r) in enumerate(zip(tp_losses, ref_losses, rel)):
            print(f"{i:4d}  {p:.10f}  {q:.10f}  {r:.2e}", file=sys.stderr)
        print(f"largest parameter difference after the steps {param_diff:.3e}; replicated "
              f"parameters' spread over ranks {spread:.3e}; "
              f"{'MATCH' if ok else 'MISMATCH'} (rtol {RTOL})", file=sys.stderr)
        emit({"impl": "python", "strategy": "tp", "check": True, "tp": tp, "tied": tied,
              "optimizer_impl": impl, "losses_tp": tp_losses, "losses_single": ref_losses,
              "rel_diff": rel, "rtol": RTOL, "max_param_diff": param_diff,
              "replicated_spread": spread, "match": ok}, a.json)
    flag = torch.tensor([int(ok)])
    if dist.is_initialized():
        dist.broadcast(flag, 0)
    return bool(flag.item())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_gpt_args(ap, "samples per step (the same on all ranks)")
    ap.add_argument("--tp", type=int, default=None,
                    help="tensor-parallel size: the world size (default), or 1 in one process")
    ap.add_argument("--check", action="store_true",
                    help="compare --check-steps losses with a single-process run and exit")
    ap.add_argument("--check-steps", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the JSON line to this file")
    a = ap.parse_args()
    seq = seq_len(ap, a)

    torch.set_num_threads(a.threads)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if launched:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if launched else 0
    world = dist.get_world_size() if launched else 1
    tp = a.tp if a.tp is not None else world
    if tp != world:
        ap.error(f"--tp {tp} must equal the world size {world} (run --tp 1 as one process)")
    for what, n in (("--n-head", a.n_head), ("--n-embd", a.n_embd), ("--vocab", a.vocab)):
        if n % tp:
            ap.error(f"{what} {n} is not divisible by --tp {tp}")
    mesh = None
    if tp > 1:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (tp,))

    x, y = fixed_batch(a, seq, a.seed * 1000)  # [B, T] each, the same batch on every rank

    if a.check:
        ok = check(a, seq, mesh, tp, rank, x, y)
        finish(launched, 0 if ok else 1)

    # Parameter count and bytes of the whole (unsharded) model, the tied weight once.
    whole = build_gpt(a)
    n_params, param_bytes = param_count_bytes(whole)
    del whole
    model, tied = build(a, mesh, tp)
    params = list(model.parameters())  # the tied weight once
    impl = optimizer_impl(a, mesh)
    opt = make_optimizer(params, a, impl)
    step = make_step(model, params, opt, x, y, a, tp)

    losses, times, seconds = timed_loop(step, a.warmup, a.steps, barrier=launched)
    # Bytes communicated in one untimed step, by kind and phase, and CommDebugMode's call counts.
    with warnings.catch_warnings(), CommBytesMode() as cm:
        # CommDebugMode's module tracker registers full backward hooks on modules whose inputs
        # (token ids) need no gradient; PyTorch warns about that, harmlessly.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        losses.append(step(cm.mark))
    by_phase = {ph: dict(kinds) for ph, kinds in cm.bytes.items()}
    by_kind = {k: sum(kinds.get(k, 0) for kinds in cm.bytes.values()) for k in COMM_KINDS}
    by_kind = {k: v for k, v in by_kind.items() if v or k != "other"}
    comm_counts = {str(k): v for k, v in cm.get_comm_counts().items()}
    # Top-level ATen operators and host reads per step, as `trainer bench` counts them (untimed).
    ops, syncs = count_operators(step, 3)

    mean_losses = mean_over_ranks(losses, launched)
    state = held_bytes(params, opt)
    rss = peak_rss()
    per_rank = gather(state, world, launched)
    rss_all = gather(rss, world, launched)

    if rank == 0:
        step_ms_median, step_ms_mean, samples_per_sec = step_stats(times, seconds, a.steps,
                                                                   (world // tp) * a.batch)
        emit({
            "impl": "python", "strategy": "tp" if tp > 1 else "single", "model": "gpt",
            "world_size": world, "tp": tp, **gpt_json_args(a, seq),
            "tied": tied, "qkv": "rows permuted per rank (fused c_attn)",
            "optimizer_impl": impl, "seconds": seconds,
            "step_ms_median": step_ms_median, "step_ms_mean": step_ms_mean,
            "steps_per_sec": a.steps / seconds if seconds > 0 else None,
            "samples_per_sec": samples_per_sec,
            "params": n_params, "param_bytes": param_bytes,
            "state_bytes_per_rank": per_rank,
            "comm_bytes_per_step": sum(by_kind.values()),
            "comm_bytes_per_step_by_kind": by_kind,
            "comm_bytes_per_step_by_phase": by_phase,
            "comm_calls_per_step_by_kind": dict(cm.calls),
            "comm_counts_per_step": comm_counts,
            "analytic_comm_bytes_per_step": analytic_comm_bytes(a, seq, tp),
            "peak_rss_bytes": rss, "peak_rss_bytes_per_rank": rss_all,
            "losses": [float(v) for v in mean_losses], "torch": torch.__version__,
            "ops_per_step": ops, "host_syncs_per_step": syncs,
        }, a.json)
    finish(launched, 0)


if __name__ == "__main__":
    main()
