#!/usr/bin/env python3
"""The trainer's LoRA (model.lora) against PEFT (CTest Lora.EqualsPeft; with --distributed,
Lora.DistributedEqualsOneProcess).

  lora_check.py TRAINER [--distributed]

A tiny random LlamaForCausalLM that transformers builds here (no download), saved by
save_pretrained, is the frozen base (model.pretrained: DIR); adapters of rank 16 on every
projection (q/k/v/o_proj, gate/up/down_proj). The data are four 64-token windows (data.mix of four
one-window token folders: every batch holds all four).

1. Step 0: a one-step run at learning rate 0 leaves the adapters as initialised (A
   kaiming-uniform, B zeros); `trainer export --format peft` of it loads with
   peft.PeftModel.from_pretrained without a warning.
2. 50 steps (float32, dropout 0, AdamW with weight decay, clipping at 1.0, a constant rate) equal
   PEFT over the same base from that export plus torch.optim.AdamW: every step's loss within 1e-5
   relative. A run resumed from its step-25 checkpoint logs the same losses.
3. With dropout 0.1 the trainer and PEFT runs differ (each draws its own masks) and both learn.
4. The trained adapters, exported for PEFT, score the windows as the trainer's `eval` does
   (1e-5); `export --format hf --merge` loads in transformers with PEFT's logits (1e-5).
5. Memory: `trainer bench`'s held bytes (parameters, gradients, optimizer moments) are at most
   PEFT's in its step on the same model; the LoRA checkpoint is at most 1.1x the adapters' and their AdamW state's bytes.
6. gpt over a GPT-2 base (transformers' Conv1D layers, PEFT's fan_in_fan_out): 20 steps equal
   PEFT's; its adapter export loads in PEFT and its merged export in GPT2LMHeadModel with the same
   logits.
7. Bad input, one line and exit 2 each: model.lora.rank above every adapted layer's widths;
   model.lora.rank 0 with other model.lora keys set; an adapter export of a run without LoRA; a
   resume on a base whose weights changed (same path, same config.json); `export --format peft`
   and `--format hf --merge` with --out the run's base folder (its path, a symlink, `..`);
   `--format peft --merge`.
8. model.lora.targets all-linear (a string, as PEFT's target_modules, or a one-entry list) adapts
   the layers PEFT's get_peft_model resolves "all-linear" to (every linear layer but lm_head), on
   the Llama base and on the GPT-2 one (Conv1D layers).

--distributed: ddp, fsdp and dist.tp_size 2 on two processes equal one process (10 steps within
1e-5 relative); an fsdp checkpoint (sharded adapters and AdamW state) resumes in one process.

Exits 77 (skipped) when transformers, peft or safetensors is not installed.
"""
import copy
import json
import os
import subprocess
import sys
import tempfile
import warnings

from run_check import one_intra_op_thread

one_intra_op_thread()  # before torch is imported

try:
    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, PeftModel
    from safetensors.torch import load_file
    from window_runs import adamw_losses, randomize, relative, window_config, write_windows
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
try:  # bitsandbytes (QLoRA's reference, in the venv) warns that torch.jit is deprecated when it is
    # first imported, which PEFT does at its first load: imported here, that warning silenced.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import bitsandbytes  # noqa: F401
except ImportError:
    pass

VOCAB, SEQ, WINDOWS, STEPS = 256, 64, 4, 50
RANK, ALPHA = 16, 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
OPTIM = {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}
CLIP = 1.0
LOSS_TOL, LOGITS_TOL = 1e-5, 1e-5
BASE = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                   rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                   attention_dropout=0.0)


