#!/usr/bin/env python3
"""A planned run allocates no parameter (CTest Plan.DryRunAndDoctorAllocateNoParameters).

  plan_check.py TRAINER

`trainer --dry-run` and `trainer doctor --config` plan the model (its parameters on the meta
device: shapes, no storage) instead of building it:
1. A Llama 3.1 8B-shaped model from the seed (synthetic tokens): --dry-run prints the parameter
   count that transformers' LlamaForCausalLM of the same config has (built on the meta device
   here), and doctor --json's params_bytes is 4 bytes each (float32), at a peak RSS far below
   the model's 32 GB (the machine has 24 GB: building it fails or is killed); with LoRA, whose
   adapters are logged while the run is planned, doctor --json's stdout is still the JSON alone
   (the logs on stderr); doctor --gpus 8 --gpu-memory 80GB plans the job for 8 GPUs of 80 GB.
2. The same model as a Hugging Face folder in bf16 (16 GB of sparse shards: the headers real,
   the data holes that take no disk): --dry-run checks every header against the model and says
   so, reading no tensor, at the same small peak RSS; a shard whose header gives one tensor
   another shape is exit 2 naming the file and the tensor; --dry-run=load is the load training
   does (not run here: it needs the memory).
3. A folder with config.json and no weights: exit 2 naming the folder before any model is built
   (the 70B shape, quickly and at a small peak RSS).
Exits 77 (skipped) when transformers is not installed.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread, report

one_intra_op_thread()  # before torch is imported

try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

# Llama 3.1 8B's config.json (the published one's architecture fields).
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
    "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"}
LLAMA2_70B = {**LLAMA31_8B, "vocab_size": 32000, "hidden_size": 8192, "intermediate_size": 28672,
              "num_hidden_layers": 80, "num_attention_heads": 64, "rope_theta": 10000.0,
              "rope_scaling": None, "max_position_embeddings": 4096}
RSS_LIMIT = 2.0e9  # a trainer process holds about 0.5 GB before any model (LibTorch's libraries)


def reference_parameters(fields):
    """The parameter count of transformers' model of config.json `fields`, built on meta."""
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**fields))
    return sum(p.numel() for p in model.parameters()), model.state_dict()


def run_logged(command, work, name):
    """(exit code, stdout, stderr, peak RSS in bytes) of `command`, its peak read by wait4."""
    out_path, err_path = os.path.join(work, name + ".out"), os.path.join(work, name + ".err")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            os.execvp(command[0], command)
        _, status, usage = os.wait4(pid, 0)
    with open(out_path) as out, open(err_path) as err:
        return os.waitstatus_to_exitcode(status), out.read(), err.read(), usage.ru_maxrss * 1024


def seed_config(work):
    """The 8B shape from the seed, on synthetic tokens of its vocabulary."""
    f = LLAMA31_8B
    path = os.path.join(work, "llama8b_seed.yaml")
    with open(path, "w") as out:
        out.write(f"""model:
  name: llama
  vocab_size: {f['vocab_size']}
  n_embd: {f['hidden_size']}
  intermediate_size: {f['intermediate_size']}
  n_layer: {f['num_hidden_layers']}
  n_head: {f['num_attention_heads']}
  n_kv_head: {f['num_key_value_heads']}
  block_size: 8192
  rope_theta: {f['rope_theta']}
  tie_embeddings: false
data: {{name: synthetic_tokens, num_classes: {f['vocab_size']}, seq_len: 64, train_samples: 8,
       val_samples: 2, batch_size: 1, workers: 0}}
optim: {{name: adamw, lr: 0.0001}}
run: {{dir: {os.path.join(work, 'runs', 'seed')}}}
""")
    return path


