#!/usr/bin/env python3
"""Writes WebDataset tar shards from an image folder, for `data.name: webdataset`.

  make_shards.py ROOT OUT [--per-shard N] [--seed S] [--splits train val]
  make_shards.py --synthetic N OUT [--classes K] [--per-shard N] [--seed S] [--jobs J]

ROOT holds torchvision's ImageFolder layout (ROOT/<split>/<class>/**/<image>.jpg|.jpeg|.png).
Classes are the sorted sub-folder names of ROOT/train, numbered from 0 as torchvision's
ImageFolder numbers them. For each split found, the images (shuffled with --seed, so that each
shard mixes the classes; --seed -1 keeps the sorted order) go N to a shard:
OUT/<split>-000000.tar, ...; a sample is <key>.<jpg|png> (the file's bytes, unchanged) and
<key>.cls (its class index as text), <key> being the split, class and file name. Also writes
OUT/classes.txt (one class name a line) and prints the data.shards / data.val_shards patterns.
Uses only the standard library. Writes each shard to a temporary name first, then renames it.

--synthetic N writes ImageNet-like photos instead of reading a folder: N training JPEGs of
500x375, quality 90 (smooth colour fields with noise, each shard drawn from --seed and its number,
J processes at once), labels uniform over --classes (1000), and a validation shard of N/100 (at
least 1); numpy and Pillow needed.
"""
import argparse
import io
import os
import random
import sys
import tarfile

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def images(split_dir, classes):
    """(path, class index) of every image under split_dir/<class>/, sorted by path."""
    out = []
    for label, cls in enumerate(classes):
        folder = os.path.join(split_dir, cls)
        if not os.path.isdir(folder):
            continue
        for dirpath, _, files in os.walk(folder):
            for name in files:
                if name.lower().endswith(IMAGE_EXTENSIONS):
                    out.append((os.path.join(dirpath, name), label))
    return sorted(out)


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def write_shard(path, samples, root):
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for image, label in samples:
            rel = os.path.relpath(image, root)
            stem, ext = os.path.splitext(rel)
            # The key may not hold a dot: webdataset's key ends at the first dot of the file name.
            key = stem.replace(".", "_")
            with open(image, "rb") as f:
                add_member(tar, key + ext.lower(), f.read())
            add_member(tar, key + ".cls", str(label).encode())
    os.replace(tmp, path)


def synthetic_shard(job):
    """Shard `path` of `count` generated photos, numbered from `first`."""
    import numpy as np
    from PIL import Image
    path, first, count, classes, seed = job
    rng = np.random.default_rng([seed, first])
    y, x = np.mgrid[0:375, 0:500].astype(np.float32)
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(first, first + count):
            channels = [127 + 100 * np.sin(rng.uniform(0.005, 0.05) * x +
                                           rng.uniform(0.005, 0.05) * y + rng.uniform(0, 6.3))
                        for _ in range(3)]
            img = np.stack(channels, axis=-1) + rng.normal(0, 20, (375, 500, 3))
            data = io.BytesIO()
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(data, "JPEG", quality=90)
            add_member(tar, f"{i:08d}.jpg", data.getvalue())
            add_member(tar, f"{i:08d}.cls", str(int(rng.integers(classes))).encode())
    os.replace(tmp, path)


def synthetic(args):
    from multiprocessing import Pool
    os.makedirs(args.out, exist_ok=True)
    jobs = []
    for split, n in (("train", args.synthetic), ("val", max(1, args.synthetic // 100))):
        shards = (n + args.per_shard - 1) // args.per_shard
        for k in range(shards):
            first = k * args.per_shard + (0 if split == "train" else args.synthetic)
            count = min(args.per_shard, n - k * args.per_shard)
            jobs.append((os.path.join(args.out, f"{split}-{k:06d}.tar"), first, count,
                         args.classes, args.seed))
        key = "shards" if split == "train" else "val_shards"
        print(f"data.{key}: {os.path.join(args.out, split)}-{{000000..{shards - 1:06d}}}.tar"
              f"  ({n} samples in {shards} shards)")
    with Pool(args.jobs) as pool:
        pool.map(synthetic_shard, jobs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?")
    p.add_argument("out")
    p.add_argument("--per-shard", type=int, default=1000, help="samples per shard (1000)")
    p.add_argument("--seed", type=int, default=0, help="sample order before sharding; -1: sorted")
    p.add_argument("--splits", nargs="+", default=["train", "val"])
    p.add_argument("--synthetic", type=int, default=0, help="generate this many photos instead")
    p.add_argument("--classes", type=int, default=1000, help="--synthetic's classes (1000)")
    p.add_argument("--jobs", type=int, default=os.cpu_count(), help="--synthetic's processes")
    args = p.parse_args()
    if args.per_shard < 1:
        sys.exit("make_shards.py: --per-shard must be >= 1")
    if args.synthetic > 0:
        return synthetic(args)
    if args.root is None:
        sys.exit("make_shards.py: give ROOT (an image folder) or --synthetic N")
    train_dir = os.path.join(args.root, "train")
    if not os.path.isdir(train_dir):
        sys.exit(f"make_shards.py: {train_dir}: no such directory (expected <root>/train/<class>/)")
    classes = sorted(d for d in os.listdir(train_dir) if os.path.isdir(os.path.join(train_dir, d)))
    if not classes:
        sys.exit(f"make_shards.py: {train_dir}: no class folders")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "classes.txt"), "w") as f:
        f.write("".join(c + "\n" for c in classes))
    for split in args.splits:
        split_dir = os.path.join(args.root, split)
        if not os.path.isdir(split_dir):
            continue
        samples = images(split_dir, classes)
        if args.seed >= 0:
            random.Random(args.seed).shuffle(samples)
        n = (len(samples) + args.per_shard - 1) // args.per_shard
        for k in range(n):
            chunk = samples[k * args.per_shard:(k + 1) * args.per_shard]
            write_shard(os.path.join(args.out, f"{split}-{k:06d}.tar"), chunk, args.root)
        key = "shards" if split == "train" else "val_shards"
        print(f"data.{key}: {os.path.join(args.out, split)}-{{000000..{n - 1:06d}}}.tar"
              f"  ({len(samples)} samples in {n} shards)")


if __name__ == "__main__":
    main()
