#!/usr/bin/env python3
"""model.lora's frozen base loaded without a float32 model anywhere (CTest Lora.*: see below).

  lora_load_check.py TRAINER [--losses | --drawn | --memory | --memory-all | --memory-qlora]

Each option runs one part (CTest: Lora.BaseReadInItsDtypeTrainsAsTheWholeBuild,
Lora.AdaptersAsDrawnAreTheSameInEveryLayout, Lora.BaseLoadsInItsOwnDtype); none runs them all;
--memory-all measures 2 in every layout on a 2.84 GB folder (the figures of docs/benchmarks.md),
--memory in one process on a 1.78 GB one (CTest's, the same limit).

1. The same adapters in every layout: a LoRA run's 3 AdamW steps give, bit for bit, the losses of
   the same run that builds the whole model first (model.pretrained_skip_head: true takes that
   path; the folder holds every tensor, so nothing is re-initialised), in one process and under
   `trainer launch --nproc-per-node 2` with dist.strategy fsdp and with dist.tp_size 2, and on 4
   processes with both (each rank reading only what it keeps from the folder). The adapters are drawn from the run's seed alone,
   so how the base was built does not change them.
2. Memory: a random bf16 Llama folder (2.84 GB, or 1.78 GB with --memory) with model.lora and
   base_dtype bfloat16, loaded (--dry-run=load: built, loaded, sharded or split, adapters attached,
   then exits). The growth of the peak RSS over a process that holds no model (the same config's
   --dry-run=plan: a planned model has no parameter storage) is at most 1.15x the folder's bytes in
   one process (the base in bfloat16, read from the files straight into it), and (--memory-all) at
   most 0.6x under fsdp and under tp 2 over 2 processes (each rank's half of the bf16 base) and
   under both on 4 (a quarter); with
   --memory-all or --memory-qlora, at most 0.4x in one process with model.lora.base_quant: nf4 (the
   linear layers quantized as each is read: 0.516 bytes a parameter).
"""
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_llama_check import (LAUNCH2, LAUNCH4, STREAMED, big_folder, cases, peak_rss_of,  # noqa: E402
                            run_config, save_folder, train_losses)

LORA = ["model.lora.rank=4", "model.lora.base_dtype=bfloat16"]
# label, launcher, settings, the most growth allowed as a multiple of the folder's bytes
LAYOUTS = (("one process", [], [], 1.15), ("fsdp", LAUNCH2, ["dist.strategy=fsdp"], 0.6),
           ("tp 2", LAUNCH2, ["dist.tp_size=2"], 0.6),
           ("fsdp x tp 2", LAUNCH4, ["dist.strategy=fsdp", "dist.tp_size=2"], 0.6))
# QLoRA: the linear layers held in NF4 (0.516 bytes a parameter against bf16's 2), quantized as
# each is read: the base never exists unquantized (0.26x the folder, plus the quantization
# temporaries of one layer).
QLORA = (("one process, nf4", [], ["model.lora.base_quant=nf4"], 0.4),)


def run(trainer, launch, config, sets, run_dir):
    args = [trainer, *launch, "--config", config, "--run-dir", run_dir]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True)


def same_losses_as_whole_build(trainer, work):
    """1. Streamed (or unwritten) base against the whole-model build, per layout, bit for bit."""
    common = LORA + ["train.max_steps=3", "optim.name=adamw", "optim.lr=0.01", "run.log_every=1"]
    folder = os.path.join(work, "lora_parts")
    save_folder(cases()[0][1], folder, dtype=torch.bfloat16)
    config = run_config(work, "lora_parts", folder)
    for label, launch, sets, _ in LAYOUTS:
        losses = {}
        for path, extra in (("read", []), ("whole", ["model.pretrained_skip_head=true"])):
            run_dir = os.path.join(work, f"{label.replace(' ', '_')}_{path}")
            r = run(trainer, launch, config, common + sets + extra, run_dir)
            if r.returncode != 0:
                sys.exit(f"{label}: the LoRA run ({path}) failed: {r.stdout}{r.stderr}")
            if launch and (STREAMED in r.stdout + r.stderr) != (path == "read"):
                sys.exit(f"{label}: the {path} run took the other loading path: {r.stderr}")
            losses[path] = train_losses(run_dir)
        if len(losses["read"]) != 3 or losses["read"] != losses["whole"]:
            sys.exit(f"{label}: LoRA losses with the base read in its dtype {losses['read']} != "
                     f"the whole model's {losses['whole']}")
        print(f"LoRA, {label}: losses {losses['read']} equal the whole-model build's bit for bit")


