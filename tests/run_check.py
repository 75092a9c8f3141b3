"""Shared pieces of the Python-side checks run by CTest."""
import os
import subprocess


def train_synthetic(trainer, source, run_dir, *overrides):
    """Trains configs/synthetic.yaml into run_dir with `--set` overrides; raises on failure."""
    args = [trainer, "--config", os.path.join(source, "configs/synthetic.yaml"),
            "--run-dir", run_dir, "--log-level", "warn"]
    for o in overrides:
        args += ["--set", o]
    subprocess.run(args, check=True)


def report(failures):
    """Prints the failures and returns the process exit code."""
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else "failed")
    return 1 if failures else 0
