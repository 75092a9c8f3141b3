#!/usr/bin/env python3
"""PyTorch reference side of `trainer bench`: the same config's training steps in plain PyTorch.

Usage:
    bench_reference.py --config FILE [--set KEY.PATH=VALUE]... [--steps N] [--warmup N]
        [--json FILE] [--compile] [--fixed-batch] [--device auto|cpu|cuda|cuda:N]
    torchrun --standalone --nproc-per-node N bench_reference.py --config FILE ...   (DDP)

Run it with the project's .venv/bin/python. Defaults: --steps 50, --warmup 10, the device from
the config (`device`, auto: CUDA when available). Prints a summary on stdout; --json FILE writes
the JSON object of the shared bench spec (the same fields as `trainer bench --json`). Under
torchrun every rank trains with DistributedDataParallel (gloo on the CPU, nccl on CUDA, or
dist.backend), rank 0 prints and writes. Exit codes: 0 success, 1 runtime failure, 2 a usage or
configuration problem (one line each), 3 --compile was given and torch.compile failed.

Config: the trainer's YAML (src/config/config.h): a `base:` chain (paths relative to the file
naming them; mappings merge key by key, anything else replaces), then --set overrides, values
parsed as YAML (1e-3 is a float, as for the trainer); keys left out take the trainer's defaults.
Keys are not checked here: `trainer --dry-run --config FILE` reports unknown or invalid ones.
Supported: models mlp, lenet (Mlp/Lenet of reference_models.py), resnet18/34/50/101/152
(torchvision's; `model.stem: cifar` replaces conv1 by a 3x3 stride-1 convolution and the max-pool
by Identity, as models/resnet.cpp does), gpt (reference_models.GPT) and llama (transformers'
LlamaForCausalLM, Qwen2ForCausalLM with model.qkv_bias, Qwen3ForCausalLM with model.qk_norm, sdpa
attention, called with use_cache=False as training code does; with model.lora.rank > 0 PEFT's
get_peft_model of it, the optimizer over the adapters; model.lora.base_quant nf4 or int8:
bitsandbytes' Linear4bit (nf4, double quantization) or Linear8bitLt for every linear layer but
lm_head, as transformers' replace_with_bnb_linear makes them, quantized when the model moves to
the GPU); datasets fashion_mnist
(the IDX files of data.root, a Dataset that normalises each sample, in a DataLoader),
synthetic (random images or vectors of data.shape with random labels, generated once into a
TensorDataset) and synthetic_tokens (data.train_samples random windows of seq_len + 1 token ids
below data.num_classes; inputs the first seq_len, targets the last; seq_len = data.seq_len or
model.block_size). Every DataLoader has batch_size, shuffle, drop_last, num_workers = data.workers,
prefetch_factor = data.prefetch and persistent workers; under DDP a DistributedSampler.
Optimizers sgd, adam, adamw with the trainer's parameter groups (1-D parameters without weight
decay when optim.weight_decay > 0, unless optim.decay_bias_and_norm), cross-entropy with
train.label_smoothing, train.grad_accum_steps (DDP no_sync on all but the last micro-batch),
train.clip_grad_norm, amp (torch.autocast in amp.dtype, a GradScaler for float16 or
amp.scaler: on), model.channels_last for ResNets and lenet, dist.sync_bn. The learning rate
stays at optim.lr: the schedule is not applied. Not supported (exit 2): model.checkpointing, data
augmentation (data.crop_padding, data.hflip), other datasets and losses.

Protocol: torch.manual_seed(seed); torch.set_flush_denormal(run.flush_denormal) on the CPU (the
trainer's default flushes denormal floats to zero); torch.set_num_threads(run.threads) when > 0;
train mode.
One step = for each micro-batch: next batch, forward, backward; then the optimizer. `warmup`
steps run untimed, then `steps` timed steps. Phases (mean ms per step, rank 0):
  data       time blocked in next() on the DataLoader iterator (a new epoch's iterator included)
  forward    host->device copy (non_blocking), channels_last conversion, forward and loss
  backward   loss.backward() (scaled by the GradScaler when there is one). Under DDP the
             gradient all-reduce runs inside it, overlapped with the backward computation.
  grad_sync  0: PyTorch DDP waits for its all-reduce inside loss.backward(), so that time is
             part of `backward` and cannot be taken apart from outside
  optimizer  unscale and clip (when clipping), optimizer step, scaler update,
             zero_grad(set_to_none=True)
On the CPU phases are host time (time.perf_counter). On CUDA they are torch.cuda.Event pairs
recorded between the phases, read after one synchronize at the end. samples_per_sec =
world_size * batch * accum * steps / wall seconds of the timed steps (perf_counter; on CUDA
synchronised before and after). peak_memory_mb: CUDA max_memory_allocated over the timed steps,
or this process's peak RSS (getrusage ru_maxrss, DataLoader worker processes not included).
flops_per_step: torch.utils.flop_counter.FlopCounterMode over one forward of one batch, times 3
and times grad_accum_steps; the CPU's attention kernel (_scaled_dot_product_flash_attention_for_cpu,
which FlopCounterMode has no formula for) is counted with its SDPA formula (4*B*H*L*S*E).
peak_tflops: best of 5 timed n x n matmuls after 2 untimed (n = 8192 on CUDA, 1024 on the CPU) in
the amp dtype or float32. --compile runs torch.compile(model) (impl "pytorch-compile"; the mode
from --compile-mode, default torch.compile's default); the
compilation happens in the first step, which is a warm-up step when --warmup > 0.
--fixed-batch trains every step on the first batch (grad_accum_steps batches), moved to the device
once, as `trainer bench --fixed-batch`: the step's speed without the data loader.
"""
import argparse
import contextlib
import copy
import json
import math
import os
import platform
import re
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import yaml
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset
from torch.utils.flop_counter import (FlopCounterMode, flop_registry, register_flop_formula,
                                      sdpa_flop_count)

