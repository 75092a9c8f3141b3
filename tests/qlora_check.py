#!/usr/bin/env python3
"""The trainer's QLoRA (model.lora.base_quant) against PEFT over bitsandbytes 0.50.2 (CTest
Lora.QloraEqualsPeftAndBitsandbytes).

  qlora_check.py TRAINER

The base, data and adapters are lora_check.py's: a tiny random LlamaForCausalLM (widths 128 and
256, multiples of bitsandbytes' 64-value blocks) saved by save_pretrained, four 64-token windows in
every batch, rank-16 adapters on every projection, AdamW with clipping at a constant rate.

1. nf4: a one-step run at learning rate 0, exported with `trainer export --format peft`, holds
   the adapters as initialised; loaded by PeftModel.from_pretrained over transformers' 4-bit load
   of the base (BitsAndBytesConfig: nf4, double quantization, float32 compute; quantized from the
   float32 weights, checked) after peft.prepare_model_for_kbit_training, 20 steps of
   torch.optim.AdamW equal the trainer's 20 steps: every step's loss within 1e-5 relative. The
   same adapters over the unquantized base (plain PEFT) train to losses more than 1e-4 apart
   (about 1e-2), so a trainer that ignored base_quant would fail.
2. int8 likewise (BitsAndBytesConfig(load_in_8bit=True): Linear8bitLt, whose training forward on
   the CPU is MatMul8bitFp over CB and SCB of the float16-cast weight, checked): 20 steps within
   1e-5, more than 1e-4 from plain PEFT (about 2e-3).
3. `trainer bench`'s held_bytes.quantized, the bytes the quantized layers hold, per parameter of
   those layers (every nn.Linear weight but lm_head, counted in the transformers model): at most
   0.53 with nf4 (4 bits and the blocks' scales), at most 1.05 with int8 (a byte and a float32
   scale per row).
4. The trained nf4 adapters, exported for PEFT and loaded onto the quantized base, score the
   windows as `trainer eval` does (1e-4 relative; the reference's Linear4bit kept off
   bitsandbytes' bfloat16 inference kernel for AVX-512-BF16 CPUs, which the training forward never
   takes).
5. Bad input, exit 2 and a last line naming model.lora.base_quant and what is wrong (not an
   unknown key): base_quant without adapters (no model.lora.rank; rank 0: the line names the
   rank), with dist.strategy fsdp on two processes (names fsdp), and fp4 (names the values).
6. A folder transformers saved quantized (save_pretrained of the nf4 load: packed weights,
   absmax, quant_map, nested_*, quant_state) trains without base_quant in the config (config.json's
   quantization_config sets it): the first step's loss at learning rate 0, the base's (B is zero),
   equals transformers' loss of that folder loaded as saved within 1e-4; without model.lora it
   exits 2 naming model.pretrained and model.lora.rank.
7. nf4 under ddp on two processes (two windows each) trains as one process does: 10 steps
   within 1e-5 relative; with model.checkpointing: blocks (each block recomputed, the quantized
   layers dequantized again) the losses equal those without, bit for bit.
8. `export --format hf --merge` of the nf4 run: the dequantized base with the adapters merged,
   logits within 1e-5 of PEFT's merge_and_unload over transformers' dequantize() of the 4-bit
   load.

Exits 77 (skipped) when transformers, peft or bitsandbytes is not installed.
"""
import json
import os
import sys
import tempfile
import warnings

from run_check import one_intra_op_thread

one_intra_op_thread()  # before torch is imported

try:
    import torch
    import torch.nn.functional as F
    from lora_check import (SEQ, VOCAB, WINDOWS, Trainer, peft_losses, peft_model, report, run,
                            save_base, worst)
    from peft import PeftModel, prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig, LlamaForCausalLM
    from window_runs import relative, write_windows

    with warnings.catch_warnings():  # bitsandbytes warns that torch.jit is deprecated
        warnings.simplefilter("ignore")
        import bitsandbytes as bnb
    import bitsandbytes.functional as bnb_f
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

STEPS = 20
LOSS_TOL, EVAL_TOL, APART = 1e-5, 1e-4, 1e-4
BYTES_PER_PARAM = {"nf4": 0.53, "int8": 1.05}
QUANTIZED = {"nf4": bnb.nn.Linear4bit, "int8": bnb.nn.Linear8bitLt}


class QloraTrainer(Trainer):
    """lora_check's Trainer with `lora_keys` added to model.lora (a section made when the run
    has no adapters)."""

    def __init__(self, binary, work, base, folders, lora_keys):
        super().__init__(binary, work, base, folders)
        self.lora_keys = lora_keys

    def config(self, name, **options):
        path = super().config(name, **options)
        with open(path) as f:
            config = json.load(f)
        config["model"].setdefault("lora", {}).update(self.lora_keys)
        with open(path, "w") as f:
            json.dump(config, f)  # JSON is YAML
        return path