def save_base(folder, seed):
    """A LlamaForCausalLM with weights drawn from `seed`, saved into `folder`."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(BASE)
    randomize(model)
    model.save_pretrained(folder, safe_serialization=True)


def load_base(folder):
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def run(args, what, expect=0):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != expect:
        sys.exit(f"{what}: exit {r.returncode} (expected {expect}): {r.stderr[-3000:]}")
    return r


class Trainer:
    def __init__(self, binary, work, base, folders, model_keys=None, targets=TARGETS):
        self.binary, self.work, self.base, self.folders = binary, work, base, folders
        self.model_keys, self.targets = model_keys or {}, targets

    def config(self, name, steps=STEPS, lr=OPTIM["lr"], dropout=0.0, lora=True, stop=0,
               sections=None):
        model = {"pretrained": self.base, **self.model_keys}
        if lora:
            model["lora"] = {"rank": RANK, "alpha": ALPHA, "dropout": dropout,
                             "targets": self.targets}
        config = window_config(model, self.folders, SEQ, steps, {**OPTIM, "lr": lr}, CLIP, stop,
                               checkpoint_every=steps)
        config["run"]["eval_every"] = 10 * STEPS
        for section, keys in (sections or {}).items():
            config.setdefault(section, {}).update(keys)
        path = os.path.join(self.work, f"{name}.yaml")
        with open(path, "w") as f:
            json.dump(config, f)  # JSON is YAML
        return path

    def train(self, name, *extra, procs=1, **options):
        run_dir = os.path.join(self.work, name)
        launch = [self.binary, "launch", "--standalone", "--nproc-per-node", str(procs), "--"]
        run([*(launch if procs > 1 else [self.binary]), "--config", self.config(name, **options),
             "--run-dir", run_dir, *extra], f"train {name}")
        return run_dir

    def losses(self, run_dir):
        """The training loss of each step, in step order (a resumed run's last record of each)."""
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        by_step = {rec["step"]: rec["loss"] for rec in records if rec.get("split") == "train"}
        return [by_step[s] for s in sorted(by_step)]

    def export(self, run_dir, out, *options, expect=0):
        return run([self.binary, "export", "--checkpoint", run_dir, "--out", out, *options],
                   f"export {' '.join(options)}", expect)


def peft_model(base_dir, adapters, dropout=None, loader=load_base):
    """PeftModel.from_pretrained over a fresh base; fails on any warning."""
    config = LoraConfig.from_pretrained(adapters)
    if dropout is not None:
        config.lora_dropout = dropout
    base = loader(base_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, adapters, config=config, is_trainable=True)
    if caught:
        sys.exit(f"PeftModel.from_pretrained warned: {[str(w.message) for w in caught]}")
    return model


def peft_losses(model, windows, steps=STEPS, seed=0):
    """The plain loop: torch.optim.AdamW over the adapters, clipping, a constant rate."""
    torch.manual_seed(seed)
    model = model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    losses, opt = adamw_losses(model, [{"params": params}], windows, steps, OPTIM, CLIP)
    return losses, model, opt


def worst(ours, theirs):
    return max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))


def held_bytes(model, opt, windows):
    """What PEFT holds in a step: its parameters (base and adapters), the adapters' gradients
    (after a backward pass) and AdamW's moments (its 4-byte step counters left aside)."""
    x, y = windows[:, :-1], windows[:, 1:]
    F.cross_entropy(model(x).logits.reshape(-1, VOCAB), y.reshape(-1)).backward()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size()
                for p in model.parameters() if p.grad is not None)
    state = sum(t.numel() * t.element_size() for s in opt.state.values()
                for name, t in s.items() if torch.is_tensor(t) and name != "step")
    opt.zero_grad(set_to_none=True)
    return params + grads + state