from reference_models import DEFAULT_ROOT, GPT, Lenet, Mlp, load_train

# The trainer's defaults (src/config/config.h) for the keys this script reads.
DEFAULTS = {
    "seed": 0,
    "device": "auto",
    "run": {"threads": 0, "flush_denormal": True},
    "model": {
        "name": "mlp", "num_classes": 0, "checkpointing": "none", "hidden": [256, 128],
        "channels": [32, 64], "kernel_size": 5, "fc_hidden": 128, "dropout": 0.0,
        "activation": "relu", "in_channels": 0, "stem": "imagenet", "zero_init_residual": False,
        "channels_last": False, "n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024,
        "vocab_size": 50257, "bias": True, "tie_embeddings": True, "n_kv_head": 0, "head_dim": 0,
        "intermediate_size": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_scaling": "none", "rope_factor": 8.0, "rope_low_freq_factor": 1.0,
        "rope_high_freq_factor": 4.0, "rope_original_context": 8192, "qkv_bias": False,
        "qk_norm": False,
        "lora": {"rank": 0, "alpha": 8.0, "dropout": 0.0, "targets": [], "rslora": False,
                 "base_dtype": "float32", "base_quant": "none"},
    },
    "data": {
        "name": "synthetic", "root": "", "batch_size": 128, "workers": 2, "prefetch": 2,
        "shuffle": True, "drop_last": True, "normalize": True, "shape": [1, 28, 28],
        "num_classes": 10, "train_samples": 2048, "mean": [], "std": [], "crop_padding": 0,
        "hflip": 0.0, "seq_len": 0,
    },
    "train": {"grad_accum_steps": 1, "clip_grad_norm": 0.0, "label_smoothing": 0.0,
              "loss": "cross_entropy"},
    "optim": {"name": "sgd", "impl": "auto", "lr": 0.1, "momentum": 0.9, "nesterov": False,
              "weight_decay": 0.0, "decay_bias_and_norm": False, "betas": [0.9, 0.999],
              "eps": 1e-8, "amsgrad": False},
    "amp": {"enabled": False, "dtype": "bfloat16", "scaler": "auto", "init_scale": 65536.0,
            "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000},
    "dist": {"backend": "auto", "bucket_cap_mb": 25.0, "find_unused_parameters": False,
             "broadcast_buffers": True, "sync_bn": False},
}
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
DATASETS = ("fashion_mnist", "synthetic", "synthetic_tokens")


class ConfigLoader(yaml.SafeLoader):
    """YAML 1.2 numbers: `1e-3` is a float (PyYAML's YAML 1.1 rules make it a string)."""


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$"),
    list("-+0123456789."))


