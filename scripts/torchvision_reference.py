#!/usr/bin/env python3
"""Writes torchvision's ResNet state-dict layouts, the reference for tests/test_resnet.cpp.

Usage: .venv/bin/python scripts/torchvision_reference.py [--out-dir DIR]

For resnet18 and resnet50 (1000 classes) writes DIR/<name>_state_dict.tsv (default DIR:
tests/data), one line per state_dict entry in torchvision's order: `name<TAB>shape`, the shape
as comma-separated dims (empty for scalars such as num_batches_tracked). Needs torchvision
matching the venv's torch, installed without touching torch:
`.venv/bin/pip install --no-deps torchvision==0.26.0` (for torch 2.11). The files were made
with torchvision 0.26.0.
"""
import argparse
import os

import torchvision

MODELS = ("resnet18", "resnet50")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=os.path.join(root, "tests", "data"))
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    for name in MODELS:
        model = getattr(torchvision.models, name)(weights=None, num_classes=1000)
        path = os.path.join(args.out_dir, f"{name}_state_dict.tsv")
        with open(path, "w") as f:
            for key, tensor in model.state_dict().items():
                f.write(f"{key}\t{','.join(str(d) for d in tensor.shape)}\n")
        print(f"wrote {path} ({len(model.state_dict())} entries, torchvision "
              f"{torchvision.__version__})")


if __name__ == "__main__":
    main()