def check_equal_to_peft(t, base, windows, failures):
    """Steps 1-3: returns (the 50-step run dir, PEFT's trained model, PEFT's optimizer)."""
    start = t.train("step0", steps=1, lr=0.0)
    step0 = os.path.join(t.work, "step0_peft")
    t.export(start, step0, "--format", "peft")
    stored = load_file(os.path.join(step0, "adapter_model.safetensors"))
    names = [k for k in stored if k.endswith("lora_B.weight")]
    if len(names) != 2 * len(TARGETS) or any(stored[k].abs().max() != 0 for k in names):
        failures.append(f"step 0: expected {2 * len(TARGETS)} zero lora_B, got {len(names)}")
    a = stored["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]  # [r, C]
    bound = 1.0 / BASE.hidden_size ** 0.5  # kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(in), ..)
    if tuple(a.shape) != (RANK, BASE.hidden_size) or not (0.9 * bound < a.abs().max() <= bound):
        failures.append(f"step 0: lora_A {tuple(a.shape)} max {a.abs().max()} (bound {bound})")

    trained = t.train("lora50")
    ours = t.losses(trained)
    theirs, model, opt = peft_losses(peft_model(base, step0), windows)
    diff = worst(ours, theirs)
    print(f"50 steps: PEFT loss {theirs[0]:.4f} -> {theirs[-1]:.4f}, trainer "
          f"{ours[0]:.4f} -> {ours[-1]:.4f}, worst relative step difference {diff:.3g}")
    if len(ours) != STEPS or not diff <= LOSS_TOL:
        failures.append(f"50 steps: {len(ours)} logged, worst relative difference {diff}")
    if not theirs[-1] < 0.9 * theirs[0]:
        failures.append(f"PEFT did not learn ({theirs[0]} -> {theirs[-1]})")

    half = t.train("lora_resumed", stop=STEPS // 2)  # ends after step 25, checkpointed
    run([t.binary, "--config", t.config("lora_resumed"), "--run-dir", half, "--resume", "auto"],
        "resume")
    resumed = t.losses(half)
    if resumed != ours:
        failures.append(f"stopped at step 25 and resumed: losses {resumed[24:27]}, uninterrupted "
                        f"{ours[24:27]}")

    dropped = t.losses(t.train("dropout", dropout=0.1))
    theirs_dropped, _, _ = peft_losses(peft_model(base, step0, dropout=0.1), windows)
    apart = worst(dropped, theirs_dropped)
    print(f"dropout 0.1: trainer {dropped[0]:.4f} -> {dropped[-1]:.4f}, PEFT "
          f"{theirs_dropped[0]:.4f} -> {theirs_dropped[-1]:.4f}, apart by {apart:.3g}")
    if not apart > 1e-3 or worst(dropped, ours) <= 1e-3:
        failures.append(f"dropout 0.1: the runs do not differ ({apart})")
    for who, losses in (("trainer", dropped), ("PEFT", theirs_dropped)):
        if not losses[-1] < 0.9 * losses[0]:
            failures.append(f"dropout 0.1: {who} did not learn ({losses[0]} -> {losses[-1]})")
    return trained, model, opt


def check_exports(t, base, trained, windows, failures):
    adapters = os.path.join(t.work, "trained_peft")
    t.export(trained, adapters, "--format", "peft")
    with open(os.path.join(adapters, "adapter_config.json")) as f:
        cfg = json.load(f)
    expected = {"peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "task_type": "CAUSAL_LM",
                "target_modules": sorted(TARGETS), "base_model_name_or_path": base}
    for key, value in expected.items():
        if cfg.get(key) != value:
            failures.append(f"adapter_config.json: {key} {cfg.get(key)!r}, expected {value!r}")
    model = peft_model(base, adapters).eval()
    x, y = windows[:, :-1], windows[:, 1:]
    with torch.no_grad():
        peft_logits = model(x).logits
    peft_loss = F.cross_entropy(peft_logits.reshape(-1, VOCAB), y.reshape(-1)).item()
    r = run([t.binary, "eval", "--checkpoint", trained, "--json"], "eval")
    ours = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
    print(f"trained adapters: trainer eval loss {ours:.6f}, PEFT {peft_loss:.6f}")
    if not abs(ours - peft_loss) <= LOSS_TOL * peft_loss:
        failures.append(f"eval loss {ours}, PEFT's {peft_loss}")
    merged = os.path.join(t.work, "merged")
    t.export(trained, merged, "--format", "hf", "--merge")
    with torch.no_grad():
        merged_logits = load_base(merged)(x).logits
        base_logits = load_base(base)(x).logits
    diff = relative(merged_logits, peft_logits)
    print(f"merged export: logits relative max |diff| {diff:.3g} against PEFT's")
    if not diff <= LOGITS_TOL:
        failures.append(f"merged export: logits differ from PEFT's by {diff}")
    if not relative(base_logits, peft_logits) > 100 * LOGITS_TOL:
        failures.append("the trained adapters do not change the logits")


def check_memory(t, trained, model, opt, windows, failures):
    report = os.path.join(t.work, "bench.json")
    run([t.binary, "bench", "--config", t.config("bench"), "--steps", "2", "--warmup", "1",
         "--json", report], "bench")
    with open(report) as f:
        ours = json.load(f)["held_bytes"]["total"]
    ours -= 8 * 2 * BASE.num_hidden_layers * len(TARGETS)  # the int64 step counter of each adapter
    theirs = held_bytes(model, opt, windows)
    print(f"held bytes: trainer {ours}, PEFT {theirs}")
    if not ours <= theirs:
        failures.append(f"held bytes: trainer {ours} > PEFT {theirs}")
    adapters = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    budget = 1.1 * 3 * adapters  # the adapters and AdamW's two moments
    ckpt = os.path.join(trained, "checkpoints", f"step_{STEPS:08d}.safetensors")
    size = os.path.getsize(ckpt)
    print(f"checkpoint: {size} bytes, adapters and their optimizer {3 * adapters}")
    if not size <= budget:
        failures.append(f"checkpoint {size} bytes > 1.1 x {3 * adapters}")


def check_gpt(binary, work, folders, windows, failures):
    """gpt over a GPT-2 base (Hugging Face's Conv1D layers: PEFT's fan_in_fan_out): 20 steps
    equal PEFT's; the adapter and merged exports load with equal logits."""
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(3)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(0.7, 1.3) if ".ln_" in name else p.normal_(0.0, 0.08)
    folder = os.path.join(work, "gpt2")
    model.save_pretrained(folder, safe_serialization=True)
    load = lambda d: GPT2LMHeadModel.from_pretrained(d, dtype=torch.float32).eval()
    keys = {"name": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 128,
            "vocab_size": VOCAB, "bias": True, "dropout": 0.0}
    t = Trainer(binary, work, os.path.join(folder, "model.safetensors"), folders, keys,
                targets=["c_attn", "c_proj", "c_fc"])
    step0 = os.path.join(work, "gpt_step0")
    t.export(t.train("gpt_step0", steps=1, lr=0.0), step0, "--format", "peft")
    with open(os.path.join(step0, "adapter_config.json")) as f:
        if json.load(f).get("fan_in_fan_out") is not True:
            failures.append("gpt: adapter_config.json without fan_in_fan_out: true")
    trained = t.train("gpt20", steps=20)
    ours = t.losses(trained)
    theirs, _, _ = peft_losses(peft_model(folder, step0, loader=load), windows, steps=20)
    diff = worst(ours, theirs)
    print(f"gpt: 20 steps, PEFT loss {theirs[0]:.4f} -> {theirs[-1]:.4f}, worst relative step "
          f"difference {diff:.3g}")
    if len(ours) != 20 or not diff <= LOSS_TOL:
        failures.append(f"gpt: 20 steps: {len(ours)} logged, worst relative difference {diff}")
    adapters, merged = os.path.join(work, "gpt_peft"), os.path.join(work, "gpt_merged")
    t.export(trained, adapters, "--format", "peft")
    t.export(trained, merged, "--format", "hf", "--merge")
    with torch.no_grad():
        peft_logits = peft_model(folder, adapters, loader=load).eval()(windows[:, :-1]).logits
        merged_logits = load(merged)(windows[:, :-1]).logits
    diff = relative(merged_logits, peft_logits)
    print(f"gpt: merged export logits relative max |diff| {diff:.3g} against PEFT's")
    if not diff <= LOGITS_TOL:
        failures.append(f"gpt: merged export: logits differ from PEFT's by {diff}")
    check_all_linear(t, folder, failures, load=load, label="gpt")


def peft_all_linear(model):
    """The layers PEFT adapts for target_modules="all-linear" (get_peft_model resolves it)."""
    from peft import get_peft_model
    from peft.tuners.lora import LoraLayer
    peft = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA,
                                            target_modules="all-linear", task_type="CAUSAL_LM"))
    prefix = "base_model.model."
    return sorted(n[len(prefix):] for n, m in peft.named_modules() if isinstance(m, LoraLayer))