def same_adapters_every_layout(trainer, work):
    """1. The adapters as drawn are the same tensors in every layout."""
    folder = os.path.join(work, "lora_parts")
    save_folder(cases()[0][1], folder, dtype=torch.bfloat16)
    config = run_config(work, "lora_parts", folder)
    # The adapters as drawn (one step at learning rate 0), exported with --format peft: the same
    # tensors in every layout.
    drawn = {}
    for label, launch, sets, _ in LAYOUTS:
        run_dir = os.path.join(work, f"{label.replace(' ', '_')}_drawn")
        r = run(trainer, launch, config, LORA + sets + ["train.max_steps=1", "optim.lr=0"], run_dir)
        out = run_dir + "_peft"
        e = subprocess.run([trainer, "export", "--checkpoint", run_dir, "--out", out, "--format",
                            "peft"], capture_output=True, text=True)
        if r.returncode != 0 or e.returncode != 0:
            sys.exit(f"{label}: the lr-0 run or its export failed: {r.stderr}{e.stderr}")
        drawn[label] = load_file(os.path.join(out, "adapter_model.safetensors"))
    ours = drawn["one process"]
    for label, tensors in drawn.items():
        if tensors.keys() != ours.keys() or any(not torch.equal(tensors[k], ours[k]) for k in ours):
            sys.exit(f"{label}: the adapters as drawn differ from one process's")
    print(f"the adapters as drawn ({len(ours)} tensors) are equal in all three layouts")


def peak_growth(trainer, launch, config, sets):
    """(peak RSS of the largest process of a --dry-run=load, that of a --dry-run=plan)."""
    peaks = []
    for mode in ("load", "plan"):
        args = [trainer, *launch, "--config", config, f"--dry-run={mode}",
                "--set", "data.num_classes=256"]
        for s in sets:
            args += ["--set", s]
        code, err, peak = peak_rss_of(args)
        if code != 0:
            sys.exit(f"--dry-run={mode} {' '.join(sets)} failed: {err}")
        if mode == "load" and launch and STREAMED not in err:
            sys.exit(f"{' '.join(sets)}: the ranks did not read their parts from the folder: {err}")
        peaks.append(peak)
    return peaks


def memory(trainer, work, layouts, layers=8):
    """2. The peak RSS growth of each layout against the folder's bytes (8 layers: 2.84 GB; 5:
    1.78 GB, CTest's)."""
    folder, total = big_folder(work, layers=layers)
    assert total >= 0.35e9 * layers, total
    config = run_config(work, "lora_big", folder)
    failed = []
    for label, launch, sets, limit in layouts:
        load, start = peak_growth(trainer, launch, config, LORA + sets)
        growth = load - start
        print(f"LoRA memory, {label}: {total / 1e9:.2f} GB bf16 folder; the largest process's peak "
              f"RSS {load / 1e9:.2f} GB, {start / 1e9:.2f} GB without a model: growth "
              f"{growth / 1e9:.2f} GB = {growth / total:.2f}x the folder (limit {limit}x)")
        if growth > limit * total:
            failed.append(f"{label}: growth {growth} > {limit} x {total}")
    if failed:
        sys.exit("; ".join(failed))


def main():
    trainer = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    with tempfile.TemporaryDirectory() as work:
        if mode in ("", "--losses"):
            same_losses_as_whole_build(trainer, work)
        if mode in ("", "--drawn"):
            same_adapters_every_layout(trainer, work)
        if mode in ("", "--memory", "--memory-all"):
            if mode == "--memory-all":
                memory(trainer, work, LAYOUTS + QLORA)
            else:  # CTest's: half the layers, the same limit
                memory(trainer, work, LAYOUTS[:1], layers=5)
        if mode == "--memory-qlora":
            memory(trainer, work, QLORA)


if __name__ == "__main__":
    main()
