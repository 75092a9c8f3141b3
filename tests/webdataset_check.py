#!/usr/bin/env python3
"""The webdataset data set against the Python webdataset library, and its order and resumes
(CTest WebDataset.MatchesWebdatasetAndResumesExactly).

  webdataset_check.py TRAINER WEBDATASET_TOOL SOURCE_DIR

Writes an image folder (JPEG and PNG pictures of several sizes, 5 classes), and shards of it with
scripts/make_shards.py: 3 training shards of 30 samples, 1 validation shard. Then checks:
  - read in order (no shuffle, one stream), the training samples' keys and labels equal those of
    webdataset.WebDataset(shardshuffle=False), also for names longer than a tar header holds (GNU
    and pax headers), and the validation inputs equal torchvision's Resize + CenterCrop +
    Normalize of the images webdataset decodes, within 1/255 per pixel;
  - shuffled: every sample once per epoch; epochs differ; at 3 ranks each rank reads one shard;
    rank r of 2 reads entries r, r+2, ... of the 1-rank order (so 2 -> 1 ranks resumes exactly);
    a loader started at batch k hands out the uninterrupted run's batches from k, at 1 and 2 ranks;
  - a truncated shard, a sample without a label, a label out of range, a sample with two .cls
    members (webdataset raises "duplicate file name") and an unreadable image are skipped and
    counted with data.on_bad_sample: skip, and stop with a message naming the shard (and the
    sample) with fail;
  - the class names of make_shards.py's classes.txt (read from beside the shards) are the
    checkpoint's (export's metadata) and predict's labels; data.classes other than their count, a
    class file naming a class twice, a brace range of a billion shards: config errors (exit 2);
  - data.mix of the shards and an image folder: with the same classes it builds; with other
    classes it is a config error (exit 2) naming both parts;
  - training: a run stopped at step 4 and resumed equals an uninterrupted one bit for bit; a
    2-rank run stopped at step 3 and resumed on 1 rank (batch 8 = 2 x 4) equals the 2-rank run
    within 1e-5 at every step;
  - a config without data.shards is a config error (exit 2) naming data.shards.
Exits 77 (skipped) without numpy, Pillow, torch, torchvision, safetensors or webdataset.
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

try:
    import numpy as np
    import torch
    import torchvision.transforms as T
    import webdataset as wds
    from PIL import Image
    from safetensors import safe_open
    from safetensors.torch import load_file
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from preprocess_check import picture  # noqa: E402  (smooth colour fields with noise)

CLASSES = 5
SIZE, RESIZE = 16, 18
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def write_folder(root):
    rng = np.random.default_rng(0)
    shapes = [(40, 30), (30, 40), (24, 24), (37, 26)]
    for split, per_class in (("train", 18), ("val", 3)):
        for c in range(CLASSES):
            folder = os.path.join(root, split, f"class{c}")
            os.makedirs(folder)
            for k in range(per_class):
                w, h = shapes[k % len(shapes)]
                img = Image.fromarray(picture(rng, w, h))
                if k % 3 == 0:
                    img.save(os.path.join(folder, f"{k}.png"))
                else:
                    img.save(os.path.join(folder, f"{k}.jpg"), quality=90)


class Tool:
    def __init__(self, path, shards, **defaults):
        self.path, self.shards, self.defaults = path, shards, defaults

    def run(self, **flags):
        flags = {**self.defaults, **flags}
        args = [self.path, "--shards", flags.pop("shards", self.shards)]
        for k, v in flags.items():
            args += ["--" + k.replace("_", "-"), str(v)]
        return subprocess.run(args, capture_output=True, text=True)

    def batches(self, **flags):
        r = self.run(**flags)
        if r.returncode != 0:
            raise RuntimeError(f"webdataset_tool {flags}: exit {r.returncode}: {r.stderr}")
        return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]

    def names(self, **flags):
        return [n for b in self.batches(**flags) for n in b["names"]]


def key_of(name):
    return name.rsplit(":", 1)[1]


def shard_of(name):
    return name.rsplit(":", 1)[0]


def write_long_names(path, fmt):
    """Three samples whose keys are longer than a tar header's 100-byte name field."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for i in range(3):
            key = "deep/" * 30 + os.path.basename(path).split(".")[0] + f"-{i}"
            img = io.BytesIO()
            Image.fromarray(np.full((20, 20, 3), 40 * i, np.uint8)).save(img, format="PNG")
            for ext, data in (("png", img.getvalue()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def check_long_names(tool, tmp, val_shards, failures):
    write_long_names(os.path.join(tmp, "long-gnu.tar"), tarfile.GNU_FORMAT)
    write_long_names(os.path.join(tmp, "long-pax.tar"), tarfile.PAX_FORMAT)
    pattern = os.path.join(tmp, "long-{gnu,pax}.tar")
    ref = [(s["__key__"], s["cls"]) for s in wds.WebDataset(pattern, shardshuffle=False)
           .decode("pil")]
    got = []
    for b in tool.batches(shards=pattern, val_shards=val_shards, shuffle=0, streams=1):
        got += [(key_of(n), l) for n, l in zip(b["names"], b["labels"])]
    print(f"long names (GNU and pax headers): {len(got)} samples, webdataset {len(ref)}")
    if got != ref or len(got) != 6:
        failures.append(f"long names: {got} vs webdataset's {ref}")


def check_against_webdataset(tool, shards, val_shards, tmp, failures):
    ref = [(s["__key__"], s["cls"]) for s in wds.WebDataset(shards, shardshuffle=False).decode("pil")]
    got = []
    for b in tool.batches(shuffle=0, streams=1, batch=7, val_shards=val_shards):
        got += [(key_of(n), l) for n, l in zip(b["names"], b["labels"])]
    print(f"in order: {len(got)} samples read, webdataset reads {len(ref)}")
    if got != ref:
        failures.append(f"samples/labels differ from webdataset's: first {got[:3]} vs {ref[:3]}")
    pixels = os.path.join(tmp, "val.safetensors")
    val = tool.batches(val_shards=val_shards, split="val", shuffle=0, batch=5, pixels=pixels,
                       image_size=SIZE, resize_size=RESIZE)
    mine = load_file(pixels)["inputs"]
    tf = T.Compose([T.Resize(RESIZE), T.CenterCrop(SIZE), T.ToTensor(), T.Normalize(MEAN, STD)])
    samples = list(wds.WebDataset(val_shards, shardshuffle=False).decode("pil"))
    keys = [key_of(n) for b in val for n in b["names"]]
    if keys != [s["__key__"] for s in samples]:
        failures.append("validation keys differ from webdataset's")
        return
    theirs = torch.stack([tf((s.get("jpg") or s.get("png")).convert("RGB")) for s in samples])
    diff = ((mine - theirs) * torch.tensor(STD).view(1, 3, 1, 1)).abs().max().item() * 255
    print(f"validation inputs: {len(samples)} images, max |trainer - torchvision| = {diff:.3f}/255")
    if diff > 1.0 + 1e-3:
        failures.append(f"validation pixels differ from torchvision's by {diff:.3f}/255")


def flat(batches):
    return [n for b in batches for n in b["names"]]


def check_order(tool, val_shards, failures):
    """The shuffled order. Each rank's epoch-1 batches are read once (a process each) and serve
    both as that order and as the uninterrupted run a loader started at batch 3 must continue."""
    tool = Tool(tool.path, tool.shards, val_shards=val_shards)
    whole = {(1, 0): tool.batches(epoch=1, batch=4)}
    one = flat(whole[1, 0])
    if sorted(one) != sorted(tool.names(shuffle=0, batch=4)) or len(set(one)) != len(one):
        failures.append("a shuffled epoch does not hold every sample once")
    if one == tool.names(epoch=2, batch=4):
        failures.append("epochs 1 and 2 have the same order")
    for r in range(3):  # 3 ranks, 3 streams: each rank one shard
        shards = {shard_of(n) for n in tool.names(epoch=1, batch=4, world=3, rank=r)}
        if len(shards) != 1:
            failures.append(f"rank {r} of 3 read shards {sorted(shards)}")
    for r in range(2):
        whole[2, r] = tool.batches(epoch=1, batch=4, world=2, rank=r)
    two = [flat(whole[2, r]) for r in range(2)]
    if [n for pair in zip(*two) for n in pair] != one:
        failures.append("2 ranks' samples interleaved differ from 1 rank's order")
    for world in (1, 2):
        for r in range(world):
            tail = tool.batches(epoch=1, batch=4, world=world, rank=r, first_batch=3)
            if [b["names"] for b in tail] != [b["names"] for b in whole[world, r][3:]]:
                failures.append(f"rank {r} of {world} started at batch 3 differs from its run")
    print(f"order: {len(one)} samples an epoch, ranks and resumed loaders agree")


def copy_shard(src, dst, drop=None, edit=None):
    """A copy of shard src without members for which drop(name) holds, edit(name, bytes)."""
    with tarfile.open(src) as t, tarfile.open(dst, "w", format=tarfile.USTAR_FORMAT) as out:
        for m in t.getmembers():
            data = t.extractfile(m).read()
            if drop and drop(m.name):
                continue
            data = edit(m.name, data) if edit else data
            m.size = len(data)
            out.addfile(m, io.BytesIO(data))


def with_second_cls(src, dst, key):
    """A copy of shard src in which sample `key` has a second .cls member after its first."""
    with tarfile.open(src) as t, tarfile.open(dst, "w", format=tarfile.USTAR_FORMAT) as out:
        for m in t.getmembers():
            out.addfile(m, io.BytesIO(t.extractfile(m).read()))
            if m.name == key + ".cls":
                info = tarfile.TarInfo(key + ".cls")
                info.size = 1
                out.addfile(info, io.BytesIO(b"4"))


def truncated_copy(src, dst, size):
    shutil.copyfile(src, dst)
    os.truncate(dst, size)


def check_bad(tool, shards_dir, tmp, failures):
    src = os.path.join(shards_dir, "train-000000.tar")
    with tarfile.open(src) as t:
        members = t.getmembers()
    first, second = members[0].name.split(".")[0], members[2].name.split(".")[0]
    cases = {
        "truncated": lambda p: truncated_copy(src, p, members[4].offset_data + 10),
        "without a label": lambda p: copy_shard(src, p, drop=lambda n: n == first + ".cls"),
        "outside [0, 5)": lambda p: copy_shard(
            src, p, edit=lambda n, d: b"7" if n == second + ".cls" else d),
        "two members of one name": lambda p: with_second_cls(src, p, first),
        "unreadable": lambda p: copy_shard(
            src, p, edit=lambda n, d: d[:40] if n.startswith(first + ".") and
            not n.endswith(".cls") else d),
    }
    val = os.path.join(shards_dir, "val-000000.tar")
    want = {"truncated": 2, "without a label": 29, "outside [0, 5)": 29,
            "two members of one name": 29, "unreadable": 30}
    for i, (what, make) in enumerate(cases.items()):
        path = os.path.join(tmp, f"bad{i}.tar")
        make(path)
        if what == "two members of one name":  # the reference: webdataset refuses the shard
            try:
                list(wds.WebDataset(path, shardshuffle=False))
                failures.append("webdataset read a sample with two .cls members")
            except ValueError as e:
                if "duplicate file name" not in str(e):
                    failures.append(f"webdataset's error is not the one expected: {e}")
        skip = tool.run(shards=path, val_shards=val, shuffle=0, batch=4, classes=CLASSES)
        fail = tool.run(shards=path, val_shards=val, shuffle=0, batch=4, classes=CLASSES,
                        on_bad_sample="fail")
        lines = [json.loads(x) for x in skip.stdout.splitlines() if x.startswith("{")]
        read = sum(len(x["names"]) for x in lines)
        bad = sum(x["bad"] for x in lines)
        print(f"{what}: skip -> exit {skip.returncode}, {read} samples, {bad} replaced; "
              f"fail -> exit {fail.returncode}: {fail.stderr.strip()[:160]}")
        if skip.returncode != 0:
            failures.append(f"{what}: skip failed: {skip.stderr}")
        elif read != want[what] or bad != (what == "unreadable"):
            failures.append(f"{what}: {read} samples read, {bad} replaced (want {want[what]})")
        elif what not in skip.stderr + skip.stdout + " unreadable":
            failures.append(f"{what}: no warning that says so: {skip.stderr[-300:]}")
        if fail.returncode != 1 or path not in fail.stderr:
            failures.append(f"{what}: fail gave exit {fail.returncode}: {fail.stderr[-300:]}")


def train(trainer, config, run, *extra, ranks=1):
    cmd = [trainer]
    if ranks > 1:
        cmd += ["launch", "--standalone", "--nproc-per-node", str(ranks), "--"]
    cmd += ["--config", config, "--run-dir", run, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-2000:]}")
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [x["loss"] for x in map(json.loads, f) if x["split"] == "train"]


def check_training(trainer, shards, tmp, failures):
    config = os.path.join(tmp, "wds.yaml")
    with open(config, "w") as f:
        f.write(f"""seed: 3
device: cpu
model: {{name: mlp, hidden: [32]}}
data: {{name: webdataset, shards: "{shards}", image_size: {SIZE}, resize_size: {RESIZE},
       batch_size: 4, workers: 2, shuffle_buffer: 8, hflip: 0.5}}
optim: {{name: sgd, lr: 0.05}}
train: {{epochs: 2}}
run: {{log_every: 1, checkpoint_every: 1, progress: never}}
""")
    whole = train(trainer, config, os.path.join(tmp, "a"))
    b = os.path.join(tmp, "b")
    train(trainer, config, b, "--set", "train.stop_at_step=4")
    resumed = train(trainer, config, b, "--resume", "auto")
    print(f"1 rank: {len(whole)} steps; resumed after step 4: {len(resumed)} steps")
    if not whole or resumed != whole:
        failures.append(f"1 rank: the resumed run's {len(resumed)} losses differ from the "
                        f"uninterrupted {len(whole)}")
    two = train(trainer, config, os.path.join(tmp, "c"), ranks=2)
    d = os.path.join(tmp, "d")
    train(trainer, config, d, "--set", "train.stop_at_step=3", ranks=2)
    on_one = train(trainer, config, d, "--resume", "auto", "--set", "data.batch_size=8")
    diff = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(on_one, two))
    print(f"2 ranks: {len(two)} steps; stopped at 3, resumed on 1 rank: {len(on_one)} steps, "
          f"largest relative difference {diff:.2e}")
    if len(on_one) != len(two) or diff > 1e-5:
        failures.append(f"2 -> 1 ranks: {len(on_one)} vs {len(two)} losses, difference {diff}")