def trainer_adapted(t, name):
    """The layers a one-step run of `t` adapts, from its --format peft export's tensor names."""
    out = os.path.join(t.work, name + "_peft")
    t.export(t.train(name, steps=1, lr=0.0), out, "--format", "peft")
    names = load_file(os.path.join(out, "adapter_model.safetensors"))
    return sorted(n[len("base_model.model."):-len(".lora_A.weight")] for n in names
                  if n.endswith(".lora_A.weight"))


def check_all_linear(t, base, failures, load=load_base, label="llama"):
    """model.lora.targets all-linear (PEFT's shorthand, a string, or a one-entry list) adapts the
    layers PEFT resolves it to: every linear layer but the output layer."""
    theirs = peft_all_linear(load(base))
    for i, targets in enumerate(("all-linear", ["ALL-LINEAR"])):
        ours = trainer_adapted(Trainer(t.binary, t.work, t.base, t.folders, t.model_keys,
                                       targets=targets), f"{label}_all_linear{i}")
        print(f"{label}: targets {targets!r}: {len(ours)} layers adapted, PEFT {len(theirs)}")
        if ours != theirs:
            failures.append(f"{label}: targets {targets!r} adapt {ours}, PEFT {theirs}")


def check_export_into_base(t, base, failures):
    """An export whose --out is the run's base folder (by its path, a symlink, `..`) exits 2 with
    one line and writes nothing there, --format peft as --format hf --merge; --format peft
    --merge (which would write the adapters unmerged) exits 2."""
    before = sorted(os.listdir(base))
    link = os.path.join(t.work, "base_link")
    os.symlink(base, link)
    dotted = os.path.join(base, "..", os.path.basename(base))
    for out in (base, link, dotted):
        for options in (("--format", "peft"), ("--format", "hf", "--merge")):
            r = t.export(os.path.join(t.work, "lora50"), out, *options, expect=2)
            lines = r.stderr.strip().splitlines()
            if len(lines) != 1 or "model.pretrained folder" not in lines[0]:
                failures.append(f"export {' '.join(options)} --out {out}: {r.stderr!r}")
    if sorted(os.listdir(base)) != before:
        failures.append(f"exports into the base wrote {set(os.listdir(base)) - set(before)}")
    out = os.path.join(t.work, "peft_merge")
    r = t.export(os.path.join(t.work, "lora50"), out, "--format", "peft", "--merge", expect=2)
    if "--merge goes with --format hf" not in r.stderr or os.path.exists(out):
        failures.append(f"export --format peft --merge: {r.stderr!r}")
    os.remove(link)