def sparse_folder(work, name, fields, shard_tensors=40, reshape=None):
    """A Hugging Face folder of `fields` in bf16 whose shards are sparse files: each header lists
    its tensors as save_pretrained does, the data a hole of the right size. `reshape`: tensor
    name -> a shape of as many elements to write in its header instead."""
    folder = os.path.join(work, name)
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(fields, f)
    _, state = reference_parameters(fields)
    names = list(state)
    weight_map, total = {}, 0
    shards = [names[i:i + shard_tensors] for i in range(0, len(names), shard_tensors)]
    for k, part in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {}, 0
        for n in part:
            size = state[n].numel() * 2
            shape = (reshape or {}).get(n, list(state[n].shape))
            header[n] = {"dtype": "BF16", "shape": shape,
                         "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[n] = file
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(folder, file), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            f.truncate(8 + len(text) + offset)  # a hole: no disk blocks
        total += offset
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return folder, total


def folder_config(work, folder, name, vocab):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as out:
        out.write(f"""model: {{pretrained: {folder}}}
data: {{name: synthetic_tokens, num_classes: {vocab}, seq_len: 64, train_samples: 8,
       val_samples: 2, batch_size: 1, workers: 0}}
optim: {{name: adamw, lr: 0.0001}}
run: {{dir: {os.path.join(work, 'runs', name)}}}
""")
    return path


def parameters_line(out):
    for line in out.splitlines():
        if line.startswith("parameters:"):
            return int(line.split()[1].replace(",", ""))
    return None


def check_seed(trainer, work, want, failures):
    config = seed_config(work)
    code, out, err, peak = run_logged([trainer, "--config", config, "--dry-run"], work, "seed")
    got = parameters_line(out)
    print(f"8B from the seed, --dry-run: exit {code}, parameters {got} (transformers {want}), "
          f"peak RSS {peak / 1e9:.2f} GB")
    if code != 0 or got != want:
        failures.append(f"--dry-run of the 8B shape: exit {code}, parameters {got} != {want}: "
                        f"{err[-2000:]}")
    if peak > RSS_LIMIT:
        failures.append(f"--dry-run of the 8B shape: peak RSS {peak} > {RSS_LIMIT}")
    code, out, err, peak = run_logged([trainer, "doctor", "--json", "--config", config], work,
                                      "doctor")
    print(f"8B from the seed, doctor --json: exit {code}, peak RSS {peak / 1e9:.2f} GB")
    try:
        memory = json.loads(out)["memory"]
    except (ValueError, KeyError):
        failures.append(f"doctor --json --config printed no memory object: {out[:500]} {err[-2000:]}")
        return
    if memory["params_bytes"] != 4 * want:
        failures.append(f"doctor: params_bytes {memory['params_bytes']} != 4 x {want}")
    # AdamW: two float32 moments of every parameter.
    if memory["optimizer_bytes"] != 8 * want:
        failures.append(f"doctor: optimizer_bytes {memory['optimizer_bytes']} != 8 x {want}")
    # The step: at least the float32 logits of 64 tokens over the vocabulary, and their gradient.
    step = memory["float32_bytes"] - memory["params_bytes"] - memory["optimizer_bytes"]
    if step < 2 * 64 * 4 * LLAMA31_8B["vocab_size"]:
        failures.append(f"doctor: a step of {step} bytes holds less than the logits")
    if peak > RSS_LIMIT:
        failures.append(f"doctor --config of the 8B shape: peak RSS {peak} > {RSS_LIMIT}")
    # Planned for a job elsewhere: --gpus 8 --gpu-memory 80GB with fsdp, the world size and each
    # GPU's memory as given; fsdp's share of the parameters, gradients and AdamW moments is an
    # eighth of theirs.
    code, out, err, _ = run_logged([trainer, "doctor", "--json", "--config", config, "--gpus", "8",
                                    "--gpu-memory", "80GB", "--set", "dist.strategy=fsdp"], work,
                                   "doctor_gpus")
    try:
        m = json.loads(out)["memory"]
        shares = (2 * m["params_bytes"] + m["optimizer_bytes"]) // 8
        if (m["world_size"] != 8 or m["capacity_mb"] != 80 * 10**9 // 2**20
                or m["strategy"] != "fsdp" or not shares < m["fsdp_bytes"] < m["float32_bytes"]):
            failures.append(f"doctor --gpus 8 --gpu-memory 80GB: {m}")
    except (ValueError, KeyError):
        failures.append(f"doctor --gpus 8 --gpu-memory 80GB: {out[:300]} {err[-1000:]}")
    for bad in (["--gpus", "0"], ["--gpu-memory", "lots"]):
        code, out, err, _ = run_logged([trainer, "doctor", "--config", config, *bad], work, "bad")
        if code != 2 or bad[0] not in err:
            failures.append(f"doctor {' '.join(bad)}: exit {code}: {err[-500:]}")
    # With LoRA (which logs its adapters while the run is planned): stdout is the JSON alone.
    code, out, err, peak = run_logged([trainer, "doctor", "--json", "--config", config, "--set",
                                       "model.lora.rank=8"], work, "doctor_lora")
    try:
        memory = json.loads(out)["memory"]
        if memory["params_bytes"] <= 4 * want or "LoRA:" not in err:
            failures.append(f"doctor --json with LoRA: {memory} {err[-1000:]}")
    except (ValueError, KeyError):
        failures.append(f"doctor --json with LoRA: stdout is not one JSON object: {out[:300]}")


def check_folder(trainer, work, want, failures):
    folder, total = sparse_folder(work, "llama8b", LLAMA31_8B)
    config = folder_config(work, folder, "folder", LLAMA31_8B["vocab_size"])
    code, out, err, peak = run_logged([trainer, "--config", config, "--dry-run"], work, "folder")
    got = parameters_line(out)
    print(f"8B folder of {total / 1e9:.1f} GB (sparse), --dry-run: exit {code}, parameters {got}, "
          f"peak RSS {peak / 1e9:.2f} GB")
    if code != 0 or got != want or "headers checked, nothing read" not in err:
        failures.append(f"--dry-run of the 8B folder: exit {code}, parameters {got}: {err[-2000:]}")
    if peak > RSS_LIMIT:
        failures.append(f"--dry-run of the 8B folder: peak RSS {peak} > {RSS_LIMIT}")
    # A header that gives one tensor another shape: exit 2 naming the file and the tensor.
    name = "model.layers.0.input_layernorm.weight"
    folder, _ = sparse_folder(work, "llama8b_reshaped", LLAMA31_8B, reshape={name: [2, 2048]})
    config = folder_config(work, folder, "reshaped", LLAMA31_8B["vocab_size"])
    code, out, err, peak = run_logged([trainer, "--config", config, "--dry-run"], work, "bad")
    shard = os.path.join(folder, "model-00001-of-00008.safetensors")
    print(f"a header giving {name} the shape [2, 2048]: exit {code}")
    if code != 2 or shard not in err or name not in err or "[2, 2048]" not in err:
        failures.append(f"a header with another shape: exit {code}: {err[-2000:]}")


def check_no_weights(trainer, work, failures):
    folder = os.path.join(work, "llama70b_config_only")
    os.makedirs(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(LLAMA2_70B, f)
    config = folder_config(work, folder, "config_only", LLAMA2_70B["vocab_size"])
    for args in (["--dry-run"], ["--dry-run=load"], ["doctor", "--config"]):
        command = [trainer, *args, config] if args[0] == "doctor" else [trainer, "--config",
                                                                       config, *args]
        code, out, err, peak = run_logged(command, work, "config_only")
        print(f"70B config.json without weights, {' '.join(args)}: exit {code}, "
              f"peak RSS {peak / 1e9:.2f} GB")
        if code != 2 or folder not in err or "model.safetensors" not in err:
            failures.append(f"{args}: a folder without weights: exit {code}: {err[-2000:]}")
        if peak > RSS_LIMIT:
            failures.append(f"{args}: a folder without weights: peak RSS {peak} > {RSS_LIMIT}")


def main():
    trainer = sys.argv[1]
    failures = []
    want, _ = reference_parameters(LLAMA31_8B)
    with tempfile.TemporaryDirectory() as work:
        check_seed(trainer, work, want, failures)
        check_folder(trainer, work, want, failures)
        check_no_weights(trainer, work, failures)
    return report(failures)


if __name__ == "__main__":
    sys.exit(main())