def bnb_config(quant):
    if quant == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=torch.float32)
    return BitsAndBytesConfig(load_in_8bit=True)


def quantized_base(folder, quant):
    """transformers' bitsandbytes load of the float32 base, prepared for k-bit training as a
    QLoRA script prepares it (no gradient checkpointing: the trainer's run has none)."""
    model = LlamaForCausalLM.from_pretrained(folder, quantization_config=bnb_config(quant),
                                             dtype=torch.float32, device_map="cpu")
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def linear_weights(folder):
    """{name: float32 weight} of every nn.Linear of the base but lm_head: the quantized layers."""
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return {name: m.weight.detach() for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name != "lm_head"}


def check_reference_quantized(model, quant, weights, failures):
    """The reference quantized exactly the layers the trainer does, from their float32 weights:
    nf4 as quantize_4bit(w, 64, nf4, compress_statistics=True); int8 CB and SCB of w.half()."""
    layers = {name.removeprefix("base_model.model.").removesuffix(".base_layer"): m
              for name, m in model.named_modules() if isinstance(m, QUANTIZED[quant])}
    if sorted(layers) != sorted(weights):
        failures.append(f"{quant}: bitsandbytes quantized {sorted(layers)}, expected "
                        f"{sorted(weights)}")
        return
    for name, m in layers.items():
        w = weights[name]
        if quant == "nf4":
            packed, state = bnb_f.quantize_4bit(w, blocksize=64, quant_type="nf4",
                                                compress_statistics=True)
            same = (m.weight.quant_state.dtype == torch.float32
                    and torch.equal(m.weight.data.view(-1), packed.view(-1))
                    and torch.equal(m.weight.quant_state.absmax, state.absmax))
        else:
            cb, scb, _ = bnb_f.int8_vectorwise_quant(w.half())
            ours_cb, ours_scb = int8_state(m)
            same = torch.equal(ours_cb, cb) and torch.equal(ours_scb, scb)
        if not same:
            failures.append(f"{quant}: the reference's {name} is not bitsandbytes' quantization "
                            "of the float32 weight")


def int8_state(m):
    """A Linear8bitLt's CB and SCB: on its weight until its first forward, then on its state."""
    return (m.weight.CB, m.weight.SCB) if m.weight.CB is not None else (m.state.CB, m.state.SCB)


def reference_bytes(model, quant):
    """The bytes bitsandbytes' quantized layers hold (nf4: packed weights, 8-bit block scales,
    their float32 second-level scales and offset; the code tables left aside: constants)."""
    total = 0
    for m in model.modules():
        if isinstance(m, QUANTIZED[quant]):
            w = m.weight
            if quant == "nf4":
                s = w.quant_state
                total += w.data.numel() * w.data.element_size()
                total += s.absmax.numel() * s.absmax.element_size()
                total += s.state2.absmax.numel() * s.state2.absmax.element_size() + 4
            else:
                cb, scb = int8_state(m)
                total += cb.numel() * cb.element_size() + scb.numel() * scb.element_size()
    return total


def check_equal(t, quant, base, windows, weights, failures):
    """Checks 1 and 2 for `quant`; returns (the 20-step run, the reference's losses, the step-0
    adapters' export, the reference's trained model)."""
    step0 = os.path.join(t.work, f"{quant}_step0_peft")
    t.export(t.train(f"{quant}_step0", steps=1, lr=0.0), step0, "--format", "peft")
    trained = t.train(f"{quant}_{STEPS}", steps=STEPS)
    ours = t.losses(trained)
    model = peft_model(base, step0, loader=lambda d: quantized_base(d, quant))
    check_reference_quantized(model, quant, weights, failures)
    theirs, model, _ = peft_losses(model, windows, steps=STEPS)
    diff = worst(ours, theirs)
    print(f"{quant}: {STEPS} steps, PEFT + bitsandbytes loss {theirs[0]:.6f} -> {theirs[-1]:.6f}, "
          f"trainer {ours[0]:.6f} -> {ours[-1]:.6f}, worst relative step difference {diff:.3g}")
    if len(ours) != STEPS or not diff <= LOSS_TOL:
        failures.append(f"{quant}: {len(ours)} steps logged, worst relative difference {diff}")
    if not theirs[-1] < 0.9 * theirs[0]:
        failures.append(f"{quant}: PEFT + bitsandbytes did not learn ({theirs[0]} -> {theirs[-1]})")
    return trained, theirs, step0, model