def check_bad_input(t, base, failures):
    widest = max(BASE.hidden_size, BASE.intermediate_size)
    for setting, needle in ((f"model.lora.rank={widest + 1}", f"a rank of at most {widest}"),
                            ("model.lora.rank=0", "turns LoRA off")):
        r = run([t.binary, "--config", t.config("bad_lora"), "--run-dir",
                 os.path.join(t.work, "bad_lora"), "--set", setting], setting, expect=2)
        last = r.stderr.strip().splitlines()[-1]  # after the log's lines: the error, one line
        if "model.lora.rank" not in last or needle not in last:
            failures.append(f"{setting}: {r.stderr!r}")
    full = t.train("full", steps=1, lora=False)
    r = t.export(full, os.path.join(t.work, "full_peft"), "--format", "peft", expect=2)
    lines = r.stderr.strip().splitlines()
    if len(lines) != 1 or "without model.lora" not in lines[0]:
        failures.append(f"adapter export of a full run: {r.stderr!r}")
    check_export_into_base(t, base, failures)
    check_all_linear(t, base, failures)
    save_base(base, seed=2)  # another base at the same path, the same config.json
    run_dir = os.path.join(t.work, "lora50")
    r = run([t.binary, "--config", t.config("lora50", steps=STEPS + 5), "--run-dir", run_dir,
             "--resume", "auto"], "resume on another base", expect=2)
    lines = [line for line in r.stderr.strip().splitlines() if "model.pretrained" in line]
    if len(lines) != 1 or "another base" not in lines[0]:
        failures.append(f"resume on another base: {r.stderr!r}")


def check_distributed(t, failures):
    """Two processes (ddp; fsdp, base and adapters sharded; dist.tp_size 2, adapters split with
    their layers) train as one process does: 10 steps within 1e-5 relative; an fsdp run stopped
    at step 5 resumes in one process on the same course."""
    one = t.losses(t.train("one", steps=10))
    one_thread = {"run": {"threads": 1}}
    cases = {"ddp": {"data": {"batch_size": 2}},
             "fsdp": {"data": {"batch_size": 2}, "dist": {"strategy": "fsdp"}},
             "tp": {"dist": {"tp_size": 2}}}
    for name, sections in cases.items():
        two = t.losses(t.train(name, procs=2, steps=10, sections={**sections, **one_thread}))
        diff = worst(two, one)
        print(f"{name}, 2 processes: 10 steps, worst relative step difference {diff:.3g}")
        if len(two) != 10 or not diff <= LOSS_TOL:
            failures.append(f"{name}: {len(two)} steps logged, worst relative difference {diff}")
    sharded = {"data": {"batch_size": 2}, "dist": {"strategy": "fsdp"}, **one_thread}
    run_dir = t.train("fsdp_stopped", procs=2, steps=10, stop=5, sections=sharded)
    run([t.binary, "--config", t.config("fsdp_stopped", steps=10), "--run-dir", run_dir,
         "--resume", "auto"], "resume fsdp in one process")
    resumed = t.losses(run_dir)
    diff = worst(resumed, one)
    print(f"fsdp stopped at step 5, resumed alone: worst relative step difference {diff:.3g}")
    if len(resumed) != 10 or not diff <= LOSS_TOL:
        failures.append(f"fsdp resumed alone: {len(resumed)} steps, worst difference {diff}")


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--distributed"]):
        sys.exit("usage: lora_check.py TRAINER [--distributed]")
    torch.set_num_threads(1)
    failures = []
    with tempfile.TemporaryDirectory() as work:
        base = os.path.join(work, "base")
        save_base(base, seed=1)
        folders, windows = write_windows(work, VOCAB, SEQ, WINDOWS)
        t = Trainer(sys.argv[1], work, base, folders)
        if sys.argv[2:]:
            check_distributed(t, failures)
            return report(failures)
        trained, model, opt = check_equal_to_peft(t, base, windows, failures)
        check_exports(t, base, trained, windows, failures)
        check_memory(t, trained, model, opt, windows, failures)
        check_gpt(t.binary, work, folders, windows, failures)
        check_bad_input(t, base, failures)
    return report(failures)


def report(failures):
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else "failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
