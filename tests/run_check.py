"""Shared pieces of the Python-side checks run by CTest."""
import os
import subprocess


def one_intra_op_thread():
    """One LibTorch intra-op thread for this process and the trainers and tools it starts, unless
    the caller chose a count. CTest runs the tests side by side on every core, where the threads
    of one process (this one's torch, and the trainer's under run.threads 0) wait a scheduler
    slice for each other at every operator: many times slower than one thread. Call it before
    torch is imported."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


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
