"""config.json layouts and fields for hf_llama_check.py (CTest Interop.HfLlamaFoldersInAndOut).

7. transformers 5's layout: a Llama 3.1-style and a Qwen 2-style folder whose config.json is
   rewritten as transformers 5 writes it (`rope_parameters` holding the rope type, theta and
   scaling; `dtype`; no `rope_theta`, `rope_scaling` or `torch_dtype`) give the loss transformers
   computes from the transformers 4 layout of the same model, within 1e-5, and export with
   `rope_parameters` again. rope_parameters with one equal entry per layer type loads.
8. Refused, exit 2 naming config.json and the fields: rope_parameters.rope_theta and rope_theta
   that disagree; rope_parameters and rope_scaling that disagree; rope_parameters per layer type
   with different entries; rope_scaling's rope_type and type that disagree (transformers 4 takes
   `type`, transformers 5 `rope_type`).
9. Every field of transformers' config class (its __init__ parameters) for each model_type
   (llama, mistral, qwen2, qwen3): with every field set (config.json as `to_dict()` writes it, plus
   an unknown field), the trainer warns once, naming the unknown field and none of the class's;
   with every field but the weights' shapes set to another value, the fields the trainer refuses
   are named (exit 2), and with all the others set to another value at once it loads and gives
   transformers' loss within 1e-5 for that config.json (or names more refused fields, which are
   then left at the folder's values).
"""
import inspect
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

SEQ, LOSS_TOL = 32, 1e-5
UNKNOWN = "not_a_transformers_field"
# Fields whose value the weights fix (their shapes, a tied head): kept at the folder's.
SHAPES = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings"}


def perturbed(field, layers, ctx):
    """Another value of a config class's field than the tiny models', chosen to change the model
    where the field can."""
    values = {
        "hidden_act": "gelu", "max_position_embeddings": 2 * ctx, "initializer_range": 0.5,
        "rms_norm_eps": 1e-3, "use_cache": False, "pad_token_id": 0, "bos_token_id": 3,
        "eos_token_id": 4, "pretraining_tp": 2, "rope_theta": 25000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "attention_bias": True,
        "attention_dropout": 0.1, "mlp_bias": True, "sliding_window": 8,
        "use_sliding_window": True, "max_window_layers": 0,
        "layer_types": ["sliding_attention"] * layers}
    if field not in values:
        sys.exit(f"fields: no other value for {field}, a field of transformers' config class "
                 "the check does not know: give it one")
    return values[field]


def write_window(work, vocab):
    """A one-window token folder: (folder, window [SEQ + 1])."""
    window = torch.randint(0, vocab, (SEQ + 1,), generator=torch.Generator().manual_seed(13))
    folder = os.path.join(work, "fields_window")
    os.makedirs(folder, exist_ok=True)
    for split in ("train.bin", "val.bin"):
        window.numpy().astype(np.uint16).tofile(os.path.join(folder, split))
    return folder, window


def torch_loss(model, window):
    with torch.no_grad():
        logits = model.eval()(window[None, :-1]).logits[0]
    return F.cross_entropy(logits, window[1:]).item()


def trainer_run(trainer, work, name, folder, window_folder, dry_run=False):
    """`trainer train` (or --dry-run) from `folder` on the window, one step at learning rate 0:
    (exit code, stderr, the step's loss or None)."""
    cfg = {"seed": 0, "model": {"pretrained": folder},
           "data": {"name": "tokens", "root": window_folder, "seq_len": SEQ, "batch_size": 1,
                    "workers": 0},
           "train": {"max_steps": 1, "eval_at_end": False},
           "optim": {"name": "sgd", "lr": 0},
           "run": {"log_every": 1, "progress": "never", "tensorboard": False, "threads": 1}}
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    run_dir = os.path.join(work, name + "_run")
    shutil.rmtree(run_dir, ignore_errors=True)
    args = [trainer, "--config", path, "--run-dir", run_dir] + (["--dry-run"] if dry_run else [])
    r = subprocess.run(args, capture_output=True, text=True)
    loss = None
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if r.returncode == 0 and not dry_run and os.path.exists(metrics):
        with open(metrics) as f:
            losses = [rec["loss"] for rec in map(json.loads, f) if rec.get("split") == "train"]
        loss = losses[0] if losses else None
    return r.returncode, r.stderr, loss, run_dir