def check_held_bytes(t, quant, model, weights, failures):
    report_path = os.path.join(t.work, f"{quant}_bench.json")
    run([t.binary, "bench", "--config", t.config(f"{quant}_bench", steps=STEPS), "--steps", "2",
         "--warmup", "1", "--json", report_path], f"bench {quant}")
    with open(report_path) as f:
        held = json.load(f)["held_bytes"]
    params = sum(w.numel() for w in weights.values())
    ours, theirs = held.get("quantized"), reference_bytes(model, quant)
    print(f"{quant}: quantized layers hold {ours} bytes for {params} parameters "
          f"({ours / params if ours else float('nan'):.4f} per parameter; bitsandbytes "
          f"{theirs}, {theirs / params:.4f})")
    if not isinstance(ours, int) or not 0 < ours <= BYTES_PER_PARAM[quant] * params:
        failures.append(f"{quant}: held_bytes.quantized {ours} for {params} parameters (at most "
                        f"{BYTES_PER_PARAM[quant]} each)")


def check_eval(t, base, trained, windows, failures):
    """Check 4: the trained nf4 adapters through PEFT on the quantized base, `trainer eval`."""
    adapters = os.path.join(t.work, "nf4_trained_peft")
    t.export(trained, adapters, "--format", "peft")
    model = peft_model(base, adapters, loader=lambda d: quantized_base(d, "nf4")).eval()
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):  # the dequantize-and-multiply path, as in training
            m.support_avx512bf16_for_cpu = False
    x, y = windows[:, :-1], windows[:, 1:]
    with torch.no_grad():
        theirs = F.cross_entropy(model(x).logits.reshape(-1, VOCAB), y.reshape(-1)).item()
    r = run([t.binary, "eval", "--checkpoint", trained, "--json"], "eval nf4")
    ours = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
    print(f"nf4 trained adapters: trainer eval loss {ours:.6f}, PEFT + bitsandbytes {theirs:.6f}")
    if not abs(ours - theirs) <= EVAL_TOL * theirs:
        failures.append(f"nf4 eval loss {ours}, PEFT + bitsandbytes {theirs}")


def check_bad_input(binary, work, base, folders, failures):
    """Check 5: exit 2, the error naming model.lora.base_quant and what is wrong (`needles`), not
    an unknown key."""
    fsdp = {"data": {"batch_size": 2}, "dist": {"strategy": "fsdp"}, "run": {"threads": 1}}
    cases = [("no model.lora.rank", {"base_quant": "nf4"}, {"lora": False}, ["rank"]),
             ("model.lora.rank 0", {"rank": 0, "base_quant": "nf4"}, {"lora": False}, ["rank"]),
             ("unknown value fp4", {"base_quant": "fp4"}, {}, ["fp4", "nf4", "int8"]),
             ("dist.strategy fsdp", {"base_quant": "nf4"}, {"procs": 2, "sections": fsdp},
              ["fsdp"])]
    for i, (what, keys, options, needles) in enumerate(cases):
        t = QloraTrainer(binary, work, base, folders, keys)
        procs = options.pop("procs", 1)
        launch = [binary, "launch", "--standalone", "--nproc-per-node", str(procs), "--"]
        r = run([*(launch if procs > 1 else [binary]), "--config",
                 t.config(f"bad{i}", steps=1, **options), "--run-dir",
                 os.path.join(work, f"bad{i}")], f"base_quant, {what}", expect=2)
        lines = r.stderr.strip().splitlines() or [""]
        # Two processes: the launcher's own lines follow the workers' error.
        named = [line for line in lines if "model.lora.base_quant" in line]
        line = named[-1] if procs > 1 and named else lines[-1]
        print(f"base_quant, {what}: exit 2, {line}")
        if ("model.lora.base_quant" not in line or "unknown key" in line
                or not all(n in line for n in needles)):
            failures.append(f"base_quant, {what}: expected one line naming model.lora.base_quant "
                            f"and {', '.join(needles)}: {r.stderr[-2000:]!r}")


def check_merge(t, base, trained, windows, failures):
    """Check 8: `export --format hf --merge` of the nf4 run writes the dequantized base with the
    adapters merged: its logits equal PEFT's merge_and_unload over transformers' dequantize() of
    the 4-bit load (1e-5 relative)."""
    merged = os.path.join(t.work, "nf4_merged")
    t.export(trained, merged, "--format", "hf", "--merge")
    adapters = os.path.join(t.work, "nf4_trained_peft")  # check_eval's export
    dequantized = quantized_base(base, "nf4").dequantize()
    reference = PeftModel.from_pretrained(dequantized, adapters).merge_and_unload().eval()
    x = windows[:, :-1]
    with torch.no_grad():
        theirs = reference(x).logits
        ours = LlamaForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()(x).logits
    diff = relative(ours, theirs)
    print(f"nf4 merged export: logits relative max |diff| {diff:.3g} against PEFT's merge of the "
          "dequantized base")
    if not diff <= LOSS_TOL:
        failures.append(f"nf4 merged export: logits differ from PEFT's by {diff}")


