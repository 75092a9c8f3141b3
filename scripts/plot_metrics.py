#!/usr/bin/env python3
"""Plots loss, accuracy and learning rate against step for one or more trainer run dirs.

Usage: scripts/plot_metrics.py RUN_DIR [RUN_DIR ...] [--out FILE.png] [--title TEXT]

Reads each RUN_DIR/metrics.jsonl and draws three panels: train and validation loss, validation
top-1 accuracy (perplexity for language models) and the learning rate. Runs are labelled by
their directory name. Needs matplotlib (scripts/setup.sh installs it into .venv:
`.venv/bin/python scripts/plot_metrics.py runs/a runs/b`).
"""
import argparse
import json
import os
import sys


def load(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    train, val = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                # A run that is still writing can end in a partial line.
                print(f"{path}:{n}: skipping a line that is not JSON", file=sys.stderr)
                continue
            (train if rec.get("split") == "train" else val).append(rec)
    return train, val


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--out", default="metrics.png", help="PNG to write (default metrics.png)")
    parser.add_argument("--title", default="", help="figure title")
    args = parser.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_metrics.py: matplotlib is missing; run scripts/setup.sh and use .venv/bin/python")

    fig, (ax_loss, ax_acc, ax_lr) = plt.subplots(1, 3, figsize=(16, 4.5))
    for run in args.runs:
        try:
            train, val = load(run)
        except OSError as e:
            sys.exit(f"plot_metrics.py: {e.filename}: {e.strerror}")
        name = os.path.basename(os.path.normpath(run))
        line, = ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train],
                             label=f"{name} train", alpha=0.8)
        if val:
            ax_loss.plot([r["step"] for r in val], [r["loss"] for r in val], "o--",
                         color=line.get_color(), label=f"{name} val")
            key = "top1" if "top1" in val[0] else "ppl"
            scale = 100.0 if key == "top1" else 1.0
            ax_acc.plot([r["step"] for r in val], [scale * r[key] for r in val], "o-",
                        color=line.get_color(), label=name)
            ax_acc.set_ylabel("val top-1 accuracy (%)" if key == "top1" else "val perplexity")
        ax_lr.plot([r["step"] for r in train], [r["lr"] for r in train], color=line.get_color(),
                   label=name)
    ax_loss.set_ylabel("loss")
    ax_loss.set_yscale("log")
    ax_lr.set_ylabel("learning rate")
    for ax in (ax_loss, ax_acc, ax_lr):
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