def with_config(work, source, name, config):
    """A copy of folder `source` whose config.json is `config`."""
    folder = os.path.join(work, name)
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return folder


def read_config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


def v5_layout(cfg):
    """config.json `cfg` (transformers 4's layout) as transformers 5 writes it."""
    out = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}
    rope = dict(cfg.get("rope_scaling") or {"rope_type": "default"})
    rope["rope_theta"] = cfg.get("rope_theta", 10000.0)
    out["rope_parameters"] = rope
    out["transformers_version"] = "5.0.0"
    return out


def expect_loss(label, code, err, ours, theirs):
    if code != 0 or ours is None or abs(ours - theirs) > LOSS_TOL:
        sys.exit(f"{label}: exit {code}, loss {ours}, transformers {theirs}: {err[-600:]}")
    print(f"{label}: loss {ours:.6f}, transformers {theirs:.6f}")


def expect_refused(trainer, work, label, folder, window_folder, needles):
    code, err, _, _ = trainer_run(trainer, work, "refused", folder, window_folder, dry_run=True)
    if code != 2 or any(n not in err for n in needles):
        sys.exit(f"{label}: exit {code}, expected 2 naming {needles}: {err[-600:]}")
    print(f"{label}: refused (exit 2)")


def v5_layouts(trainer, work, models, vocab):
    """7 and 8: transformers 5's rope_parameters, its loss and export; disagreements refused."""
    window_folder, window = write_window(work, vocab)
    for name, model in models:
        if name not in ("llama31", "qwen2"):
            continue
        source = read_config(os.path.join(work, name))
        cfg = v5_layout(source)
        if name == "qwen2":
            cfg["layer_types"] = ["full_attention"] * source["num_hidden_layers"]
        folder = with_config(work, os.path.join(work, name), name + "_v5", cfg)
        code, err, loss, run_dir = trainer_run(trainer, work, name + "_v5", folder, window_folder)
        expect_loss(f"{name} in transformers 5's layout (rope_parameters "
                    f"{cfg['rope_parameters']})", code, err, loss, torch_loss(model, window))
        out = os.path.join(work, name + "_v5_export")
        subprocess.run([trainer, "export", "--checkpoint", run_dir, "--out", out, "--format",
                        "hf"], check=True, capture_output=True)
        exported = read_config(out)
        if (exported.get("rope_parameters") != cfg["rope_parameters"] or
                {"rope_theta", "rope_scaling"} & set(exported)):
            sys.exit(f"{name}: the export of a transformers 5 folder wrote {exported}")
        print(f"{name}: exported in transformers 5's layout, rope_parameters as the folder's")
    llama = read_config(os.path.join(work, "llama31_v5"))
    rope = llama["rope_parameters"]
    cases = [
        ("rope_parameters.rope_theta vs rope_theta", {**llama, "rope_theta": 10000.0},
         ["rope_parameters.rope_theta", "rope_theta is 10000"]),
        ("rope_parameters vs rope_scaling", {**llama, "rope_scaling": {**rope, "factor": 16.0}},
         ["rope_scaling is", "rope_parameters is"]),
        ("rope_parameters per layer type, different", {**llama, "rope_parameters": {
            "full_attention": rope, "sliding_attention": {**rope, "rope_theta": 1e4}}},
         ["rope_parameters has different settings per layer type"]),
        ("rope_type vs type", {**read_config(os.path.join(work, "llama31")), "rope_scaling": {
            **rope, "rope_type": "llama3", "type": "linear"}},
         ["rope_scaling.rope_type is \"llama3\"", "rope_scaling.type is \"linear\""]),
    ]
    for label, cfg, needles in cases:
        folder = with_config(work, os.path.join(work, "llama31"), "rope_bad", cfg)
        expect_refused(trainer, work, label, folder, window_folder,
                       ["config.json"] + needles)
    same = with_config(work, os.path.join(work, "llama31"), "rope_per_type", {
        **llama, "rope_parameters": {"full_attention": rope, "sliding_attention": rope}})
    code, err, _, _ = trainer_run(trainer, work, "per_type", same, window_folder, dry_run=True)
    if code != 0:
        sys.exit(f"rope_parameters per layer type, all equal: exit {code}: {err[-600:]}")
    print("rope_parameters per layer type, all equal: loads")


