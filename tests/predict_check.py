#!/usr/bin/env python3
"""trainer predict against PyTorch on the same weights (CTest Predict.MatchesTorchOnFashionMnist).

  predict_check.py TRAINER

Trains configs/fashion_mnist_mlp.yaml for 100 steps, writes the first 32 Fashion-MNIST test
images as PNG files (and one file that is not an image), and runs `trainer predict --top-k 3
--json` on the folder. The reference: the checkpoint's weights (trainer export) in a PyTorch MLP
on the same pixels, normalised by the training set's mean and standard deviation; the export
carries the class names. The top-3
classes must be the same, named as Fashion-MNIST names them, with probabilities within 1e-4;
the bad file must be reported and skipped, the others still predicted. Exits 77 (skipped)
without torch, safetensors, numpy, Pillow or the Debian data set.
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile

ROOT = "/usr/share/datasets/fashion-mnist"
NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
         "Bag", "Ankle boot"]
try:
    import numpy as np
    import torch
    from PIL import Image
    from safetensors import safe_open
    from safetensors.torch import load_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
if not os.path.isdir(ROOT):
    print(f"skipped: no {ROOT}")
    sys.exit(77)


def images(name):
    with gzip.open(os.path.join(ROOT, name), "rb") as f:
        return np.frombuffer(f.read()[16:], dtype=np.uint8).reshape(-1, 28, 28)


def reference(weights, pixels):
    train = images("train-images-idx3-ubyte.gz").astype(np.float64) / 255.0
    mean, std = train.mean(), train.std()
    x = torch.tensor((pixels.astype(np.float64) / 255.0 - mean) / std, dtype=torch.float32)
    h = x.reshape(len(pixels), -1)
    for layer in ("fc1", "fc2", "fc3"):
        h = torch.relu(h @ weights[f"{layer}.weight"].T + weights[f"{layer}.bias"])
    logits = h @ weights["head.weight"].T + weights["head.bias"]
    return logits.softmax(dim=1)


def main():
    trainer = sys.argv[1]
    test = images("t10k-images-idx3-ubyte.gz")[:32]
    with tempfile.TemporaryDirectory() as work:
        run = os.path.join(work, "run")
        subprocess.run([trainer, "--config", "configs/fashion_mnist_mlp.yaml", "--run-dir", run,
                        "--set", "train.max_steps=100", "--set", "run.progress=never"],
                       check=True, capture_output=True)
        folder = os.path.join(work, "png")
        os.makedirs(folder)
        for i, img in enumerate(test):
            Image.fromarray(img).save(os.path.join(folder, f"{i:02d}.png"))
        with open(os.path.join(folder, "zz_bad.png"), "wb") as f:
            f.write(b"not an image")
        out = subprocess.run([trainer, "predict", "--checkpoint", run, "--input", folder,
                              "--top-k", "3", "--json"], check=True, capture_output=True, text=True)
        result = json.loads(out.stdout)
        if result["skipped"] != [os.path.join(folder, "zz_bad.png")] or "zz_bad.png" not in out.stderr:
            sys.exit(f"the bad file was not reported and skipped: {result['skipped']} {out.stderr}")
        ckpt = os.path.join(run, "checkpoints", "step_00000100.safetensors")
        plain = os.path.join(work, "w.safetensors")
        subprocess.run([trainer, "export", "--checkpoint", ckpt, "--out", plain], check=True,
                       capture_output=True)
        probs = reference(load_file(plain), test)
        with safe_open(plain, "pt") as f:
            if json.loads(f.metadata()["classes"]) != NAMES:
                sys.exit(f"the export's class names: {f.metadata().get('classes')}")
    if len(result["predictions"]) != len(test):
        sys.exit(f"{len(result['predictions'])} predictions for {len(test)} images")
    worst = 0.0
    for i, p in enumerate(result["predictions"]):
        top = torch.topk(probs[i], 3)
        labels = [NAMES[j] for j in top.indices.tolist()]
        if [t["label"] for t in p["top"]] != labels:
            sys.exit(f"{p['path']}: {[t['label'] for t in p['top']]}, PyTorch {labels}")
        for t, q in zip(p["top"], top.values.tolist()):
            worst = max(worst, abs(t["probability"] - q))
    print(f"32 images: top-3 labels equal, max |probability diff| {worst:.3g}")
    if worst > 1e-4:
        sys.exit("probabilities differ")
    print("OK")


if __name__ == "__main__":
    main()
