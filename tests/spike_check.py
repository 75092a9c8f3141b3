"""train.skip_update_zscore against a Python reference of llm.c's rule, on data with spikes.

Usage: spike_check.py TRAINER_BINARY

Writes a Fashion-MNIST-format data set (IDX files, 8x8 images of 4 classes, a fifth of the labels
wrong so that the loss varies) whose training split holds two corrupted batches (a quarter of
each bright noise with random labels) at known steps, and trains an MLP on it in order with the
guard on both the loss and the gradient norm. The reference replays the
rule over the losses and gradient norms that metrics.jsonl logs for every step: a value more than
the limit standard deviations (population) above the mean of the previous `window` steps' values
is a spike, every step's value entering the window. The steps the trainer skipped (its
spike_skips counter) must be exactly the reference's, must include the corrupted batches, and
must leave the weights as they were (the checkpoints before and after are equal). The run makes
no host read in its steps.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np
from run_check import report

try:
    from safetensors.numpy import load_file
except ImportError:
    print("safetensors is not installed in this Python; skipping")
    sys.exit(77)

BATCH, STEPS, WINDOW, LIMIT, LABEL_NOISE = 32, 60, 10, 2.5, 0.2
CORRUPTED = (24, 41)  # 1-based steps whose batch is noise with random labels


def write_idx(path, array):
    array = np.ascontiguousarray(array, dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, array.ndim]))
        f.write(struct.pack(">" + "I" * array.ndim, *array.shape))
        f.write(array.tobytes())


def make_split(rng, n, corrupted_steps=()):
    labels = rng.integers(0, 4, n)
    images = rng.integers(0, 120, (n, 8, 8))
    for i, c in enumerate(labels):  # each class lights its own quadrant
        images[i, (c // 2) * 4:(c // 2) * 4 + 4, (c % 2) * 4:(c % 2) * 4 + 4] += 100
    noisy = rng.random(n) < LABEL_NOISE  # a loss that varies from batch to batch
    labels[noisy] = rng.integers(0, 4, noisy.sum())
    for step in corrupted_steps:  # a quarter of the batch: bright noise, labelled at random
        rows = slice((step - 1) * BATCH, (step - 1) * BATCH + BATCH // 4)
        images[rows] = rng.integers(200, 256, (BATCH // 4, 8, 8))
        labels[rows] = rng.integers(0, 4, BATCH // 4)
    return images, labels


def reference_skips(losses, norms):
    def zscores(values):
        out = []
        for i, v in enumerate(values):
            window = np.array(values[max(0, i - WINDOW):i], dtype=np.float64)
            std = window.std() if len(window) == WINDOW else 0.0
            out.append((v - window.mean()) / std if std > 0 else 0.0)
        return out
    zl, zg = zscores(losses), zscores(norms)
    return {i + 1 for i in range(len(losses)) if zl[i] > LIMIT or zg[i] > LIMIT}


def main():
    trainer = sys.argv[1]
    failures = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        for prefix, n, bad in (("train", BATCH * STEPS, CORRUPTED), ("t10k", 128, ())):
            images, labels = make_split(rng, n, bad)
            write_idx(os.path.join(data, f"{prefix}-images-idx3-ubyte"), images)
            write_idx(os.path.join(data, f"{prefix}-labels-idx1-ubyte"), labels)
        run, config = os.path.join(tmp, "run"), os.path.join(tmp, "spikes.yaml")
        with open(config, "w") as f:
            f.write(f"""seed: 1
device: cpu
model: {{name: mlp, hidden: [32]}}
data: {{name: fashion_mnist, root: {data}, batch_size: {BATCH}, shuffle: false, workers: 0}}
optim: {{name: sgd, lr: 0.2}}
train:
  epochs: 1
  skip_update_zscore: {{loss: {LIMIT}, grad_norm: {LIMIT}, window: {WINDOW}}}
run: {{log_every: 1, checkpoint_every: 1, keep_last: 1000, progress: never}}
""")
        r = subprocess.run([trainer, "--config", config, "--run-dir", run, "--log-level", "info"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr)
            return report([f"training failed with exit {r.returncode}"])
        with open(os.path.join(run, "metrics.jsonl")) as f:
            train = [x for x in map(json.loads, f) if x["split"] == "train"]
        if [x["step"] for x in train] != list(range(1, STEPS + 1)):
            return report([f"train records of steps {[x['step'] for x in train]}"])
        skipped, before = set(), 0
        for x in train:
            if x["spike_skips"] > before:
                skipped.add(x["step"])
            before = x["spike_skips"]
        want = reference_skips([x["loss"] for x in train], [x["grad_norm"] for x in train])
        print(f"skipped {sorted(skipped)}; the reference skips {sorted(want)}")
        if skipped != want:
            failures.append(f"skipped {sorted(skipped)}, the reference {sorted(want)}")
        if not set(CORRUPTED) <= skipped:
            failures.append(f"the corrupted batches' steps {CORRUPTED} were not all skipped")
        warned = re.findall(r"step (\d+): update skipped by train.skip_update_zscore", r.stderr)
        if sorted(map(int, warned)) != sorted(skipped):
            failures.append(f"warnings for steps {warned}")
        ckpt = os.path.join(run, "checkpoints", "step_{:08d}.safetensors")
        for step in sorted(skipped) + [5, 20]:
            a, b = load_file(ckpt.format(step - 1)), load_file(ckpt.format(step))
            same = all(np.array_equal(a[k], b[k]) for k in a if k.startswith("model."))
            if same != (step in skipped):
                failures.append(f"step {step}: weights {'un' if same else ''}changed, skipped: "
                                f"{step in skipped}")
        reads = re.search(r"([0-9.]+) host reads per step", r.stderr)
        if not reads or float(reads.group(1)) != 0.0:
            failures.append(f"host reads per step: {reads.group(0) if reads else r.stderr[-400:]}")
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
