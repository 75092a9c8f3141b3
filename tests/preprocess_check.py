#!/usr/bin/env python3
"""imagefolder's transforms against torchvision's (CTest Preprocess.EqualsTorchvision).

  preprocess_check.py PREPROCESS_TOOL

Writes an image folder of PNG and JPEG files of several sizes and aspect ratios (smooth colour
fields with noise, as photos have), and runs tests/preprocess_tool.cpp on it. Then:
  - the validation split must equal torchvision's Resize(R) + CenterCrop(S) + ToTensor +
    Normalize (ImageNet's statistics) on the PIL image within 1/255 per pixel, and the same
    transforms of torchvision.transforms.v2 on the uint8 tensor;
  - each training crop must equal torchvision's resized_crop of the same region (and hflip)
    within 1/255 per pixel.
A 16-bit grayscale PNG among them is compared with its samples' high bytes (numpy of the file's
values >> 8), the behaviour docs/reference.md states (Pillow's convert("RGB") clips it instead).
Prints the largest differences. Exits 77 (skipped) without torch, torchvision, safetensors,
numpy or Pillow.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torchvision.transforms as T
    import torchvision.transforms.v2 as T2
    import torchvision.transforms.v2.functional as F
    from PIL import Image
    from safetensors.torch import load_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

SIZE, RESIZE = 32, 36
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
SHAPES = [(500, 375), (375, 500), (64, 64), (37, 53), (120, 33), (36, 36), (41, 40)]


def picture(rng, width, height):
    """A smooth colour field with fine noise, uint8 [H, W, 3]."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(0.01, 0.2), rng.uniform(0.01, 0.2), rng.uniform(0, 6.3)
        channels.append(127 + 100 * np.sin(fx * x + fy * y + phase))
    img = np.stack(channels, axis=-1) + rng.normal(0, 12, (height, width, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def write_folder(root):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("a", "b"):
            os.makedirs(os.path.join(root, split, cls))
            for k, (w, h) in enumerate(SHAPES):
                img = Image.fromarray(picture(rng, w, h))
                ext = "png" if k % 2 == 0 else "jpg"
                path = os.path.join(root, split, cls, f"{k}.{ext}")
                img.save(path, quality=92) if ext == "jpg" else img.save(path)
        # A 16-bit grayscale PNG using the whole range (Pillow opens it as mode I;16).
        deep = picture(rng, 45, 38)[:, :, 0].astype(np.uint16) * 257
        deep += rng.integers(0, 257, deep.shape).astype(np.uint16)
        Image.fromarray(deep).save(os.path.join(root, split, "a", "deep16.png"))


def files(root, split):
    out = []
    for cls in sorted(os.listdir(os.path.join(root, split))):
        folder = os.path.join(root, split, cls)
        out += sorted(os.path.join(folder, f) for f in os.listdir(folder))
    return out


def load_rgb(path):
    """The image as trainer decodes it, as an RGB PIL image. A 16-bit PNG keeps each sample's high
    byte (value >> 8, as libpng's png_set_strip_16), computed here with numpy from the file's
    values; Pillow's own convert("RGB") clips such a grayscale image at 255 instead."""
    img = Image.open(path)
    if img.mode not in ("I;16", "I;16B", "I"):
        return img.convert("RGB")
    values = np.array(img).astype(np.uint32)  # the PNG's 16-bit samples
    assert values.max() > 255, "the 16-bit test image should use its high byte"
    gray = (values >> 8).astype(np.uint8)
    clipped = np.array(img.convert("RGB"))[:, :, 0]
    assert not np.array_equal(clipped, gray), "Pillow clips where trainer keeps the high byte"
    return Image.fromarray(np.stack([gray] * 3, axis=-1))


def largest_difference(a, b):
    """In units of 1/255 of the [0, 1] range."""
    return float((a.double() - b.double()).abs().max()) * 255.0


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory() as root:
        write_folder(root)
        out = os.path.join(root, "out.safetensors")
        subprocess.run([tool, root, str(SIZE), str(RESIZE), out], check=True)
        got = load_file(out)
        mean, std = torch.tensor(MEAN).view(3, 1, 1), torch.tensor(STD).view(3, 1, 1)
        val = got["val"] * std + mean  # back to [0, 1]
        pil = T.Compose([T.Resize(RESIZE), T.CenterCrop(SIZE), T.ToTensor()])
        v2 = T2.Compose([T2.Resize(RESIZE, antialias=True), T2.CenterCrop(SIZE)])
        worst = {"val (PIL)": 0.0, "val (v2, uint8 tensor)": 0.0, "train": 0.0}
        for i, path in enumerate(files(root, "val")):
            img = load_rgb(path)
            worst["val (PIL)"] = max(worst["val (PIL)"], largest_difference(val[i], pil(img)))
            tensor = F.pil_to_tensor(img)
            ref = v2(tensor).double() / 255.0
            worst["val (v2, uint8 tensor)"] = max(worst["val (v2, uint8 tensor)"],
                                                  largest_difference(val[i], ref))
        for i, path in enumerate(files(root, "train")):
            x, y, w, h, flip = got["regions"][i].tolist()
            img = load_rgb(path)
            ref = F.resized_crop(F.pil_to_tensor(img), y, x, h, w, [SIZE, SIZE], antialias=True)
            if flip:
                ref = F.horizontal_flip(ref)
            worst["train"] = max(worst["train"],
                                 largest_difference(got["train"][i] / 255.0, ref / 255.0))
        print("largest difference to torchvision, in 1/255: " +
              ", ".join(f"{k} {v:.3f}" for k, v in worst.items()))
        bad = {k: v for k, v in worst.items() if v > 1.0 + 1e-3}
        if bad:
            sys.exit(f"more than 1/255 from torchvision: {bad}")


if __name__ == "__main__":
    main()