class ConfigError(Exception):
    pass


def merge(into, over):
    """Merges mapping `over` into `into` in place: mappings key by key, other values replace."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def load_yaml(path, chain=()):
    """The file's mapping over its `base:` chain."""
    if path in chain:
        raise ConfigError(f"{path}: base cycle: {' -> '.join(chain + (path,))}")
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=ConfigLoader)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: {e}".replace("\n", " ")) from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level")
    base = data.pop("base", None)
    if base is None:
        return data
    base_path = os.path.normpath(os.path.join(os.path.dirname(path), str(base)))
    return merge(load_yaml(base_path, chain + (path,)), data)


def load_config(path, overrides):
    cfg = merge(copy.deepcopy(DEFAULTS), load_yaml(path))
    for arg in overrides:
        key, eq, text = arg.partition("=")
        parts = key.strip().split(".")
        if not eq or not all(parts):
            raise ConfigError(f"--set {arg}: expected KEY.PATH=VALUE, e.g. --set optim.lr=0.01")
        node = cfg
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {arg}: {part} is not a section")
        node[parts[-1]] = yaml.load(text, Loader=ConfigLoader)
    return cfg


def check_supported(cfg):
    """One line per setting this script cannot reproduce."""
    problems = []
    m, d, t = cfg["model"], cfg["data"], cfg["train"]
    if m["name"] not in ("mlp", "lenet", "gpt", "llama") + RESNETS:
        problems.append(f"model.name: {m['name']} is not supported")
    if m["name"] == "llama" and m["qkv_bias"] and m["qk_norm"]:
        problems.append("model.qkv_bias with model.qk_norm: no transformers model has both")
    if m["checkpointing"] != "none":
        problems.append("model.checkpointing: only none is supported")
    if d["name"] not in DATASETS:
        problems.append(f"data.name: {d['name']} is not supported; "
                        f"use one of {', '.join(DATASETS)}")
    if d["crop_padding"] or d["hflip"]:
        problems.append("data.crop_padding, data.hflip: augmentation is not supported")
    if t["loss"] != "cross_entropy":
        problems.append(f"train.loss: {t['loss']} is not supported")
    if cfg["optim"]["name"] not in ("sgd", "adam", "adamw"):
        problems.append(f"optim.name: {cfg['optim']['name']} is not supported")
    return problems


class NormalizedImages(Dataset):
    """uint8 images [N, C, H, W] and labels; a sample is (x / 255 - mean) / std as float32."""

    def __init__(self, images, labels, mean, std, normalize):
        self.images, self.labels = images, labels
        self.mean, self.std, self.normalize = mean, std, normalize

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.images[i].float().div_(255.0)  # [C, H, W]
        if self.normalize:
            x = (x - self.mean) / self.std
        return x, self.labels[i]


class TokenWindows(Dataset):
    """Token windows [N, T + 1]; a sample is (window[:-1], window[1:])."""

    def __init__(self, windows):
        self.windows = windows

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        w = self.windows[i]
        return w[:-1], w[1:]


def make_dataset(cfg):
    """(dataset, sample shape, number of classes, sequence length or None)."""
    d = cfg["data"]
    if d["name"] == "fashion_mnist":
        images, labels, mean, std = load_train(d["root"] or DEFAULT_ROOT)
        c = images.shape[1]
        mean_t = torch.tensor(d["mean"] or [mean] * c).view(c, 1, 1)
        std_t = torch.tensor(d["std"] or [std] * c).view(c, 1, 1)
        ds = NormalizedImages(images, labels, mean_t, std_t, d["normalize"])
        return ds, list(images.shape[1:]), 10, None
    g = torch.Generator().manual_seed(cfg["seed"])
    n, classes = d["train_samples"], d["num_classes"]
    if d["name"] == "synthetic":
        x = torch.randn([n] + list(d["shape"]), generator=g)
        y = torch.randint(0, classes, (n,), generator=g)
        return TensorDataset(x, y), list(d["shape"]), classes, None
    seq_len = d["seq_len"] or cfg["model"]["block_size"]
    windows = torch.randint(0, classes, (n, seq_len + 1), generator=g)
    return TokenWindows(windows), [seq_len], classes, seq_len


