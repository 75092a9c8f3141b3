#!/usr/bin/env python3
"""The memory plan against the memory a run takes
(CTests Doctor.MemoryPlanMatchesTheMeasuredPeak.Full, .Blocks, .Lora, .Qlora, .Fsdp, .Tp).

  memory_plan_check.py TRAINER [--layouts KEY,KEY...] [--print]

For six layouts of one Llama-shaped model from a Hugging Face folder (full fine-tune, full with
`model.checkpointing: blocks`, LoRA over a bf16 base, QLoRA over an NF4 base, fsdp on 2
processes, tensor parallelism 2), `trainer doctor --config X --json --gpus N` predicts the
peak memory of one process of the job (memory.plan.per_process_bytes), and the job is run:
`trainer bench --warmup 1 --steps 1 --count-steps 0` trains two real steps (the second with the
optimizer's state, the gradients and the activations all held) and no more, and its
largest process's peak RSS, less the process's resident memory before it built the run (bench's
`resident_before_build_mb`), is the measured growth. Each prediction must be within 15% of its
measurement. The trainer maps tensors of 1 MiB and more on their own
(src/cli/main.cpp), so that the resident memory follows the tensors held: with glibc's moving
threshold the freed activations stay in the heap and the growth is 16-37% above the plan.

The plan adds no CUDA context or NCCL buffers here (the configs run on the CPU); its parts are
printed for each layout. --layouts runs only the layouts of those keys (full, blocks, lora, qlora,
fsdp, tp; default all): CTest runs each layout as a test of its own.
--print prints the figures and skips the limit.
Exits 77 (skipped) when transformers is not installed.
"""
import json
import os
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

try:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

from hf_llama_check import llama_shapes, peak_rss_of  # noqa: E402

LIMIT = 0.15
HIDDEN, INTER, LAYERS, HEADS, KV, VOCAB = 1024, 2816, 4, 16, 4, 16384
SEQ, BATCH = 256, 4
LAUNCH2 = ["launch", "--standalone", "--nproc-per-node", "2", "--"]
LORA = ["model.lora.rank=8", "model.lora.base_dtype=bfloat16"]
# key, label, processes, settings
LAYOUTS = (
    ("full", "full", 1, []),
    ("blocks", "full, checkpointing blocks", 1, ["model.checkpointing=blocks"]),
    ("lora", "LoRA, bf16 base", 1, LORA),
    ("qlora", "QLoRA, nf4 base", 1, LORA + ["model.lora.base_quant=nf4"]),
    ("fsdp", "fsdp, 2 processes", 2, ["dist.strategy=fsdp"]),
    ("tp", "tp 2", 2, ["dist.tp_size=2"]),
)


def llama_folder(work):
    """A random bf16 Llama folder (written tensor by tensor: no transformers init)."""
    folder = os.path.join(work, "llama")
    os.makedirs(folder)
    LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
                num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV,
                max_position_embeddings=SEQ, tie_word_embeddings=False, bos_token_id=None,
                eos_token_id=None).save_pretrained(folder)
    shapes = llama_shapes(HIDDEN, INTER, LAYERS, HEADS, KV, VOCAB)
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        t = torch.ones(shape) if name.endswith("norm.weight") else \
            torch.randn(shape, generator=gen) * 0.02
        tensors[name] = t.to(torch.bfloat16)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    return folder


def write_config(work, folder):
    path = os.path.join(work, "plan.yaml")
    with open(path, "w") as f:
        f.write("\n".join([
            "seed: 1", "device: cpu", "model:", f"  pretrained: {folder}", "data:",
            "  name: synthetic_tokens", f"  num_classes: {VOCAB}", f"  seq_len: {SEQ}",
            "  train_samples: 64", "  val_samples: 4", f"  batch_size: {BATCH}", "  workers: 0",
            "train:", "  max_steps: 4", "optim:", "  name: adamw", "  lr: 0.0001", "run:",
            "  progress: never", "  tensorboard: false", ""]))
    return path


def sets_args(sets):
    return [a for s in sets for a in ("--set", s)]


def predicted(trainer, config, processes, sets):
    """The plan's per-process peak and its parts (doctor --json's memory.plan)."""
    r = subprocess.run([trainer, "doctor", "--json", "--config", config, "--gpus", str(processes),
                        *sets_args(sets)], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        sys.exit(f"doctor {' '.join(sets)} failed ({r.returncode}): {r.stderr}")
    return json.loads(r.stdout)["memory"]["plan"]


def measured(trainer, config, processes, sets, work):
    """(peak RSS growth of the largest process of the job over the process before it built the
    run, the peak, that start): `trainer bench`'s resident_before_build_mb (rank 0's) and the
    largest process's peak RSS."""
    launch = LAUNCH2 if processes == 2 else []
    out = os.path.join(work, "bench.json")
    code, err, peak = peak_rss_of([trainer, *launch, "bench", "--config", config, "--steps", "1",
                                   "--warmup", "1", "--count-steps", "0", "--json", out,
                                   *sets_args(sets)])
    if code != 0:
        sys.exit(f"bench {' '.join(sets)} failed: {err}")
    with open(out) as f:
        start = json.load(f)["resident_before_build_mb"] * 2**20
    return peak - start, (peak, start)


def mb(n):
    return f"{n / 2**20:.0f} MiB"


def chosen_layouts(args):
    """The layouts --layouts names (all without it); exits 2 on an unknown key."""
    if "--layouts" not in args:
        return LAYOUTS
    keys = args[args.index("--layouts") + 1].split(",")
    unknown = set(keys) - {layout[0] for layout in LAYOUTS}
    if unknown:
        print(f"memory_plan_check.py: unknown layout {sorted(unknown)}; "
              f"known: {', '.join(layout[0] for layout in LAYOUTS)}", file=sys.stderr)
        sys.exit(2)
    return [layout for layout in LAYOUTS if layout[0] in keys]


def main():
    trainer = sys.argv[1]
    only_print = "--print" in sys.argv[2:]
    layouts = chosen_layouts(sys.argv[2:])
    failures = []
    with tempfile.TemporaryDirectory() as work:
        config = write_config(work, llama_folder(work))
        for _, label, processes, sets in layouts:
            plan = predicted(trainer, config, processes, sets)
            growth, (run_peak, start) = measured(trainer, config, processes, sets, work)
            want = plan["per_process_bytes"]
            error = (want - growth) / growth
            parts = ", ".join(f"{k} {mb(v)}" for k, v in plan["parts"].items())
            print(f"{label}: planned {mb(want)} ({parts}); measured {mb(growth)} "
                  f"(peak RSS {mb(run_peak)}, start-up {mb(start)}): {error:+.1%}")
            if abs(error) > LIMIT and not only_print:
                failures.append(f"{label}: planned {want} against measured {growth} "
                                f"({error:+.1%}, limit {LIMIT:.0%})")
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