def refused_fields(err):
    """The fields the error lines (not the warnings) about config.json begin with."""
    return {m.group(1) for line in err.splitlines() if "[warning]" not in line
            for m in [re.search(r"config\.json: ([A-Za-z_]\w*)", line)] if m}


def unknown_warned(err):
    """The fields of the trainer's warning about fields transformers' class lacks."""
    m = re.search(r"config\.json: fields? (.*?) (?:is not a field|are not fields) of "
                  r"transformers' config", err)
    return set(m.group(1).split(", ")) if m else None


def class_fields(trainer, work, label, base, cls_config, cls_model, state, window):
    """9. One model type: every field of transformers' class known, refused or computed."""
    folder_base, window_folder = base
    fields = [p for p in inspect.signature(cls_config.__init__).parameters
              if p not in ("self", "kwargs")]
    cfg = cls_config.from_dict(read_config(folder_base)).to_dict()
    layers, ctx = cfg["num_hidden_layers"], cfg["max_position_embeddings"]
    others = {f: perturbed(f, layers, ctx) for f in fields if f not in SHAPES}
    folder = with_config(work, folder_base, label + "_all", {**cfg, **others})
    code, err, _, _ = trainer_run(trainer, work, label + "_all", folder, window_folder, True)
    refused = refused_fields(err) & set(others)
    if code not in (0, 2) or (code == 2) != bool(refused):
        sys.exit(f"{label}: every field changed: exit {code}, refused {refused}: {err[-800:]}")
    # The others changed together load with transformers' loss, or name more refused fields
    # (interactions: Qwen's layer_types sliding without use_sliding_window).
    while True:
        kept = {f: v for f, v in others.items() if f not in refused}
        full = {**cfg, **kept, UNKNOWN: 1}
        folder = with_config(work, folder_base, label + "_kept", full)
        code, err, loss, _ = trainer_run(trainer, work, label + "_kept", folder, window_folder)
        more = refused_fields(err) & set(kept) if code == 2 else set()
        if not more:
            break
        refused |= more
    reference = cls_model(cls_config.from_dict(full))
    reference.load_state_dict(state)
    expect_loss(f"{label}: every field of {cls_config.__name__} set, {sorted(kept)} changed",
                code, err, loss, torch_loss(reference, window))
    if unknown_warned(err) != {UNKNOWN}:
        sys.exit(f"{label}: the unknown-fields warning names {unknown_warned(err)}, expected "
                 f"only {UNKNOWN} (a field of {cls_config.__name__} the trainer does not know?): "
                 f"{err[-800:]}")
    print(f"{label}: {len(fields)} fields of {cls_config.__name__}: refused when changed "
          f"{sorted(refused)}; {UNKNOWN} warned as unknown")


def config_fields(trainer, work, models, vocab):
    """9 for llama (Llama 3.1-style), mistral (its weights), qwen2 and qwen3."""
    window_folder, window = write_window(work, vocab)
    by_name = dict(models)
    llama = os.path.join(work, "llama31")
    own = inspect.signature(MistralConfig.__init__).parameters
    mistral_cfg = MistralConfig(**{k: v for k, v in read_config(llama).items()
                                   if k in own}).to_dict()
    mistral = with_config(work, llama, "mistral_fields",
                          {**mistral_cfg, "architectures": ["MistralForCausalLM"]})
    for label, folder, cls_config, cls_model, model in (
            ("llama", llama, LlamaConfig, LlamaForCausalLM, by_name["llama31"]),
            ("mistral", mistral, MistralConfig, MistralForCausalLM, by_name["llama31"]),
            ("qwen2", os.path.join(work, "qwen2"), Qwen2Config, Qwen2ForCausalLM,
             by_name["qwen2"]),
            ("qwen3", os.path.join(work, "qwen3"), Qwen3Config, Qwen3ForCausalLM,
             by_name["qwen3"])):
        class_fields(trainer, work, label, (folder, window_folder), cls_config, cls_model,
                     model.state_dict(), window)
