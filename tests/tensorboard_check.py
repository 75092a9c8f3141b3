"""Reads trainer's TensorBoard event files with TensorBoard itself.

Usage: tensorboard_check.py TRAINER_BINARY SOURCE_DIR

Trains configs/synthetic.yaml into a temporary run dir, then checks with TensorBoard's
EventAccumulator that the event file holds every scalar of metrics.jsonl (tags, steps, values),
and that a copy cut off in the middle of its last record still reads every complete record.
Exits 77 (skipped) when the tensorboard package is not installed.
"""
import json
import os
import sys
import tempfile
import time

from run_check import report, train_synthetic

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("tensorboard is not installed in this Python; skipping")
    sys.exit(77)


def scalars(tb_dir):
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def expected(run_dir):
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            for key, value in rec.items():
                if key in ("split", "step", "epoch"):
                    continue
                tag = key if key == "lr" else f"{rec['split']}/{key}"
                out.setdefault(tag, []).append((rec["step"], value))
    return out


def main():
    trainer, source = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        started = time.time()
        train_synthetic(trainer, source, run_dir)
        ended = time.time()
        want = expected(run_dir)
        got = scalars(os.path.join(run_dir, "tb"))
        if not want or not got:
            failures.append(f"nothing to compare: {len(want)} tags in metrics.jsonl, {len(got)} read")
        if sorted(got) != sorted(want):
            failures.append(f"tags differ: event file {sorted(got)}, metrics.jsonl {sorted(want)}")
        for tag, points in want.items():
            have = got.get(tag, [])
            if [p[0] for p in have] != [s for s, _ in points]:
                failures.append(f"{tag}: steps {[p[0] for p in have]} != {[s for s, _ in points]}")
            walls = [p[2] for p in have]
            if walls != sorted(walls) or any(not started <= w <= ended for w in walls):
                failures.append(f"{tag}: wall times {walls} not rising within the run "
                                f"[{started}, {ended}]")
            for (_, a, _), (_, b) in zip(have, points):
                if abs(a - b) > 1e-6 * max(1.0, abs(b)):  # stored as float32
                    failures.append(f"{tag}: value {a} != {b}")
                    break

        # Cut the file inside its last record: every earlier record must still read.
        events = [f for f in os.listdir(os.path.join(run_dir, "tb"))]
        if len(events) != 1:
            failures.append(f"expected one event file, found {events}")
        cut_dir = os.path.join(tmp, "cut")
        os.makedirs(cut_dir)
        src = os.path.join(run_dir, "tb", events[0])
        data = open(src, "rb").read()
        open(os.path.join(cut_dir, events[0]), "wb").write(data[:-7])
        cut = scalars(cut_dir)
        total = sum(len(v) for v in got.values())
        kept = sum(len(v) for v in cut.values())
        if kept != total - 1:
            failures.append(f"truncated copy: read {kept} scalars, expected {total - 1}")
        print(f"{sum(len(v) for v in got.values())} scalars under {len(got)} tags compared; "
              f"{kept} read from the truncated copy")
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
