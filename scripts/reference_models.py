"""Model and data definitions shared by the Python reference scripts (scripts/bench_*.py).

Each model mirrors the trainer's registry model of the same name (models/*.cpp): same layers,
same parameter count, so a benchmark compares implementations, not architectures. GPT is
nanoGPT's model as models/gpt.cpp builds it (tied lm_head, optional biases, GPT-2 init).
"""
import gzip
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"
MLP_HIDDEN = [256, 128, 100]  # configs/fashion_mnist_mlp.yaml
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh}  # model.activation


class Lenet(nn.Module):
    def __init__(self, channels=(32, 64), kernel_size=5, fc_hidden=128, num_classes=10,
                 in_shape=(1, 28, 28), dropout=0.0, activation="relu"):
        super().__init__()
        c, h, w = in_shape
        pad = kernel_size // 2
        self.dropout = dropout
        self.act = ACTIVATIONS[activation]
        self.conv1 = nn.Conv2d(c, channels[0], kernel_size, padding=pad)
        self.conv2 = nn.Conv2d(channels[0], channels[1], kernel_size, padding=pad)
        self.fc = nn.Linear(channels[1] * (h // 4) * (w // 4), fc_hidden)
        self.head = nn.Linear(fc_hidden, num_classes)

    def forward(self, x):  # x: [B, C, H, W]
        x = F.max_pool2d(self.act(self.conv1(x)), 2)  # [B, c1, H/2, W/2]
        x = F.max_pool2d(self.act(self.conv2(x)), 2)  # [B, c2, H/4, W/4]
        x = self.act(self.fc(x.flatten(1)))  # [B, fc_hidden]
        x = F.dropout(x, self.dropout, self.training)
        return self.head(x)  # [B, num_classes]


class Mlp(nn.Module):
    def __init__(self, hidden=MLP_HIDDEN, num_classes=10, in_features=784, dropout=0.0,
                 activation="relu"):
        super().__init__()
        self.dropout = dropout
        self.act = ACTIVATIONS[activation]
        self.layers = nn.ModuleList()
        width = in_features
        for h in hidden:
            self.layers.append(nn.Linear(width, h))
            width = h
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        x = x.flatten(1)  # [B, D]
        for layer in self.layers:
            x = F.dropout(self.act(layer(x)), self.dropout, self.training)
        return self.head(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, C, n_head, bias=True, dropout=0.0):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.c_attn = nn.Linear(C, 3 * C, bias=bias)
        self.c_proj = nn.Linear(C, C, bias=bias)

    def forward(self, x):  # x: [B, T, C]
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)  # [B, nh, T, hs]
        y = self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return F.dropout(y, self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, C, bias=True, dropout=0.0):
        super().__init__()
        self.dropout = dropout
        self.c_fc = nn.Linear(C, 4 * C, bias=bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * C, C, bias=bias)

    def forward(self, x):
        return F.dropout(self.c_proj(self.gelu(self.c_fc(x))), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, C, n_head, bias=True, dropout=0.0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, bias=bias)
        self.attn = CausalSelfAttention(C, n_head, bias, dropout)
        self.ln_2 = nn.LayerNorm(C, bias=bias)
        self.mlp = MLP(C, bias, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2-style decoder: token ids [B, T] -> logits [B, T, vocab].

    ckpt=True runs every block through torch.utils.checkpoint (use_reentrant=False).
    """

    def __init__(self, vocab=50257, block_size=1024, n_layer=12, n_head=12, C=768, ckpt=False,
                 bias=True, dropout=0.0):
        super().__init__()
        self.ckpt = ckpt
        self.dropout = dropout
        self.wte = nn.Embedding(vocab, C)
        self.wpe = nn.Embedding(block_size, C)
        self.h = nn.ModuleList(Block(C, n_head, bias, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(C, bias=bias)
        self.lm_head = nn.Linear(C, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():  # GPT-2 init; LayerNorm weights stay 1
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() == 2:  # Linear and Embedding weights (wte == lm_head once)
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.dropout, self.training)  # [B, T, C]
        for blk in self.h:
            x = checkpoint(blk, x, use_reentrant=False) if self.ckpt else blk(x)
        return self.lm_head(self.ln_f(x))


def read_idx(path):
    """An IDX file (raw or gzip) as a uint8 tensor of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not a uint8 IDX file (magic {data[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = bytearray(data[4 + 4 * ndim:])
    return torch.frombuffer(body, dtype=torch.uint8).reshape(dims)


def find(root, base):
    for name in (base + ".gz", base):
        if os.path.isfile(os.path.join(root, name)):
            return os.path.join(root, name)
    raise FileNotFoundError(f"{root}: missing {base}(.gz)")


def load_train(root):
    images = read_idx(find(root, "train-images-idx3-ubyte"))  # [N, H, W] uint8
    labels = read_idx(find(root, "train-labels-idx1-ubyte")).long()  # [N]
    images = images.unsqueeze(1).contiguous()  # [N, 1, H, W]
    # Mean and population std of x / 255, exact from the byte histogram (data/image/memory_images.cpp).
    hist = torch.bincount(images.flatten(), minlength=256).double()
    v = torch.arange(256, dtype=torch.float64) / 255.0
    count = hist.sum()
    mean = float((v * hist).sum() / count)
    var = float((v * v * hist).sum() / count) - mean * mean
    std = var ** 0.5 if var > 1e-12 else 1.0
    return images, labels, mean, std
