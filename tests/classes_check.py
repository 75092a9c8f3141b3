#!/usr/bin/env python3
"""The classes a checkpoint was trained on against the data's (CTest
Classes.CheckedAgainstTheCheckpointOnEveryRankCount).

  classes_check.py TRAINER SOURCE_DIR

An MLP learns an image folder of three classes (cat, dog, zebra; each class its own colour) to
100% top-1. Then:
1. `cat` renamed `zz_cat`: `trainer eval` on 1, 2 and 3 ranks and `--resume auto` on 2 ranks exit 2
   naming both lists and data.remap_classes; no metrics line is written by the resume.
2. The same with data.remap_classes: true still exits 2 (zz_cat is no class of the checkpoint).
3. A checkpoint whose classes are [dog, cat, zebra], its head's rows permuted to match (the model
   a run with that class order would have): eval exits 2; with data.remap_classes: true the labels
   are matched by name and top-1 is 100% again, on 1, 2 and 3 ranks; resuming on 2 ranks trains.
Exits 77 (skipped) when numpy, safetensors or PIL is missing. (The checkpoint is edited with
numpy: the check imports no torch, a second and more of start-up.)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from PIL import Image
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

COLOURS = {"cat": (220, 40, 40), "dog": (40, 200, 40), "zebra": (40, 40, 220)}
CONFIG = """
model: {name: mlp, hidden: [16], dropout: 0.0}
data: {name: imagefolder, image_size: 8, resize_size: 8, batch_size: 6, workers: 1}
train: {epochs: 30}
optim: {name: adamw, lr: 0.01, weight_decay: 0.0}
run: {log_every: 5, eval_every: 0, progress: never, threads: 1}
"""


def write_folder(root):
    for split, n in (("train", 6), ("val", 2)):
        for name, rgb in COLOURS.items():
            d = os.path.join(root, split, name)
            os.makedirs(d)
            for i in range(n):
                shade = tuple(max(0, min(255, c + 6 * i - 15)) for c in rgb)
                Image.new("RGB", (10, 10), shade).save(os.path.join(d, f"{i}.png"))


def run(trainer, args, ranks=1):
    cmd = [trainer] + (["launch", "--standalone", "--nproc-per-node", str(ranks), "--"]
                       if ranks > 1 else []) + args
    return subprocess.run(cmd, capture_output=True, text=True)


def listed(names):
    return "[" + ", ".join(json.dumps(n) for n in names) + "]"


def expect_refused(r, what, data_names, saved_names):
    if r.returncode != 2:
        sys.exit(f"{what}: exit {r.returncode}, not 2\n{r.stderr}")
    for needle in ("data.remap_classes", listed(data_names), listed(saved_names)):
        if needle not in r.stderr:
            sys.exit(f"{what}: {needle!r} not in the message:\n{r.stderr}")
    print(f"{what}: refused: {r.stderr.strip().splitlines()[-1][:160]}")


def eval_top1(trainer, run_dir, config, root, ranks, extra=()):
    r = run(trainer, ["eval", "--checkpoint", run_dir, "--config", config, "--json",
                      "--set", f"data.root={root}", *extra], ranks)
    if r.returncode != 0:
        sys.exit(f"eval on {ranks} ranks: exit {r.returncode}\n{r.stderr}")
    line = [ln for ln in r.stdout.splitlines() if "{" in ln][-1]
    return json.loads(line[line.index("{"):])["top1"]


def permute_checkpoint(ckpt, order, out):
    """Writes the checkpoint with its classes in `order` (indices into the saved list) and the
    rows of its last layer permuted alike: what training on that class order gives."""
    with safe_open(ckpt, "np") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    trainer_meta = json.loads(meta["trainer"])
    names = trainer_meta["classes"]
    trainer_meta["classes"] = [names[i] for i in order]
    head = sorted(k for k, t in tensors.items()
                  if k.startswith("model.") and t.ndim >= 1 and t.shape[0] == len(names))[-2:]
    idx = np.array(order)
    for k in head:
        tensors[k] = np.ascontiguousarray(tensors[k][idx])
    # The optimizer's moments of those rows as well, so that resuming trains the same model.
    for k, t in tensors.items():
        for h in head:
            if k.startswith("optim.") and t.shape == tensors[h].shape and h[len("model."):] in k:
                tensors[k] = np.ascontiguousarray(t[idx])
    meta["trainer"] = json.dumps(trainer_meta)
    save_file(tensors, out, metadata=meta)
    return head


def main():
    trainer, source = sys.argv[1], sys.argv[2]
    os.chdir(source)
    with tempfile.TemporaryDirectory() as work:
        root = os.path.join(work, "images")
        write_folder(root)
        config = os.path.join(work, "classes.yaml")
        with open(config, "w") as f:
            f.write(CONFIG)
        run_dir = os.path.join(work, "run")
        r = run(trainer, ["--config", config, "--set", f"data.root={root}", "--run-dir", run_dir])
        if r.returncode != 0:
            sys.exit(f"training: exit {r.returncode}\n{r.stderr}")
        top1 = eval_top1(trainer, run_dir, config, root, 1)
        if top1 < 0.999:
            sys.exit(f"the model did not learn the colours: top-1 {top1}")
        print(f"trained: top-1 {top1:.3f}")

        renamed = os.path.join(work, "renamed")
        shutil.copytree(root, renamed)
        for split in ("train", "val"):
            os.rename(os.path.join(renamed, split, "cat"), os.path.join(renamed, split, "zz_cat"))
        saved = ["cat", "dog", "zebra"]
        now = ["dog", "zebra", "zz_cat"]
        for ranks in (1, 2, 3):
            for extra in ([], ["--set", "data.remap_classes=true"]):
                r = run(trainer, ["eval", "--checkpoint", run_dir, "--config", config,
                                  "--set", f"data.root={renamed}", *extra], ranks)
                expect_refused(r, f"eval of renamed classes on {ranks} ranks {extra}", now, saved)
        metrics = os.path.join(run_dir, "metrics.jsonl")
        lines = open(metrics).read()
        r = run(trainer, ["--config", config, "--set", f"data.root={renamed}", "--run-dir", run_dir,
                          "--resume", "auto", "--set", "train.epochs=40"], 2)
        expect_refused(r, "resume on renamed classes on 2 ranks", now, saved)
        if open(metrics).read() != lines:
            sys.exit("the refused resume changed metrics.jsonl")

        # Trained on [dog, cat, zebra]: same names, another order.
        ckpt_dir = os.path.join(run_dir, "checkpoints")
        newest = sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".safetensors"))[-1]
        other = os.path.join(work, "other")
        os.makedirs(os.path.join(other, "checkpoints"))
        shutil.copy(os.path.join(run_dir, "config.yaml"), other)
        head = permute_checkpoint(os.path.join(ckpt_dir, newest), [1, 0, 2],
                                  os.path.join(other, "checkpoints", newest))
        print(f"permuted {head}")
        for ranks in (1, 2, 3):
            r = run(trainer, ["eval", "--checkpoint", other, "--config", config,
                              "--set", f"data.root={root}"], ranks)
            expect_refused(r, f"eval of another class order on {ranks} ranks", saved,
                           ["dog", "cat", "zebra"])
            top1 = eval_top1(trainer, other, config, root, ranks,
                             ["--set", "data.remap_classes=true"])
            if top1 < 0.999:
                sys.exit(f"remapped by name on {ranks} ranks: top-1 {top1}, not 1")
            print(f"remapped by name on {ranks} ranks: top-1 {top1:.3f}")
        r = run(trainer, ["--config", config, "--set", f"data.root={root}", "--run-dir", other,
                          "--resume", "auto", "--set", "train.epochs=32",
                          "--set", "data.remap_classes=true", "--set", "data.batch_size=3"], 2)
        if r.returncode != 0:
            sys.exit(f"resume remapped on 2 ranks: exit {r.returncode}\n{r.stderr}")
        top1 = eval_top1(trainer, other, config, root, 1, ["--set", "data.remap_classes=true"])
        if top1 < 0.999:
            sys.exit(f"after training remapped on 2 ranks: top-1 {top1}")
    print("OK")


if __name__ == "__main__":
    main()