def check_classes(trainer, shards, shards_dir, folder, tmp, failures):
    """classes.txt's names in run a's checkpoint and predict; the config errors about classes."""
    with open(os.path.join(shards_dir, "classes.txt")) as f:
        names = f.read().split()
    run, out = os.path.join(tmp, "a"), os.path.join(tmp, "a.safetensors")
    r = subprocess.run([trainer, "export", "--checkpoint", run, "--out", out],
                       capture_output=True, text=True)
    with safe_open(out, "pt") as f:
        exported = json.loads(f.metadata().get("classes", "[]")) if r.returncode == 0 else None
    image = os.path.join(folder, "val", "class2", "1.jpg")
    r = subprocess.run([trainer, "predict", "--checkpoint", run, "--input", image],
                       capture_output=True, text=True)
    label = r.stdout.split("\t")[1] if r.returncode == 0 and "\t" in r.stdout else r.stderr
    print(f"class names: {names}; exported {exported}; predict's label {label!r}")
    if exported != names or label not in names:
        failures.append(f"class names lost: classes.txt {names}, export {exported}, "
                        f"predict {label!r}")
    dup = os.path.join(tmp, "dup-classes.txt")
    with open(dup, "w") as f:
        f.write("a\nb\na\nc\nd\n")
    two = os.path.join(tmp, "two")
    for split in ("train", "val"):
        for cls in ("a", "b"):
            os.makedirs(os.path.join(two, split, cls))
            Image.new("RGB", (20, 20)).save(os.path.join(two, split, cls, "0.png"))
    def mix(root):
        path = os.path.join(tmp, f"mix-{os.path.basename(root)}.yaml")
        with open(path, "w") as f:
            f.write(f"""device: cpu
model: {{name: mlp, hidden: [8]}}
data: {{name: mix, batch_size: 4, mix: [
  {{name: webdataset, shards: "{shards}", image_size: {SIZE}, resize_size: {RESIZE}}},
  {{name: imagefolder, root: "{root}", image_size: {SIZE}, resize_size: {RESIZE}}}]}}
""")
        return ["--config", path]
    config = ["--config", os.path.join(tmp, "wds.yaml")]
    classes_txt = os.path.join(shards_dir, "classes.txt")
    cases = [
        (config + ["--set", "data.classes=7"], 2,
         f"data.classes: 7 classes, but {classes_txt} names 5"),
        (config + ["--set", f"data.classes_file={dup}"], 2, f"{dup}:3: 'a' again (line 1)"),
        (config + ["--set", "data.shards=" + os.path.join(shards_dir, "t-{000000..999999999}.tar")],
         2, "names more than 1000000 files"),
        (mix(folder), 0, ""),
        (mix(two), 2, "data.mix: data.mix[0] (webdataset) has 5 classes (class0, class1, class2, "
         "class3, class4), data.mix[1] (imagefolder) 2 classes (a, b)"),
    ]
    for args, code, needle in cases:
        r = subprocess.run([trainer, *args, "--run-dir", os.path.join(tmp, "x"), "--dry-run"],
                           capture_output=True, text=True)
        print(f"{' '.join(args[2:]) or 'mix'}: exit {r.returncode}: {r.stderr.strip()[-200:]}")
        if r.returncode != code or needle not in r.stderr:
            failures.append(f"{args}: exit {r.returncode} (want {code}): {r.stderr[-500:]}")


