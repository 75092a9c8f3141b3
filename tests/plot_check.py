"""scripts/plot_metrics.py on real run dirs: writes a PNG; a missing run dir is a clear error.

Usage: plot_check.py TRAINER_BINARY SOURCE_DIR
Exits 77 (skipped) when matplotlib is not installed.
"""
import os
import subprocess
import sys
import tempfile

from run_check import report, train_synthetic

try:
    import matplotlib  # noqa: F401
except ImportError:
    print("matplotlib is not installed in this Python; skipping")
    sys.exit(77)


def main():
    trainer, source = sys.argv[1], sys.argv[2]
    plot = os.path.join(source, "scripts", "plot_metrics.py")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for seed in (1, 2):
            run = os.path.join(tmp, f"seed{seed}")
            train_synthetic(trainer, source, run, f"seed={seed}")
            runs.append(run)
        out = os.path.join(tmp, "curves.png")
        r = subprocess.run([sys.executable, plot, *runs, "--out", out], capture_output=True,
                           text=True)
        if r.returncode != 0:
            failures.append(f"plot exited {r.returncode}: {r.stderr}")
        elif open(out, "rb").read(8) != b"\x89PNG\r\n\x1a\n" or os.path.getsize(out) < 10000:
            failures.append(f"{out} is not a plausible PNG ({os.path.getsize(out)} bytes)")

        r = subprocess.run([sys.executable, plot, os.path.join(tmp, "absent"), "--out", out],
                           capture_output=True, text=True)
        if r.returncode == 0 or "absent" not in r.stderr or "Traceback" in r.stderr:
            failures.append(f"missing run dir: exit {r.returncode}, stderr {r.stderr!r}")
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