def check_ddp(t, failures):
    """Check 7: nf4 under ddp on two processes (two windows each) trains as one process does:
    10 steps within 1e-5 relative."""
    one = t.losses(t.train("nf4_one", steps=10))
    two = t.losses(t.train("nf4_ddp", procs=2, steps=10,
                           sections={"data": {"batch_size": 2}, "run": {"threads": 1}}))
    diff = worst(two, one)
    print(f"nf4, ddp on 2 processes: 10 steps, worst relative step difference {diff:.3g}")
    if len(two) != 10 or not diff <= LOSS_TOL:
        failures.append(f"nf4 ddp: {len(two)} steps logged, worst relative difference {diff}")
    recomputed = QloraTrainer(t.binary, t.work, t.base, t.folders, t.lora_keys)
    recomputed.model_keys = {"checkpointing": "blocks"}
    again = recomputed.losses(recomputed.train("nf4_checkpointed", steps=10))
    print(f"nf4 with model.checkpointing: blocks: 10 steps, equal to without: {again == one}")
    if again != one:
        failures.append(f"nf4 with checkpointing blocks: {again}, without {one}")


def check_saved_quantized(binary, work, base, folders, windows, failures):
    """Check 6: a folder saved in bitsandbytes' 4-bit form loads as saved."""
    saved = os.path.join(work, "base_nf4")
    LlamaForCausalLM.from_pretrained(base, quantization_config=bnb_config("nf4"),
                                     dtype=torch.float32, device_map="cpu").save_pretrained(saved)
    model = LlamaForCausalLM.from_pretrained(saved, dtype=torch.float32, device_map="cpu").eval()
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):  # the dequantize-and-multiply path, as in training
            m.support_avx512bf16_for_cpu = False
    x, y = windows[:, :-1], windows[:, 1:]
    with torch.no_grad():
        theirs = F.cross_entropy(model(x).logits.reshape(-1, VOCAB), y.reshape(-1)).item()
    t = Trainer(binary, work, saved, folders)  # no base_quant key: the folder says it
    ours = t.losses(t.train("saved_nf4", steps=1, lr=0.0))
    print(f"saved nf4 folder: trainer's first loss {ours[0]:.6f}, transformers' {theirs:.6f}")
    if len(ours) != 1 or not abs(ours[0] - theirs) <= EVAL_TOL * theirs:
        failures.append(f"saved nf4 folder: trainer {ours}, transformers {theirs}")
    r = run([binary, "--config", t.config("saved_nf4_full", steps=1, lora=False), "--run-dir",
             os.path.join(work, "saved_nf4_full")], "saved nf4 folder without LoRA", expect=2)
    line = (r.stderr.strip().splitlines() or [""])[-1]
    print(f"saved nf4 folder without model.lora: exit 2, {line}")
    if "model.pretrained" not in line or "model.lora.rank" not in line:
        failures.append(f"saved nf4 folder without model.lora: {r.stderr[-2000:]!r}")


def check_quantization_matters(quant, base, step0, windows, theirs, failures):
    """The reference's losses differ from plain PEFT's over the unquantized base from the same
    adapters: a trainer that ignored base_quant would not match them."""
    plain, _, _ = peft_losses(peft_model(base, step0), windows, steps=STEPS)
    apart = worst(theirs, plain)
    print(f"{quant} against the unquantized base (plain PEFT): loss {theirs[0]:.6f} / "
          f"{plain[0]:.6f} at step 1, {theirs[-1]:.6f} / {plain[-1]:.6f} at step {STEPS}, worst "
          f"relative step difference {apart:.3g}")
    if not apart > APART:
        failures.append(f"{quant} and the unquantized base train alike ({apart})")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: qlora_check.py TRAINER")
    torch.set_num_threads(1)
    failures = []
    with tempfile.TemporaryDirectory() as work:
        base = os.path.join(work, "base")
        save_base(base, seed=1)
        folders, windows = write_windows(work, VOCAB, SEQ, WINDOWS)
        weights = linear_weights(base)
        for quant in ("nf4", "int8"):
            t = QloraTrainer(sys.argv[1], work, base, folders, {"base_quant": quant})
            trained, theirs, step0, model = check_equal(t, quant, base, windows, weights, failures)
            check_quantization_matters(quant, base, step0, windows, theirs, failures)
            check_held_bytes(t, quant, model, weights, failures)
            if quant == "nf4":
                check_eval(t, base, trained, windows, failures)
                check_merge(t, base, trained, windows, failures)
                check_ddp(t, failures)
        check_saved_quantized(sys.argv[1], work, base, folders, windows, failures)
        check_bad_input(sys.argv[1], work, base, folders, failures)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