def main():
    trainer, tool_path, source = sys.argv[1:4]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        folder, shards_dir = os.path.join(tmp, "folder"), os.path.join(tmp, "shards")
        write_folder(folder)
        subprocess.run([sys.executable, os.path.join(source, "scripts", "make_shards.py"), folder,
                        shards_dir, "--per-shard", "30"], check=True)
        shards = os.path.join(shards_dir, "train-{000000..000002}.tar")
        val_shards = os.path.join(shards_dir, "val-000000.tar")
        tool = Tool(tool_path, shards)
        check_against_webdataset(tool, shards, val_shards, tmp, failures)
        check_long_names(tool, tmp, val_shards, failures)
        check_order(tool, val_shards, failures)
        check_bad(tool, shards_dir, tmp, failures)
        check_training(trainer, shards, tmp, failures)
        check_classes(trainer, shards, shards_dir, folder, tmp, failures)
        r = subprocess.run([trainer, "--config", os.path.join(tmp, "wds.yaml"), "--run-dir",
                            os.path.join(tmp, "e"), "--set", "data.shards="],
                           capture_output=True, text=True)
        print(f"no data.shards: exit {r.returncode}: {r.stderr.strip()[:200]}")
        if r.returncode != 2 or "data.shards" not in r.stderr:
            failures.append(f"no data.shards: exit {r.returncode}: {r.stderr}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
