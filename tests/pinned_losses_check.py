#!/usr/bin/env python3
"""The losses of a short run, pinned (CTest Arithmetic.ShortRunLossesArePinned).

  pinned_losses_check.py TRAINER [--record]

Trains configs/fashion_mnist_mlp.yaml for 200 steps with `optim.impl: loop` and
`run.flush_denormal: false`, logging every step, and compares every train loss (and the final
validation loss) bit for bit with the pinned ones of the host's CPU
(tests/data/pinned_losses/fashion_mnist_mlp.<vendor_id>-<family>-<model>.json, or else the
vendor's fashion_mnist_mlp.<vendor_id>.json), on 2 threads with ATen's AVX2 kernels and MKL's
reproducible mode (KERNELS), so that the figures do not depend on the host's vector width or
core count: any change of arithmetic, wanted or not, fails here naming the first step whose loss
moved. A change meant to move them reruns this with --record on a host of each kind and says why
in its commit. One file per kind of CPU because MKL's results under MKL_CBWR=COMPATIBLE still
differ between an AMD EPYC and an Intel Xeon (in the last bit of the 14th step's loss); --record
writes the file of the host's vendor, family and model, and a host with neither file skips
(exit 77), naming the file to record.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = 77


def cpu_kind():
    """/proc/cpuinfo's vendor_id (GenuineIntel, AuthenticAMD), cpu family and model, each
    "unknown" where it is missing."""
    kind = {"vendor_id": "unknown", "cpu family": "unknown", "model": "unknown"}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in kind and kind[key.strip()] == "unknown":
                    kind[key.strip()] = value.strip()
                if not line.strip():
                    break  # the first processor's lines
    except OSError:
        pass
    return kind["vendor_id"], kind["cpu family"], kind["model"]


def pinned_file(name):
    return os.path.join(ROOT, "tests", "data", "pinned_losses", f"fashion_mnist_mlp.{name}.json")


VENDOR, FAMILY, MODEL = cpu_kind()
# The file --record writes: this kind of CPU's.
PINNED = pinned_file(f"{VENDOR}-{FAMILY}-{MODEL}")
# The file compared with: this kind's, or else the vendor's.
PINNED_FOR_HOST = next((p for p in (PINNED, pinned_file(VENDOR)) if os.path.exists(p)), None)


SETS = ["train.max_steps=200", "train.epochs=1", "optim.impl=loop", "run.flush_denormal=false",
        "run.log_every=1", "run.eval_every=0", "run.progress=never", "data.workers=1",
        "run.checkpoint_every=0", "run.threads=2"]
# The same kernels on any x86-64 host with AVX2: ATen's AVX2 code path (not AVX-512's, whose
# rounding differs) and MKL's reproducible mode; with AdamW a last-bit difference at one step
# moves the 200-step validation loss by ~3e-3, so the kernels are pinned with the losses.
KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}


def run(trainer, work):
    cmd = [trainer, "--config", os.path.join(ROOT, "configs", "fashion_mnist_mlp.yaml")]
    for s in SETS + [f"run.dir={work}/run"]:
        cmd += ["--set", s]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, **KERNELS))
    if done.returncode != 0:
        print(done.stdout + done.stderr)
        sys.exit(f"the run failed (exit {done.returncode})")
    train, val = [], None
    with open(os.path.join(work, "run", "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("split") == "train":
                train.append([r["step"], r["loss"]])
            elif r.get("split") == "val":
                val = r["loss"]
    return {"sets": SETS, "train": train, "val_loss": val}


def main():
    trainer = sys.argv[1]
    record = "--record" in sys.argv[2:]
    if PINNED_FOR_HOST is None and not record:
        print(f"no losses pinned for this kind of CPU ({VENDOR}, family {FAMILY}, model {MODEL}): "
              f"record {PINNED} with --record")
        sys.exit(SKIP)
    with tempfile.TemporaryDirectory() as work:
        got = run(trainer, work)
    if record:
        with open(PINNED, "w") as f:  # a step a line
            f.write('{"sets": %s,\n "val_loss": %r,\n "train": [\n' % (json.dumps(SETS),
                                                                   got["val_loss"]))
            f.write(",\n".join(f"  [{step}, {loss!r}]" for step, loss in got["train"]))
            f.write("\n]}\n")
        print(f"recorded {len(got['train'])} losses in {PINNED}")
        return
    with open(PINNED_FOR_HOST) as f:
        want = json.load(f)
    if want["sets"] != got["sets"]:
        sys.exit("the pinned run's settings changed: rerun with --record")
    if len(want["train"]) != len(got["train"]):
        sys.exit(f"{len(got['train'])} train losses, {len(want['train'])} pinned")
    for (step, a), (_, b) in zip(got["train"], want["train"]):
        if a != b:
            sys.exit(f"the arithmetic moved: step {step}'s train loss is {a!r}, pinned {b!r} "
                     f"(difference {a - b:.3g}); the first of "
                     f"{sum(x[1] != y[1] for x, y in zip(got['train'], want['train']))} that differ")
    if got["val_loss"] != want["val_loss"]:
        sys.exit(f"the validation loss is {got['val_loss']!r}, pinned {want['val_loss']!r}")
    print(f"{len(got['train'])} train losses and the validation loss equal the pinned ones")


if __name__ == "__main__":
    main()
