"""Time-to-accuracy reference: the trainer's LeNet recipe on Fashion-MNIST in plain PyTorch.

    python scripts/time_to_accuracy.py --config RESOLVED.yaml [--target 0.916]

trains with a Dataset + DataLoader, evaluates top-1 on the 10,000 t10k images after every epoch
and stops after the first epoch whose top-1 reaches --target. Prints one JSON line on stdout
(progress goes to stderr). scripts/time_to_accuracy.sh runs it beside the trainer.

--config is best the resolved config of `trainer --print-config --config FILE` (every key
present); keys missing from it take the trainer's defaults (src/config/config.h). The recipe
mirrored, with the trainer source it comes from:

- data (src/data/image/fashion_mnist.cpp, memory_images.cpp): the IDX files, inputs x / 255
  normalised with the mean and population std of the training bytes, computed in float32 as
  x * (1 / (255 std)) + (-mean / std); the same statistics for t10k; no augmentation.
- loader (src/engine/loop/trainer.cpp): batch data.batch_size, reshuffled every epoch, last
  incomplete batch dropped (data.drop_last); evaluation in order, batch data.eval_batch_size
  (0 = batch_size), nothing dropped; data.workers loader workers for both.
- model (models/lenet.cpp): scripts/reference_models.Lenet, PyTorch's default initialisation
  (LibTorch's Conv2d/Linear initialise the same way), created right after torch.manual_seed(seed)
  as the trainer does, so the initial weights are the same tensors.
- optimizer (src/optim/optimizer.cpp): SGD, momentum, Nesterov, L2 weight decay on the weights
  only: parameters of dim <= 1 (biases) are in a group without decay unless
  optim.decay_bias_and_norm.
- schedule (src/optim/schedule.cpp): per optimizer step t (0-based), warmup
  lr * (f + (1 - f) (t + 1) / W) for t < W, then min + (lr - min) (1 + cos(pi p)) / 2 with
  p = clamp((t - W) / (T - W), 0, 1), T = epochs x steps per epoch (the whole run, even when it
  stops early at the target).
- loss (src/losses/loss.cpp): mean cross-entropy with train.label_smoothing.
- evaluation (Trainer::evaluate): model.eval(), no_grad, top-1 = first index of topk.

What cannot be the same: the sample order and the dropout masks (the trainer draws them from its
own generators), so the two runs are the same recipe, not the same numbers.
"""
import argparse
import json
import math
import os
import sys
import time


