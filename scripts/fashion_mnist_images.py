#!/usr/bin/env python3
"""Writes the first N Fashion-MNIST test images as PNG files named by their class.

  fashion_mnist_images.py OUTDIR [N] [ROOT]

OUTDIR/<i>_<class>.png for the first N (default 8) images of ROOT's t10k files (default Debian's
/usr/share/datasets/fashion-mnist), to try `trainer predict` on. Uses only the standard library
(zlib for PNG), so any python3 runs it.
"""
import gzip
import os
import struct
import sys
import zlib

NAMES = ["T-shirt-top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
         "Bag", "Ankle-boot"]


def png(pixels, width, height):
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    rows = b"".join(b"\0" + pixels[y * width:(y + 1) * width] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


def main():
    out = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    root = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
    with gzip.open(os.path.join(root, "t10k-images-idx3-ubyte.gz")) as f:
        images = f.read()[16:]
    with gzip.open(os.path.join(root, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = f.read()[8:]
    os.makedirs(out, exist_ok=True)
    for i in range(count):
        name = os.path.join(out, f"{i:03d}_{NAMES[labels[i]]}.png")
        with open(name, "wb") as f:
            f.write(png(images[i * 784:(i + 1) * 784], 28, 28))
    print(f"wrote {count} images to {out}")


if __name__ == "__main__":
    main()
