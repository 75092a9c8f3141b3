"""train.ema against timm's ModelEmaV3, resume with the average, and the commands that use it.

Usage: ema_check.py TRAINER_BINARY SOURCE_DIR

Trains configs/synthetic.yaml with train.ema and a checkpoint after every step, reads each
step's trained weights from its checkpoint (the last one also through `trainer export --weights
raw`, which must equal them), and replays them through timm.utils.ModelEmaV3 (exclude_buffers: the
parameters averaged, with use_warmup as train.ema.warmup), updating it at the steps train.ema.every
names: the final average must equal the exported one within 1e-6. Then: a run stopped halfway and
resumed ends with the same average and weights, bit for bit; metrics.jsonl has a val_ema record
beside each val one; `trainer eval` scores the average by default and the trained weights with
--weights raw, as the last val_ema and val records say. Exits 77 (skipped) without timm.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from run_check import report, train_synthetic

try:
    from safetensors.torch import load_file
    from timm.utils import ModelEmaV3
except ImportError as e:
    print(f"{e.name} is not installed in this Python; skipping")
    sys.exit(77)


class Weights(torch.nn.Module):
    """The exported tensors as parameters, in a fixed order."""

    def __init__(self, tensors):
        super().__init__()
        self.names = sorted(tensors)
        self.values = torch.nn.ParameterList(
            [torch.nn.Parameter(tensors[n].clone()) for n in self.names])

    def load(self, tensors):
        with torch.no_grad():
            for p, n in zip(self.values, self.names):
                p.copy_(tensors[n])

    def as_dict(self):
        return {n: p.detach() for n, p in zip(self.names, self.values)}


def export(trainer, checkpoint, out, weights):
    subprocess.run([trainer, "export", "--checkpoint", checkpoint, "--out", out,
                    "--weights", weights], check=True, stdout=subprocess.DEVNULL)
    return load_file(out)


def trained_weights(checkpoint):
    """The model's weights in a checkpoint file (its `model.` tensors, named as export names
    them), read directly: what `trainer export --weights raw` writes (checked once below)."""
    return {n[len("model."):]: t for n, t in load_file(checkpoint).items()
            if n.startswith("model.")}


def checkpoints(run_dir):
    folder = os.path.join(run_dir, "checkpoints")
    files = sorted(f for f in os.listdir(folder) if f.startswith("step_") and
                   f.endswith(".safetensors"))
    return [(int(f[5:13]), os.path.join(folder, f)) for f in files]


def records(run_dir, split):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == split]


def compare_with_timm(trainer, source, tmp, steps, decay, warmup, every, failures):
    """The average after `steps` steps against ModelEmaV3 over the exported weights."""
    ema = [f"train.ema.decay={decay}", f"train.ema.warmup={str(warmup).lower()}",
           f"train.ema.every={every}"]
    common = [f"train.max_steps={steps}", "train.epochs=100", "run.checkpoint_every=1",
              "run.keep_last=1000", "run.eval_every=0"]
    run_dir = os.path.join(tmp, f"ema_{every}")
    train_synthetic(trainer, source, run_dir, *common, *ema)
    # The weights the average starts from: those before step 1, the same seed's with lr 0.
    start_dir = os.path.join(tmp, f"start_{every}")
    train_synthetic(trainer, source, start_dir, "train.max_steps=1", "optim.lr=0")
    start = trained_weights(checkpoints(start_dir)[-1][1])
    model = Weights(start)
    reference = ModelEmaV3(model, decay=decay, use_warmup=warmup, exclude_buffers=True)
    saved = checkpoints(run_dir)
    if [s for s, _ in saved] != list(range(1, steps + 1)):
        failures.append(f"every={every}: checkpoints of steps {[s for s, _ in saved]}")
        return
    for step, path in saved:
        model.load(trained_weights(path))
        if step % every == 0:
            reference.update(model, step=step)
    raw = export(trainer, saved[-1][1], os.path.join(tmp, "raw.st"), "raw")
    if sorted(raw) != sorted(start) or any(not torch.equal(raw[n], model.as_dict()[n])
                                           for n in raw):
        failures.append(f"every={every}: export --weights raw differs from the checkpoint's model")
    got = export(trainer, saved[-1][1], os.path.join(tmp, "ema.st"), "ema")
    want = reference.module.as_dict()
    worst = max((got[n] - want[n]).abs().max().item() for n in want)
    moved = max((got[n] - model.as_dict()[n]).abs().max().item() for n in want)
    print(f"every={every} warmup={warmup}: max |trainer - timm| {worst:.3g} over {steps} steps "
          f"(the average differs from the weights by up to {moved:.3g})")
    if sorted(got) != sorted(want) or worst > 1e-6:
        failures.append(f"every={every}: the average differs from timm's by {worst}")
    if moved < 1e-4:
        failures.append(f"every={every}: the average equals the weights; nothing was averaged")


def resume_and_commands(trainer, source, tmp, failures):
    args = ["train.max_steps=24", "train.epochs=100", "run.eval_every=8", "train.ema.decay=0.95",
            "train.ema.warmup=true"]
    whole, split = os.path.join(tmp, "whole"), os.path.join(tmp, "split")
    train_synthetic(trainer, source, whole, *args)
    train_synthetic(trainer, source, split, *args, "train.stop_at_step=13")
    subprocess.run([trainer, "--config", os.path.join(split, "config.yaml"), "--run-dir", split,
                    "--resume", "auto", "--log-level", "warn", "--set", "train.stop_at_step=0"],
                   check=True)
    for weights in ("ema", "raw"):
        a = export(trainer, whole, os.path.join(tmp, "a.st"), weights)
        b = export(trainer, split, os.path.join(tmp, "b.st"), weights)
        if sorted(a) != sorted(b) or any(not torch.equal(a[n], b[n]) for n in a):
            failures.append(f"resumed run: its {weights} weights differ from the whole run's")
    val, val_ema = records(whole, "val"), records(whole, "val_ema")
    if [r["step"] for r in val] != [r["step"] for r in val_ema] or len(val) < 3:
        failures.append(f"val records at {[r['step'] for r in val]}, val_ema at "
                        f"{[r['step'] for r in val_ema]}")
        return
    if val[-1]["loss"] == val_ema[-1]["loss"]:
        failures.append("val and val_ema have the same loss: the average was not evaluated")
    for flag, want in ((None, val_ema[-1]), ("raw", val[-1]), ("ema", val_ema[-1])):
        cmd = [trainer, "eval", "--checkpoint", whole, "--json", "--log-level", "info"]
        if flag:
            cmd += ["--weights", flag]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        got = json.loads(done.stdout)
        if abs(got["loss"] - want["loss"]) > 1e-5:
            failures.append(f"eval --weights {flag}: loss {got['loss']}, the run's {want['loss']}")
        # Which weights were scored is said, in the JSON and the log; nothing of a resume.
        said = flag or "ema"
        if got.get("weights") != said or f"weights: {said}" not in done.stderr:
            failures.append(f"eval --weights {flag}: 'weights' {got.get('weights')!r}, log "
                            f"{done.stderr.strip()!r}")
        if "resuming with" in done.stderr:
            failures.append(f"eval logs a resume's changed keys: {done.stderr.strip()!r}")
    plain = os.path.join(tmp, "plain")
    train_synthetic(trainer, source, plain, "train.max_steps=2")
    r = subprocess.run([trainer, "export", "--checkpoint", plain, "--out",
                        os.path.join(tmp, "x.st"), "--weights", "ema"],
                       capture_output=True, text=True)
    if r.returncode != 2 or "holds no average" not in r.stderr:
        failures.append(f"export --weights ema without an average: exit {r.returncode}, "
                        f"{r.stderr.strip()}")


def main():
    trainer, source = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        compare_with_timm(trainer, source, tmp, 50, 0.99, True, 1, failures)
        compare_with_timm(trainer, source, tmp, 24, 0.9, False, 3, failures)
        resume_and_commands(trainer, source, tmp, failures)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