def _process_start():
    """Seconds on CLOCK_BOOTTIME at which this process started (/proc), else now."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime, in clock ticks after boot
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.clock_gettime(time.CLOCK_BOOTTIME)


START = _process_start()


def since_start():
    return time.clock_gettime(time.CLOCK_BOOTTIME) - START


import torch  # noqa: E402  (after START: the import is part of the measured time)
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_models import DEFAULT_ROOT, Lenet, find, load_train, read_idx  # noqa: E402

# The trainer's defaults (src/config/config.h) for the keys used here.
DEFAULTS = {
    "seed": 0,
    "run": {"threads": 0},
    "model": {"name": "mlp", "num_classes": 0, "channels": [32, 64], "kernel_size": 5,
              "fc_hidden": 128, "dropout": 0.0, "activation": "relu", "checkpointing": "none",
              "pretrained": ""},
    "data": {"name": "synthetic", "root": "", "batch_size": 128, "eval_batch_size": 0,
             "workers": 2, "shuffle": True, "drop_last": True, "normalize": True, "mean": [],
             "std": [], "crop_padding": 0, "hflip": 0.0},
    "train": {"epochs": 1, "max_steps": 0, "grad_accum_steps": 1, "clip_grad_norm": 0.0,
              "label_smoothing": 0.0, "loss": "cross_entropy"},
    "optim": {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0,
              "decay_bias_and_norm": False},
    "sched": {"name": "constant", "warmup_steps": 0, "warmup_epochs": 0.0,
              "warmup_start_factor": 0.0, "min_lr": 0.0},
    "amp": {"enabled": False},
}


def load_config(path):
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if "base" in raw:
        sys.exit(f"{path}: has a base: chain; pass the resolved config "
                 "(trainer --print-config --config FILE > resolved.yaml)")
    cfg = {}
    for key, value in DEFAULTS.items():
        if isinstance(value, dict):
            cfg[key] = {**value, **(raw.get(key) or {})}
        else:
            cfg[key] = raw.get(key, value)
    return cfg


def check_recipe(cfg):
    """Stops when the config asks for something this reference does not mirror."""
    m, d, t, o, s = cfg["model"], cfg["data"], cfg["train"], cfg["optim"], cfg["sched"]
    wrong = []
    expect = [("model.name", m["name"], "lenet"), ("model.activation", m["activation"], "relu"),
              ("model.num_classes", m["num_classes"], 0), ("model.pretrained", m["pretrained"], ""),
              ("data.name", d["name"], "fashion_mnist"), ("data.crop_padding", d["crop_padding"], 0),
              ("data.hflip", float(d["hflip"]), 0.0), ("data.mean", list(d["mean"]), []),
              ("train.max_steps", t["max_steps"], 0), ("train.grad_accum_steps", t["grad_accum_steps"], 1),
              ("train.clip_grad_norm", float(t["clip_grad_norm"]), 0.0),
              ("train.loss", t["loss"], "cross_entropy"), ("optim.name", o["name"], "sgd"),
              ("sched.name", s["name"], "cosine"), ("amp.enabled", cfg["amp"]["enabled"], False)]
    for key, got, want in expect:
        if got != want:
            wrong.append(f"{key}: {got!r} (this reference supports only {want!r})")
    if wrong:
        sys.exit("time_to_accuracy.py: " + "; ".join(wrong))


class FashionMnist(Dataset):
    """uint8 images [N, 1, H, W] in memory; a sample is normalised when fetched."""

    def __init__(self, images, labels, mean, std, normalize=True):
        self.images, self.labels = images, labels
        # As data/image/memory_images.cpp: x -> x * scale + shift with float32 scale and shift.
        self.scale = float(torch.tensor(1.0 / (255.0 * std) if normalize else 1.0 / 255.0,
                                        dtype=torch.float32))
        self.shift = float(torch.tensor(-mean / std if normalize else 0.0, dtype=torch.float32))

    def __len__(self):
        return self.images.size(0)

    def __getitem__(self, i):
        return self.images[i].float().mul_(self.scale).add_(self.shift), self.labels[i]


def load_test(root):
    images = read_idx(find(root, "t10k-images-idx3-ubyte")).unsqueeze(1).contiguous()
    labels = read_idx(find(root, "t10k-labels-idx1-ubyte")).long()
    return images, labels


class Schedule:
    """src/optim/schedule.cpp: linear warmup, then cosine to min_lr; lr(t) for update t >= 0."""

    def __init__(self, sched, base_lr, total_steps, steps_per_epoch):
        self.base = base_lr
        self.warmup = sched["warmup_steps"]
        if sched["warmup_epochs"] > 0:
            # std::llround: halves away from zero (Python's round() rounds them to even).
            self.warmup = int(math.floor(sched["warmup_epochs"] * steps_per_epoch + 0.5))
        self.start = sched["warmup_start_factor"]
        self.min = sched["min_lr"]
        self.decay_steps = max(total_steps - self.warmup, 0)

    def lr(self, t):
        if t < self.warmup:
            frac = (t + 1) / self.warmup
            return self.base * (self.start + (1.0 - self.start) * frac)
        t -= self.warmup
        p = 1.0 if self.decay_steps <= 0 else min(max(t / self.decay_steps, 0.0), 1.0)
        return self.min + (self.base - self.min) * 0.5 * (1.0 + math.cos(math.pi * p))


def make_model(m, in_shape):
    model = Lenet(channels=tuple(m["channels"]), kernel_size=m["kernel_size"],
                  fc_hidden=m["fc_hidden"], num_classes=10, in_shape=in_shape,
                  dropout=m["dropout"])
    model.train()
    return model


def make_optimizer(model, o):
    """src/optim/optimizer.cpp: one group with weight decay, one (biases) without."""
    split = o["weight_decay"] > 0 and not o["decay_bias_and_norm"]
    decay = [p for p in model.parameters() if not (split and p.dim() <= 1)]
    no_decay = [p for p in model.parameters() if split and p.dim() <= 1]
    groups = [{"params": decay}] if decay else []
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.SGD(groups, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                           weight_decay=o["weight_decay"])


def train_step(model, optimizer, lr, x, y, label_smoothing):
    """Trainer::State::train_step without accumulation, clipping or AMP."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y, label_smoothing=label_smoothing)
    loss.backward()
    for g in optimizer.param_groups:
        g["lr"] = lr
    optimizer.step()
    return loss.detach()


