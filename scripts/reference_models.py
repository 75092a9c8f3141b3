"""Model and data definitions shared by the Python reference scripts (scripts/bench_*.py).

Each model mirrors the trainer's registry model of the same name (models/*.cpp): same layers,
same parameter count, so a benchmark compares implementations, not architectures.
"""
import gzip
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"
MLP_HIDDEN = [256, 128, 100]  # configs/fashion_mnist_mlp.yaml


class Lenet(nn.Module):
    def __init__(self, channels=(32, 64), kernel_size=5, fc_hidden=128, num_classes=10,
                 in_shape=(1, 28, 28), dropout=0.0):
        super().__init__()
        c, h, w = in_shape
        pad = kernel_size // 2
        self.dropout = dropout
        self.conv1 = nn.Conv2d(c, channels[0], kernel_size, padding=pad)
        self.conv2 = nn.Conv2d(channels[0], channels[1], kernel_size, padding=pad)
        self.fc = nn.Linear(channels[1] * (h // 4) * (w // 4), fc_hidden)
        self.head = nn.Linear(fc_hidden, num_classes)

    def forward(self, x):  # x: [B, C, H, W]
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # [B, c1, H/2, W/2]
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # [B, c2, H/4, W/4]
        x = F.relu(self.fc(x.flatten(1)))  # [B, fc_hidden]
        x = F.dropout(x, self.dropout, self.training)
        return self.head(x)  # [B, num_classes]


class Mlp(nn.Module):
    def __init__(self, hidden=MLP_HIDDEN, num_classes=10, in_features=784, dropout=0.0):
        super().__init__()
        self.dropout = dropout
        self.layers = nn.ModuleList()
        width = in_features
        for h in hidden:
            self.layers.append(nn.Linear(width, h))
            width = h
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        x = x.flatten(1)  # [B, D]
        for layer in self.layers:
            x = F.dropout(F.relu(layer(x)), self.dropout, self.training)
        return self.head(x)


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
    # Mean and population std of x / 255, exact from the byte histogram (data/memory_images.cpp).
    hist = torch.bincount(images.flatten(), minlength=256).double()
    v = torch.arange(256, dtype=torch.float64) / 255.0
    count = hist.sum()
    mean = float((v * hist).sum() / count)
    var = float((v * v * hist).sum() / count) - mean * mean
    std = var ** 0.5 if var > 1e-12 else 1.0
    return images, labels, mean, std
