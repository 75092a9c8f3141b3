#!/usr/bin/env python3
"""Loader throughput: the data set and torchvision's reference for scripts/bench_loader.sh.

  bench_loader.py make DIR [--train N] [--val N]
      writes an image folder of real-sized JPEGs: Fashion-MNIST images (Debian's
      dataset-fashion-mnist) upscaled to 500x375 RGB, quality 90, DIR/train/<class>/*.jpg and
      DIR/val/<class>/*.jpg. Does nothing when DIR already holds them.

  bench_loader.py torchvision DIR [--batch B] [--workers W] [--batches N] [--warmup N]
                                  [--transforms v2|v1]
      times torchvision's ImageFolder + DataLoader with the same training transform as the
      trainer (v2, the default: RandomResizedCrop(224, antialias=True) + RandomHorizontalFlip +
      ToImage + ToDtype(float32, scale=True) + Normalize; v1: RandomResizedCrop(224) +
      RandomHorizontalFlip + ToTensor + Normalize) and prints {"images_per_sec": ...}.

  bench_loader.py webdataset PATTERN [--batch B] [--workers W] [--batches N] [--warmup N]
      the same for the Python webdataset library's pipeline on the shards of PATTERN (made from
      DIR by scripts/make_shards.py): WebDataset(shardshuffle) + shuffle(1000) + decode("pil") +
      the v2 training transform, batched, through a WebLoader with W workers.
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

FMNIST = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return dims, data[4 + 4 * ndim :]


def make(root, train, val):
    from PIL import Image

    marker = os.path.join(root, ".complete")
    if os.path.exists(marker):
        return
    dims, pixels = read_idx(os.path.join(FMNIST, "train-images-idx3-ubyte.gz"))
    _, labels = read_idx(os.path.join(FMNIST, "train-labels-idx1-ubyte.gz"))
    side = dims[1] * dims[2]
    for split, start, count in (("train", 0, train), ("val", train, val)):
        for i in range(start, start + count):
            img = Image.frombytes("L", (dims[2], dims[1]), pixels[i * side : (i + 1) * side])
            img = img.convert("RGB").resize((500, 375), Image.BILINEAR)
            folder = os.path.join(root, split, "class_%d" % labels[i])
            os.makedirs(folder, exist_ok=True)
            img.save(os.path.join(folder, "%05d.jpg" % i), quality=90)
    open(marker, "w").close()


def torchvision_rate(root, batch, workers, batches, warmup, version):
    import torch
    from torchvision import datasets, transforms
    from torchvision.transforms import v2

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    if version == "v2":
        transform = v2.Compose([v2.RandomResizedCrop(224, antialias=True),
                                v2.RandomHorizontalFlip(), v2.ToImage(),
                                v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    else:
        transform = transforms.Compose([transforms.RandomResizedCrop(224),
                                        transforms.RandomHorizontalFlip(),
                                        transforms.ToTensor(), transforms.Normalize(mean, std)])
    dataset = datasets.ImageFolder(os.path.join(root, "train"), transform)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
    )

    def batches_forever():
        while True:
            yield from loader

    it = batches_forever()
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    images = 0
    for _ in range(batches):
        x, _ = next(it)
        images += x.shape[0]
    seconds = time.perf_counter() - start
    return {"images_per_sec": round(images / seconds, 1), "batches": batches, "batch_size": batch,
            "workers": workers, "seconds": round(seconds, 3), "transforms": version}


def timed(it, batches, warmup):
    """Images per second over `batches` batches of `it` after `warmup` ones."""
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    images = 0
    for _ in range(batches):
        x = next(it)[0]
        images += x.shape[0]
    return images, time.perf_counter() - start


def webdataset_rate(pattern, batch, workers, batches, warmup):
    import torch
    import webdataset as wds
    from torchvision.transforms import v2

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    transform = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                            v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize(mean, std)])
    dataset = (wds.WebDataset(pattern, shardshuffle=100, nodesplitter=wds.split_by_node,
                              workersplitter=wds.split_by_worker, empty_check=False)
               .shuffle(1000).decode("pil").to_tuple("jpg", "cls")
               .map_tuple(transform, int).batched(batch, partial=False))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=workers,
                           persistent_workers=workers > 0, prefetch_factor=2 if workers else None)

    def batches_forever():
        while True:
            yield from loader

    images, seconds = timed(batches_forever(), batches, warmup)
    return {"images_per_sec": round(images / seconds, 1), "batches": batches, "batch_size": batch,
            "workers": workers, "seconds": round(seconds, 3), "transforms": "v2"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=["make", "torchvision", "webdataset"])
    p.add_argument("dir")
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--val", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--transforms", choices=["v2", "v1"], default="v2")
    a = p.parse_args()
    if a.what == "make":
        make(a.dir, a.train, a.val)
    elif a.what == "webdataset":
        print(json.dumps(webdataset_rate(a.dir, a.batch, a.workers, a.batches, a.warmup)))
    else:
        print(json.dumps(torchvision_rate(a.dir, a.batch, a.workers, a.batches, a.warmup,
                                          a.transforms)))


if __name__ == "__main__":
    sys.exit(main())