def evaluate(model, loader):
    model.eval()
    correct = loss_sum = count = 0
    with torch.no_grad():
        for x, y in loader:
            logits = model(x).float()
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int(logits.topk(min(5, logits.size(1)), 1).indices[:, 0].eq(y).sum())
            count += y.size(0)
    model.train()
    return correct / count, loss_sum / count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/fashion_mnist_lenet.yaml",
                    help="the resolved config (trainer --print-config); default %(default)s")
    ap.add_argument("--target", type=float, default=0.916, help="top-1 fraction to reach")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads; 0 = run.threads, or when that is 0 LibTorch's default "
                         "(what the trainer uses)")
    ap.add_argument("--train-subset", type=int, default=0,
                    help="quick checks: train on the first N images only (0 = all)")
    ap.add_argument("--test-subset", type=int, default=0,
                    help="quick checks: evaluate on the first N t10k images only (0 = all)")
    ap.add_argument("--epochs", type=int, default=0,
                    help="quick checks: stop after this many epochs (the schedule still spans "
                         "train.epochs); 0 = train.epochs")
    args = ap.parse_args()

    cfg = load_config(args.config)
    check_recipe(cfg)
    m, d, t, o = cfg["model"], cfg["data"], cfg["train"], cfg["optim"]
    threads = args.threads or cfg["run"]["threads"] or torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(cfg["seed"])

    root = d["root"].rstrip("/") if d["root"] else DEFAULT_ROOT
    train_images, train_labels, mean, std = load_train(root)  # statistics of all 60,000
    test_images, test_labels = load_test(root)
    if args.train_subset:
        train_images, train_labels = train_images[:args.train_subset], train_labels[:args.train_subset]
    if args.test_subset:
        test_images, test_labels = test_images[:args.test_subset], test_labels[:args.test_subset]
    train_set = FashionMnist(train_images, train_labels, mean, std, d["normalize"])
    test_set = FashionMnist(test_images, test_labels, mean, std, d["normalize"])

    # The model right after the seed, as the trainer (its data set draws no random numbers).
    model = make_model(m, tuple(train_images.shape[1:]))
    optimizer = make_optimizer(model, o)

    workers = d["workers"]
    common = dict(num_workers=workers, persistent_workers=workers > 0)
    train_loader = DataLoader(train_set, batch_size=d["batch_size"], shuffle=d["shuffle"],
                              drop_last=d["drop_last"], **common)
    test_loader = DataLoader(test_set, batch_size=d["eval_batch_size"] or d["batch_size"],
                             shuffle=False, drop_last=False, **common)
    steps_per_epoch = len(train_loader)
    epochs = t["epochs"]
    schedule = Schedule(cfg["sched"], o["lr"], epochs * steps_per_epoch, steps_per_epoch)
    max_epochs = min(args.epochs, epochs) if args.epochs else epochs
    print(f"pytorch {torch.__version__}: {threads} threads, {workers} loader worker(s), "
          f"{len(train_set)} train / {len(test_set)} test, {steps_per_epoch} steps per epoch, "
          f"schedule over {epochs * steps_per_epoch} steps, target top-1 {args.target}",
          file=sys.stderr, flush=True)

    step = 0
    top1s, losses = [], []
    seconds_to_target = None
    for epoch in range(max_epochs):
        for x, y in train_loader:
            train_step(model, optimizer, schedule.lr(step), x, y, t["label_smoothing"])
            step += 1
        top1, eval_loss = evaluate(model, test_loader)
        top1s.append(top1)
        losses.append(eval_loss)
        print(f"epoch {epoch} step {step}: loss {eval_loss:.4f} top1 {100 * top1:.2f}% "
              f"({since_start():.1f} s since start)", file=sys.stderr, flush=True)
        if top1 >= args.target:
            seconds_to_target = since_start()
            break

    print(json.dumps({
        "implementation": "pytorch",
        "target": args.target,
        "reached": seconds_to_target is not None,
        "epochs": len(top1s),
        "top1": top1s,
        "loss": losses,
        "steps": step,
        "seconds_to_target": seconds_to_target,
        "wall_seconds": since_start(),
        "torch": torch.__version__,
        "threads": threads,
        "workers": workers,
        "train_samples": len(train_set),
        "test_samples": len(test_set),
    }), flush=True)


if __name__ == "__main__":
    main()