def make_loader(cfg, dataset, world, rank, pin):
    d = cfg["data"]
    sampler = None
    if world > 1:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=d["shuffle"],
                                     seed=cfg["seed"], drop_last=d["drop_last"])
    workers = d["workers"]
    loader = DataLoader(dataset, batch_size=d["batch_size"],
                        shuffle=d["shuffle"] if sampler is None else None, sampler=sampler,
                        num_workers=workers, persistent_workers=workers > 0,
                        prefetch_factor=d["prefetch"] if workers > 0 else None,
                        drop_last=d["drop_last"], pin_memory=pin,
                        generator=torch.Generator().manual_seed(cfg["seed"]))
    if len(loader) == 0:
        raise ConfigError(f"data.batch_size: {d['batch_size']} is larger than this process's "
                          f"share of the {len(dataset)} training samples")
    return loader, sampler


def batches(loader, sampler):
    """The loader's batches, epoch after epoch, forever."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def make_model(cfg, sample_shape, data_classes):
    m = cfg["model"]
    classes = m["num_classes"] or data_classes
    if m["name"] == "mlp":
        return Mlp(m["hidden"], classes, math.prod(sample_shape), m["dropout"], m["activation"])
    if m["name"] == "lenet":
        return Lenet(tuple(m["channels"]), m["kernel_size"], m["fc_hidden"], classes,
                     tuple(sample_shape), m["dropout"], m["activation"])
    if m["name"] == "llama":
        net = HfCausalLM(m, m["vocab_size"] or data_classes)
        if m["lora"]["rank"] > 0:
            net.lm = with_lora(net.lm, m["lora"])
        return net
    if m["name"] == "gpt":
        return GPT(vocab=m["vocab_size"] or data_classes, block_size=m["block_size"],
                   n_layer=m["n_layer"], n_head=m["n_head"], C=m["n_embd"], bias=m["bias"],
                   dropout=m["dropout"])
    import torchvision
    net = getattr(torchvision.models, m["name"])(num_classes=classes,
                                                 zero_init_residual=m["zero_init_residual"])
    cifar = m["stem"] == "cifar"
    in_channels = m["in_channels"] or sample_shape[0]
    if cifar or in_channels != 3:
        kernel, stride = (3, 1) if cifar else (7, 2)
        net.conv1 = nn.Conv2d(in_channels, 64, kernel, stride, kernel // 2, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    if cifar:
        net.maxpool = nn.Identity()
    return net


def make_optimizer(cfg, model):
    o = cfg["optim"]
    params = [p for p in model.parameters() if p.requires_grad]  # a tied weight once
    if o["weight_decay"] > 0 and not o["decay_bias_and_norm"]:
        groups = [{"params": [p for p in params if p.dim() > 1]},
                  {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
    else:
        groups = [{"params": params}]
    # optim.impl: auto and fused take PyTorch's fused kernels (fused=True), foreach its
    # multi-tensor path, loop the single-tensor one.
    impl = {"auto": {"fused": True}, "fused": {"fused": True}, "foreach": {"foreach": True},
            "loop": {"foreach": False}}[o["impl"]]
    if o["name"] == "sgd":
        return torch.optim.SGD(groups, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                               weight_decay=o["weight_decay"], **impl)
    cls = torch.optim.Adam if o["name"] == "adam" else torch.optim.AdamW
    return cls(groups, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
               weight_decay=o["weight_decay"], amsgrad=o["amsgrad"], **impl)


def with_lora(lm, lora):
    """PEFT's LoRA model of transformers' `lm` (model.lora): get_peft_model with the trainer's
    rank, alpha, dropout, targets (none: PEFT's default for the model) and rslora; the frozen base
    cast to model.lora.base_dtype, the adapters float32."""
    from peft import LoraConfig, get_peft_model
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[lora["base_dtype"]]
    if lora.get("base_quant", "none") != "none":
        quantize_linears(lm, lora["base_quant"], dtype)
    config = LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                        target_modules=lora["targets"] or None, use_rslora=lora["rslora"],
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(lm, config)
    for p in peft_model.parameters():
        if not p.requires_grad and p.is_floating_point():
            p.data = p.data.to(dtype)
    return peft_model


def quantize_linears(lm, kind, dtype):
    """model.lora.base_quant: every nn.Linear of `lm` but lm_head replaced by bitsandbytes'
    Linear4bit (nf4, double quantization, computing in `dtype`) or Linear8bitLt (int8 rows)
    holding its weight; bitsandbytes quantizes them when the model moves to the GPU."""
    import bitsandbytes as bnb
    for module in list(lm.modules()):
        for name, child in list(module.named_children()):
            if type(child) is not nn.Linear or name == "lm_head":
                continue
            bias = child.bias is not None
            if kind == "nf4":
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=bias,
                                      compute_dtype=dtype, compress_statistics=True,
                                      quant_type="nf4")
                q.weight = bnb.nn.Params4bit(child.weight.data.to(dtype), requires_grad=False,
                                             quant_type="nf4", compress_statistics=True)
            else:
                q = bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=bias,
                                        has_fp16_weights=False, threshold=0.0)
                q.weight = bnb.nn.Int8Params(child.weight.data.to(torch.float16),
                                             requires_grad=False, has_fp16_weights=False)
            if bias:
                q.bias = nn.Parameter(child.bias.data.to(dtype), requires_grad=False)
            setattr(module, name, q)


class HfCausalLM(nn.Module):
    """transformers' model of the trainer's llama keys `m`: token ids [B, T] -> logits [B, T, V]."""

    def __init__(self, m, vocab):
        super().__init__()
        import transformers
        kind = "Qwen3" if m["qk_norm"] else "Qwen2" if m["qkv_bias"] else "Llama"
        heads = m["n_head"]
        rope = None
        if m["rope_scaling"] == "llama3":
            rope = {"rope_type": "llama3", "factor": m["rope_factor"],
                    "low_freq_factor": m["rope_low_freq_factor"],
                    "high_freq_factor": m["rope_high_freq_factor"],
                    "original_max_position_embeddings": m["rope_original_context"]}
        config = getattr(transformers, kind + "Config")(
            vocab_size=vocab, hidden_size=m["n_embd"], intermediate_size=m["intermediate_size"],
            num_hidden_layers=m["n_layer"], num_attention_heads=heads,
            num_key_value_heads=m["n_kv_head"] or heads,
            head_dim=m["head_dim"] or m["n_embd"] // heads,
            max_position_embeddings=m["block_size"], rms_norm_eps=m["rms_norm_eps"],
            rope_theta=m["rope_theta"], rope_scaling=rope,
            tie_word_embeddings=m["tie_embeddings"], attn_implementation="sdpa")
        self.lm = getattr(transformers, kind + "ForCausalLM")(config)

    def forward(self, idx):
        return self.lm(input_ids=idx, use_cache=False).logits


PHASE = "phase:"  # the record_function ranges step() marks its phases with when counting


def count_operators(step, steps):
    """Top-level ATen operators per step by phase, and host reads per step, over `steps` calls of
    step(mark): what `trainer bench` counts with its RecordFunction observer. An operator is
    top-level when no ATen operator encloses it (autograd's backward functions do not count as
    enclosing); it belongs to the phase range that encloses it in time, `other` outside them. Host
    reads are top-level aten::item / aten::_local_scalar_dense calls."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        for _ in range(steps):
            step(record_phase)
    events = list(prof.events())
    ranges = [(e.time_range.start, e.time_range.end, e.name[len(PHASE):])
              for e in events if e.name.startswith(PHASE)]

    def phase_of(e):
        for start, end, name in ranges:
            if start <= e.time_range.start <= end:
                return name
        return "other"

    def top_level(e):
        parent = e.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::"):
                return False
            parent = parent.cpu_parent
        return True

    counts = {"forward": 0, "backward": 0, "optimizer": 0, "other": 0}
    syncs = 0
    for e in events:
        if e.scope != 0 or not e.name.startswith("aten::") or not top_level(e):
            continue
        counts[phase_of(e)] += 1
        syncs += e.name in ("aten::item", "aten::_local_scalar_dense")
    per_step = {k: v / steps for k, v in counts.items()}
    per_step["total"] = sum(counts.values()) / steps
    return per_step, syncs / steps


def profile_steps(step, steps, folder, rank, cuda):
    """`steps` more steps under torch.profiler (CPU and CUDA activity), their Chrome trace in
    folder/pytorch[_rank<N>].trace.json and the operators by self CPU time, then the kernels by
    device time, printed."""
    from torch.profiler import ProfilerActivity, profile
    os.makedirs(folder, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step(record_phase)
        if cuda:
            torch.cuda.synchronize()
    name = "pytorch.trace.json" if rank == 0 else f"pytorch_rank{rank}.trace.json"
    prof.export_chrome_trace(os.path.join(folder, name))
    if rank == 0:
        averages = prof.key_averages()
        print(f"profile: {os.path.join(folder, name)} ({steps} steps)")
        print(averages.table(sort_by="self_cpu_time_total", row_limit=25))
        if cuda:
            print(averages.table(sort_by="self_device_time_total", row_limit=25))


def record_phase(name):
    return torch.profiler.record_function(PHASE + name)


def no_phase(name):
    return contextlib.nullcontext()


def cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(model, x, autocast):
    """FLOPs of one forward of `x` as FlopCounterMode counts them (train mode, no graph)."""
    cpu_sdpa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    if cpu_sdpa not in flop_registry:
        register_flop_formula(cpu_sdpa)(cpu_sdpa_flop)
    with torch.no_grad(), autocast(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def matmul_peak_tflops(device, dtype):
    """Best of 5 timed n x n matmuls after 2 untimed, in TFLOP/s."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        a @ b
    best = math.inf
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e12


class HostClock:
    def mark(self):
        return time.perf_counter()

    @staticmethod
    def ms(a, b):
        return (b - a) * 1e3


class CudaClock:
    def mark(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    @staticmethod
    def ms(a, b):
        return a.elapsed_time(b)


def percentile(values, q):
    """Linear interpolation between the closest ranks (numpy's default)."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile's mode with --compile: default, reduce-overhead, "
                         "max-autotune, max-autotune-no-cudagraphs")
    ap.add_argument("--fixed-batch", action="store_true")
    ap.add_argument("--profile", metavar="DIR",
                    help="after the timed steps, record 3 more with torch.profiler into "
                         "DIR/pytorch.trace.json and print the operators by self time")
    ap.add_argument("--device")
    ap.add_argument("--counted", type=int, default=3,
                    help="steps after the timed ones whose operators are counted")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    return a


def fail(code, message):
    print(f"bench_reference.py: {message}", file=sys.stderr)
    sys.exit(code)


def init_device(want, backend):
    """(device, ddp, world size, rank); joins torchrun's process group when launched by it."""
    ddp = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(want)
    if device.type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank if ddp else (device.index or 0))
        torch.cuda.set_device(device)
    if ddp:
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return device, ddp, world, rank


def phase_means(timed, accum, ms):
    """Mean ms per step of each phase, from each step's marks: start, (data, forward, backward)
    per micro-batch, end."""
    phases = {"data": 0.0, "forward": 0.0, "backward": 0.0, "grad_sync": 0.0, "optimizer": 0.0}
    for mk in timed:
        prev = mk[0]
        for j in range(accum):
            dm, fm, bm = mk[1 + 3 * j:4 + 3 * j]
            phases["data"] += ms(prev, dm)
            phases["forward"] += ms(dm, fm)
            phases["backward"] += ms(fm, bm)
            prev = bm
        phases["optimizer"] += ms(prev, mk[-1])
    return {k: v / len(timed) for k, v in phases.items()}


def main():
    args = parse_args()
    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as e:
        fail(2, str(e))
    problems = check_supported(cfg)
    if problems:
        fail(2, "\n".join(f"{args.config}: {p}" for p in problems))

    device, ddp, world, rank = init_device(args.device or cfg["device"], cfg["dist"]["backend"])
    torch.manual_seed(cfg["seed"])
    if device.type == "cpu":
        torch.set_flush_denormal(bool(cfg["run"]["flush_denormal"]))
    if cfg["run"]["threads"] > 0:
        torch.set_num_threads(cfg["run"]["threads"])
    m, d, t, a = cfg["model"], cfg["data"], cfg["train"], cfg["amp"]
    try:
        dataset, sample_shape, classes, seq_len = make_dataset(cfg)
        loader, sampler = make_loader(cfg, dataset, world, rank, device.type == "cuda")
    except ConfigError as e:
        fail(2, f"{args.config}: {e}")
    model = make_model(cfg, sample_shape, classes)
    channels_last = m["channels_last"] and (m["name"] in RESNETS or m["name"] == "lenet")
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    if ddp and cfg["dist"]["sync_bn"]:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device, memory_format=memory_format).train()
    net = model
    if ddp:
        net = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg["dist"]["bucket_cap_mb"],
            find_unused_parameters=cfg["dist"]["find_unused_parameters"],
            broadcast_buffers=cfg["dist"]["broadcast_buffers"])
    if args.compile:
        net = torch.compile(net, mode=None if args.compile_mode == "default" else args.compile_mode)
    optimizer = make_optimizer(cfg, model)

    amp_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[a["dtype"]]
    precision = a["dtype"] if a["enabled"] else "float32"

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype, enabled=a["enabled"])

    use_scaler = a["enabled"] and (a["scaler"] == "on" or
                                   (a["scaler"] == "auto" and amp_dtype == torch.float16))
    scaler = torch.amp.GradScaler(device.type, init_scale=a["init_scale"],
                                  growth_factor=a["growth_factor"],
                                  backoff_factor=a["backoff_factor"],
                                  growth_interval=a["growth_interval"], enabled=use_scaler)
    accum, clip = t["grad_accum_steps"], t["clip_grad_norm"]
    smoothing = t["label_smoothing"]
    it = batches(loader, sampler)
    clock = CudaClock() if device.type == "cuda" else HostClock()

    def to_device(x, y):
        x = x.to(device, non_blocking=True)
        if x.dim() == 4:
            x = x.contiguous(memory_format=memory_format)
        return x, y.to(device, non_blocking=True)

    first = [to_device(*next(it)) for _ in range(accum)]
    flops = count_flops(model, first[0][0], autocast) * 3 * accum
    fixed = first if args.fixed_batch else None
    del first

    def step(phase=no_phase):
        """One optimizer step: (marks as phase_means reads them, mean loss). `phase(name)` is
        the context each phase runs in (count_operators marks them)."""
        marks = [clock.mark()]
        loss_sum = 0.0
        for i in range(accum):
            x, y = fixed[i] if fixed else next(it)
            marks.append(clock.mark())
            deferred = net.no_sync() if ddp and i < accum - 1 else contextlib.nullcontext()
            with deferred:
                with phase("forward"):
                    x, y = to_device(x, y)
                    with autocast():
                        logits = net(x)
                        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               y.reshape(-1), label_smoothing=smoothing)
                marks.append(clock.mark())
                with phase("backward"):
                    scaler.scale(loss / accum).backward()
                marks.append(clock.mark())
            loss_sum = loss_sum + loss.detach()
        with phase("optimizer"):
            if clip > 0:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        marks.append(clock.mark())
        return marks, loss_sum / accum

    def first_step():
        if not args.compile:
            return step()
        try:
            return step()
        except Exception as e:  # the compilation runs here; any failure of it ends the run
            first = (str(e).strip().splitlines() or [""])[0]
            fail(3, f"torch.compile failed: {type(e).__name__}: {first}")

    cuda = device.type == "cuda"
    records = []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            if ddp:
                dist.barrier()
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
        records.append(first_step() if i == 0 else step())
    if cuda:
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - start
    if cuda:
        peak_mb, peak_kind = torch.cuda.max_memory_allocated(device) / 2**20, "cuda_allocator"
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        peak_kind = "cpu_rss"
    final_loss = float(records[-1][1])

    ops_per_step, syncs_per_step = count_operators(step, args.counted)
    if args.profile:
        profile_steps(step, 3, args.profile, rank, cuda)
    timed = [marks for marks, _ in records[args.warmup:]]
    step_ms = [clock.ms(mk[0], mk[-1]) for mk in timed]
    phases = phase_means(timed, accum, clock.ms)
    peak = matmul_peak_tflops(device, amp_dtype if a["enabled"] else torch.float32)

    batch = d["batch_size"]
    samples_per_sec = world * batch * accum * args.steps / wall
    mean_s = sum(step_ms) / len(step_ms) / 1e3
    tflops = flops / mean_s / 1e12
    result = {
        "impl": "pytorch-compile" if args.compile else "pytorch",
        "compile_mode": args.compile_mode if args.compile else None,
        "config": args.config,
        "model": m["name"],
        "data": d["name"],
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
        "precision": precision,
        "channels_last": channels_last,
        "batch_size": batch,
        "grad_accum_steps": accum,
        "world_size": world,
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "warmup": args.warmup,
        "fixed_batch": args.fixed_batch,
        "seconds": wall,
        "samples_per_sec": samples_per_sec,
        "tokens_per_sec": samples_per_sec * seq_len if seq_len else None,
        "step_time_ms": {"mean": mean_s * 1e3, "p50": percentile(step_ms, 0.5),
                         "p90": percentile(step_ms, 0.9), "max": max(step_ms)},
        "phases_ms": phases,
        "peak_memory_mb": peak_mb,
        "peak_memory_kind": peak_kind,
        "flops_per_step": flops,
        "tflops": tflops,
        "peak_tflops": peak,
        "mfu": tflops / peak,
        "final_loss": final_loss,
        "optim_impl": cfg["optim"]["impl"],
        "ops_per_step": ops_per_step,
        "host_syncs_per_step": syncs_per_step,
        "versions": {"trainer": None, "torch": torch.__version__,
                     "cuda": torch.version.cuda or "cpu", "python": platform.python_version()},
    }
    if rank == 0:
        print(f"parameters: {sum(p.numel() for p in model.parameters())}")
        print_summary(result)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
                f.write("\n")
    if ddp:
        dist.destroy_process_group()


def print_summary(r):
    st, ph = r["step_time_ms"], r["phases_ms"]
    what = f"{r['model']} on {r['data']}, {r['precision']}, batch {r['batch_size']}"
    print(f"{r['impl']}: {what} x {r['grad_accum_steps']} accum x {r['world_size']} process(es), "
          f"{r['threads']} threads, {r['device']} ({r['device_name']})"
          + (", one fixed batch" if r["fixed_batch"] else ""))
    print(f"  {r['steps']} steps after {r['warmup']} warm-up: {r['samples_per_sec']:.1f} samples/s"
          + (f", {r['tokens_per_sec']:.0f} tokens/s" if r["tokens_per_sec"] else ""))
    print(f"  step ms: mean {st['mean']:.2f}  p50 {st['p50']:.2f}  p90 {st['p90']:.2f}  "
          f"max {st['max']:.2f}")
    print("  phases ms: " + "  ".join(f"{k} {v:.2f}" for k, v in ph.items()))
    print(f"  peak memory {r['peak_memory_mb']:.1f} MiB ({r['peak_memory_kind']}), "
          f"{r['flops_per_step'] / 1e9:.2f} GFLOP/step, {r['tflops']:.3f} TFLOP/s of "
          f"{r['peak_tflops']:.3f} (MFU {r['mfu']:.1%}), final loss {r['final_loss']:.4f}")
    ops = r["ops_per_step"]
    print(f"  dispatch: {ops['total']:.0f} ATen operators per step (forward {ops['forward']:.0f}, "
          f"backward {ops['backward']:.0f}, optimizer {ops['optimizer']:.0f}, other "
          f"{ops['other']:.0f}), {r['host_syncs_per_step']:.1f} host reads per step")


if __name__ == "__main__":
    main()
