#!/usr/bin/env python3
"""Hugging Face Llama / Qwen folders in and out of the trainer (CTest
Interop.HfLlamaFoldersInAndOut).

  hf_llama_check.py TRAINER [--memory-only | --no-memory | --parts | --parts-memory]

1. Tiny random models that transformers builds here, each saved by save_pretrained sharded over
   at least 3 files, with tokenizer files beside: Llama 3.1-style (GQA 4:1, llama3 rope scaling,
   untied), Llama 3.2-style (tied), Qwen 2-style (q/k/v biases, eps 1e-6, theta 1e6), Qwen 3-style
   (q/k norms, head_dim != hidden / heads, tied). The trainer trains one step at learning rate 0
   from `model: {pretrained: DIR}` alone (config.json picks the model and its keys), and
   `trainer export --format hf` writes the folder back: its tensors are byte-identical to the
   original's, AutoModelForCausalLM.from_pretrained loads it with no missing or unexpected keys
   and its logits on a 64-token batch equal the original's within 1e-5 (float32), config.json has
   the original's model_type, the tokenizer files and generation_config.json are the original's,
   the shards and index are those save_pretrained writes for --max-shard-size. A bf16 folder
   exports byte-identical in bf16 (--dtype auto).
2. trainer generate on a byte-vocabulary Llama folder (greedy) gives transformers' greedy tokens
   and stops where transformers stops for generation_config.json's list of eos ids; on a folder
   with a tokenizer.json that `tokenizers` trains here, generate without --tokenizer reads it and
   prints transformers' decoding of its greedy tokens, ended at the eos id.
3. Bad input, each exit 2 (1 for a file damaged while read) naming the file and the tensor or the
   field, and no checkpoint written: an index naming a missing shard, a shard with a wrong shape,
   a wrong dtype, a truncated shard, a shard header, an index and a config.json that are not JSON
   (the line and column, no library exception text), config.json sizes of 0 and sizes that make
   a model far larger than the weights (refused before it is built), config.json fields that
   change the math (rope scaling yarn, a Qwen sliding window in use, Mistral's sliding window,
   Llama's attention_bias, hidden_act, mlp_bias, another model_type), a YAML key that disagrees
   with config.json, model.name gpt.
4. Memory: the peak RSS of the trainer loading a random bf16 Llama folder of at least 1.5 GB
   (made here, deleted after) is at most 1.3x the model's bytes as the trainer holds them
   (float32).
5. (--parts) Under `launch --nproc-per-node 2`, with dist.strategy fsdp and with dist.tp_size 2,
   each rank reads only what it keeps from the folder: 3 AdamW steps' losses equal, bit for bit,
   those of the same run that loads the whole model first (model.pretrained_skip_head: true), for
   a bf16 untied folder and a float32 tied one; the tied one also on 4 processes with both (fsdp
   over 2 data-parallel ranks of tp 2).
6. (--parts) Loading the >= 1.5 GB bf16 folder that way (--dry-run=load), the largest rank's peak RSS
   is at most 0.6x the float32 model + 10% (0.66x), under fsdp and under tp 2; --parts-memory
   measures this alone, and under both on 4 processes too (a quarter of the model each).
7.-9. (tests/hf_config_fields.py) config.json in transformers 5's layout (rope_parameters) loads
   with transformers' loss and exports in that layout; rope settings that disagree are refused;
   every field of transformers' config class of each model_type is read, refused or shown not to
   change the loss, and fields the class lacks are warned about.
10. A folder with model.safetensors and an index with shards loads model.safetensors, as
   transformers does (a stale index beside it too), and the log names the files read.
Exits 77 (skipped) when transformers or safetensors is not installed.
"""
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

from run_check import one_intra_op_thread

one_intra_op_thread()  # before torch is imported

try:
    import torch
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import load_file, save_file
    from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
    from hf_config_fields import config_fields, v5_layouts
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, CTX = 96, 128


def cases():
    """(name, model) for the four families, float32, random weights."""
    rope31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    rope32 = {**rope31, "factor": 32.0}
    common = dict(vocab_size=VOCAB, max_position_embeddings=CTX, num_hidden_layers=2,
                  bos_token_id=1, eos_token_id=2)
    out = []
    torch.manual_seed(0)
    out.append(("llama31", LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=112, num_attention_heads=8, num_key_value_heads=2,
        rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=rope31, tie_word_embeddings=False,
        **common))))
    out.append(("llama32", LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=rope32, tie_word_embeddings=True,
        **common))))
    out.append(("qwen2", Qwen2ForCausalLM(Qwen2Config(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False, **common))))
    out.append(("qwen3", Qwen3ForCausalLM(Qwen3Config(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=24, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, **common))))
    for _, model in out:
        with torch.no_grad():  # q/k/v biases and norm weights away from their zeros and ones
            for name, p in model.named_parameters():
                if name.endswith("bias") or "norm" in name:
                    p.add_(torch.randn_like(p) * 0.1)
        model.eval()
    return out


TOKENIZER_FILES = {  # copied as they are: their content is not read by the export
    "tokenizer.json": '{"version": "1.0", "model": {"type": "BPE"}}\n',
    "tokenizer_config.json": '{"bos_token": "<s>", "eos_token": "</s>"}\n',
    "special_tokens_map.json": '{"bos_token": "<s>"}\n',
}


def save_folder(model, folder, shards=3, dtype=None):
    """save_pretrained sharded over at least `shards` files, with tokenizer files beside."""
    if dtype is not None:
        model = model.to(dtype)
    total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    model.save_pretrained(folder, max_shard_size=total // (shards + 1), safe_serialization=True)
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        files = set(json.load(f)["weight_map"].values())
    assert len(files) >= shards, files
    for name, text in TOKENIZER_FILES.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return sorted(files)


def tensors_in_file_order(path):
    """The tensors of a safetensors file in the order of their data."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    tensors = load_file(path)
    return {k: tensors[k] for k in sorted(header, key=lambda k: header[k]["data_offsets"][0])}


def folder_tensors(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        out.update(load_file(os.path.join(folder, name)))
    return out


def write_config(work, name, lines):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def run_config(work, name, folder, extra=()):
    """A config whose model section only points at `folder`: one step at learning rate 0."""
    return write_config(work, name, [
        "seed: 1",
        "model:",
        f"  pretrained: {folder}",
        *[f"  {e}" for e in extra],
        "data:",
        "  name: synthetic_tokens",
        f"  num_classes: {VOCAB}",
        "  seq_len: 16",
        "  train_samples: 8",
        "  val_samples: 4",
        "  batch_size: 2",
        "  workers: 0",
        "train:",
        "  max_steps: 1",
        "optim:",
        "  name: sgd",
        "  lr: 0",
        "run:",
        "  progress: never",
        "  tensorboard: false",
    ])


def train(trainer, cfg, run_dir, sets=()):
    args = [trainer, "--config", cfg, "--run-dir", run_dir]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True)


def compare_logits(name, ours, theirs, tol=1e-5):
    diff = ((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-12)).item()
    print(f"{name}: max relative |diff| of the logits {diff:.3g}")
    if diff > tol:
        sys.exit(f"{name}: logits differ by {diff} (relative)")


def round_trip(trainer, name, model, work):
    """1. The folder through the trainer and back."""
    folder = os.path.join(work, name)
    shards = save_folder(model, folder)
    cfg = run_config(work, name, folder)
    run = os.path.join(work, name + "_run")
    r = train(trainer, cfg, run)
    if r.returncode != 0:
        sys.exit(f"{name}: training from the folder failed: {r.stderr}")
    ckpt = os.path.join(run, "checkpoints", "step_00000001.safetensors")
    original = folder_tensors(folder)
    total = sum(t.numel() * t.element_size() for t in original.values())
    out = os.path.join(work, name + "_export")
    size = str(total // 4)  # bytes: at least 4 shards
    r = subprocess.run([trainer, "export", "--checkpoint", ckpt, "--out", out, "--format", "hf",
                        "--max-shard-size", size], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{name}: export failed: {r.stderr}")
    exported = folder_tensors(out)
    if set(exported) != set(original):
        sys.exit(f"{name}: exported tensors {sorted(set(exported) ^ set(original))} differ "
                 "in name from the original's")
    for key, t in original.items():
        e = exported[key]
        if e.dtype != t.dtype or e.shape != t.shape or not torch.equal(
                e.contiguous().view(torch.uint8), t.contiguous().view(torch.uint8)):
            sys.exit(f"{name}: exported {key} is not byte-identical to the original's")
    # Shard names and the index, as save_pretrained writes them.
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    if n < 4 or files != [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]:
        sys.exit(f"{name}: shards {files}")
    if index["metadata"]["total_size"] != total or os.path.exists(
            os.path.join(out, "model.safetensors")):
        sys.exit(f"{name}: index metadata {index['metadata']} (expected total_size {total})")
    # The split is huggingface_hub's for the tensors in the order the export wrote them.
    ordered = {}
    for f_name in files:
        ordered.update(tensors_in_file_order(os.path.join(out, f_name)))
    split = split_torch_state_dict_into_shards(
        ordered, filename_pattern="model{suffix}.safetensors", max_shard_size=int(size))
    if split.tensor_to_filename != index["weight_map"]:
        sys.exit(f"{name}: the export's shards are not huggingface_hub's split")
    loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{name}: from_pretrained reported {problems}")
    with open(os.path.join(out, "config.json")) as f:
        cfg_out = json.load(f)
    with open(os.path.join(folder, "config.json")) as f:
        cfg_in = json.load(f)
    for key in ("model_type", "tie_word_embeddings", "num_key_value_heads", "rope_scaling",
                "rms_norm_eps", "rope_theta", "bos_token_id", "eos_token_id"):
        if cfg_out.get(key) != cfg_in.get(key) and not (key == "rope_scaling" and
                                                        cfg_in.get(key) is None):
            sys.exit(f"{name}: config.json {key} is {cfg_out.get(key)!r}, "
                     f"the original's {cfg_in.get(key)!r}")
    if cfg_out["torch_dtype"] != "float32":
        sys.exit(f"{name}: torch_dtype {cfg_out['torch_dtype']}")
    for side in [*TOKENIZER_FILES, "generation_config.json"]:
        with open(os.path.join(folder, side), "rb") as a, open(os.path.join(out, side), "rb") as b:
            if a.read() != b.read():
                sys.exit(f"{name}: {side} is not the original's")
    tokens = torch.randint(0, VOCAB, (2, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        compare_logits(f"{name}: export -> transformers", loaded.eval()(tokens).logits,
                       model(tokens).logits)
    # The default shard size: one model.safetensors, no index.
    single = os.path.join(work, name + "_single")
    subprocess.run([trainer, "export", "--checkpoint", ckpt, "--out", single, "--format", "hf"],
                   check=True, capture_output=True)
    if os.listdir(single).count("model.safetensors") != 1 or os.path.exists(
            os.path.join(single, "model.safetensors.index.json")):
        sys.exit(f"{name}: the default export is not one model.safetensors: {os.listdir(single)}")
    # Into the sharded export's folder: the shards and the index of before are gone.
    subprocess.run([trainer, "export", "--checkpoint", ckpt, "--out", out, "--format", "hf"],
                   check=True, capture_output=True)
    left = sorted(f for f in os.listdir(out) if "safetensors" in f)
    if left != ["model.safetensors"]:
        sys.exit(f"{name}: exporting again into {out} left {left}")
    print(f"{name}: {len(shards)} shards in, {n} out, byte-identical, model_type "
          f"{cfg_out['model_type']}")
    return folder, ckpt


def bf16_round_trip(trainer, model, work):
    """A bf16 folder exports in bf16, byte-identical."""
    folder = os.path.join(work, "bf16")
    save_folder(model, folder, dtype=torch.bfloat16)
    model.float()
    run = os.path.join(work, "bf16_run")
    r = train(trainer, run_config(work, "bf16", folder), run)
    if r.returncode != 0:
        sys.exit(f"bf16: training failed: {r.stderr}")
    out = os.path.join(work, "bf16_export")
    subprocess.run([trainer, "export", "--checkpoint", run, "--out", out, "--format", "hf"],
                   check=True, capture_output=True)
    original, exported = folder_tensors(folder), folder_tensors(out)
    for key, t in original.items():
        if exported[key].dtype != torch.bfloat16 or not torch.equal(exported[key], t):
            sys.exit(f"bf16: exported {key} is {exported[key].dtype}, or differs")
    with open(os.path.join(out, "config.json")) as f:
        if json.load(f)["torch_dtype"] != "bfloat16":
            sys.exit("bf16: config.json's torch_dtype is not bfloat16")
    print("bf16 folder: exported in bf16, byte-identical")


def generate_stops_at_eos(trainer, work):
    """2. Greedy tokens and eos ids as transformers' generate gives them."""
    torch.manual_seed(5)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=256, max_position_embeddings=CTX, num_hidden_layers=2, hidden_size=64,
        intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        initializer_range=0.3, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=None)).eval()
    prompt = b"Hello"
    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        free = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(prompt):].tolist()
    # Stop ids: one that never appears and the fifth token drawn (or the first time it appears).
    stop = [next(t for t in range(256) if t not in free), free[4]]
    model.generation_config.eos_token_id = stop
    folder = os.path.join(work, "bytes")
    save_folder(model, folder)
    os.remove(os.path.join(folder, "tokenizer.json"))  # bytes: no tokenizer
    with torch.no_grad():
        theirs = model.generate(ids, max_new_tokens=12, do_sample=False,
                                pad_token_id=0)[0, len(prompt):].tolist()
    cfg = run_config(work, "bytes", folder, [])
    args = [trainer, "generate", "--config", cfg, "--prompt", prompt.decode(), "--temperature",
            "0", "--max-new-tokens", "12", "--set", "data.num_classes=256"]
    r = subprocess.run(args, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"generate failed: {r.stderr.decode(errors='replace')}")
    ours = list(r.stdout[len(prompt):-1])  # the prompt, the tokens' bytes, a newline
    if ours != theirs:
        sys.exit(f"generate: {ours}, transformers {theirs} (eos {stop}, free {free})")
    r = subprocess.run(args + ["--ignore-eos"], capture_output=True)
    if list(r.stdout[len(prompt):-1]) != free:
        sys.exit(f"generate --ignore-eos: {list(r.stdout[len(prompt):-1])}, expected {free}")
    print(f"generate: greedy tokens as transformers', stopped at eos after {len(ours)} tokens")


def generate_with_the_folders_tokenizer(trainer, work):
    """2. Without --tokenizer, generate reads the folder's tokenizer.json: its text is transformers'
    decoding of transformers' greedy tokens, ended at the eos id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = "the quick brown fox jumps over the lazy dog; a stitch in time saves nine. " * 20
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|eot_id|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    vocab = tok.get_vocab_size()
    torch.manual_seed(7)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, max_position_embeddings=CTX, num_hidden_layers=2, hidden_size=64,
        intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        initializer_range=0.3, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=None)).eval()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok)
    prompt = "the lazy fox"
    ids = torch.tensor([hf_tok.encode(prompt)])
    with torch.no_grad():
        free = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, ids.shape[1]:].tolist()
    model.generation_config.eos_token_id = [tok.token_to_id("<|eot_id|>"), free[3]]
    folder = os.path.join(work, "bpe")
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with torch.no_grad():
        theirs = model.generate(ids, max_new_tokens=10, do_sample=False,
                                pad_token_id=0)[0, ids.shape[1]:].tolist()
    expected = prompt + hf_tok.decode(theirs, skip_special_tokens=False,
                                      clean_up_tokenization_spaces=False) + "\n"
    r = subprocess.run([trainer, "generate", "--config", run_config(work, "bpe", folder),
                        "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "10",
                        "--set", f"data.num_classes={vocab}"], capture_output=True)
    # The bytes of random tokens need not be UTF-8: compared as tokenizers decodes them (invalid
    # sequences as U+FFFD).
    out = r.stdout.decode("utf-8", errors="replace")
    if r.returncode != 0 or out != expected:
        sys.exit(f"generate with the folder's tokenizer: exit {r.returncode}, {out!r}, "
                 f"expected {expected!r} ({theirs}); {r.stderr[-300:]}")
    print(f"generate: the folder's tokenizer.json, {len(theirs)} tokens as transformers' "
          f"({out.strip()!r})")


def expect_refusal(trainer, cfg, work, label, needles, sets=(), codes=(2,)):
    run = os.path.join(work, "bad_" + label)
    r = train(trainer, cfg, run, sets)
    last = r.stderr.strip()
    if r.returncode not in codes or any(n not in last for n in needles):
        sys.exit(f"{label}: exit {r.returncode}, expected {codes} naming {needles}: {last!r}")
    if os.path.isdir(os.path.join(run, "checkpoints")) and os.listdir(
            os.path.join(run, "checkpoints")):
        sys.exit(f"{label}: a checkpoint was written")
    print(f"{label}: refused (exit {r.returncode}): {last.splitlines()[-1][:200]}")


def bad_weights(trainer, model, work):
    """3. Damaged folders: nothing trains."""
    def fresh(label):
        folder = os.path.join(work, "bad_w_" + label)
        shards = save_folder(model, folder)
        return folder, shards
    folder, shards = fresh("missing")
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        wmap = json.load(f)["weight_map"]
    victim = shards[1]
    tensor = next(k for k, v in wmap.items() if v == victim)
    os.remove(os.path.join(folder, victim))
    expect_refusal(trainer, run_config(work, "missing", folder), work, "missing shard",
                   ["model.safetensors.index.json", victim])
    for label, change in (("shape", lambda t: t.reshape(-1)[:-1].clone()),
                          ("dtype", lambda t: t.to(torch.int32))):
        folder, shards = fresh(label)
        path = os.path.join(folder, shards[1])
        tensors = load_file(path)
        key = sorted(k for k in tensors if k.endswith("weight"))[0]
        tensors[key] = change(tensors[key])
        save_file(tensors, path, metadata={"format": "pt"})
        expect_refusal(trainer, run_config(work, label, folder), work, "wrong " + label,
                       [shards[1], key])
    folder, shards = fresh("truncated")
    path = os.path.join(folder, shards[2])
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    expect_refusal(trainer, run_config(work, "truncated", folder), work, "truncated shard",
                   [shards[2], "truncated"], codes=(1, 2))
    folder, shards = fresh("header")
    with open(os.path.join(folder, shards[0]), "r+b") as f:
        f.seek(8)
        f.write(b"x")  # the header's opening brace
    expect_refusal(trainer, run_config(work, "header", folder), work, "shard header not JSON",
                   [shards[0], "header is not JSON at line 1, column "])
    folder, shards = fresh("index")
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        f.write('{"weight_map": ')
    expect_refusal(trainer, run_config(work, "index", folder), work, "index not JSON",
                   ["model.safetensors.index.json:1:", ": not JSON: "])


def single_file_first(trainer, model, work):
    """10. A folder holding model.safetensors and an index with its shards (what a sharded
    save_pretrained leaves in a folder that held one file) loads model.safetensors, as
    transformers' from_pretrained does, and the log names it; an index beside it that names a
    shard that is gone is no error, as in transformers."""
    folder = os.path.join(work, "both")
    shards = save_folder(model, folder)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    other.save_pretrained(os.path.join(work, "both_single"), safe_serialization=True)
    shutil.copy(os.path.join(work, "both_single", "model.safetensors"), folder)
    theirs = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    if torch.equal(theirs["model.norm.weight"], model.state_dict()["model.norm.weight"]):
        sys.exit("precedence: transformers loaded the shards; the test no longer discriminates")
    cfg = run_config(work, "both", folder)
    for label in ("index and shards beside", "a stale index beside"):
        run = os.path.join(work, "both_run_" + str(len(label)))
        r = train(trainer, cfg, run)
        if r.returncode != 0:
            sys.exit(f"precedence, {label}: exit {r.returncode}: {r.stderr[-400:]}")
        said = "model.safetensors (" + os.path.join(folder, "model.safetensors.index.json")
        if said not in r.stderr or "not read" not in r.stderr:
            sys.exit(f"precedence, {label}: the log does not say which files were read: "
                     f"{r.stderr[-600:]}")
        out = os.path.join(work, "both_export_" + str(len(label)))
        subprocess.run([trainer, "export", "--checkpoint", run, "--out", out, "--format", "hf"],
                       check=True, capture_output=True)
        for key, t in folder_tensors(out).items():
            if not torch.equal(t, theirs[key]):
                sys.exit(f"precedence, {label}: {key} is not the one transformers loads "
                         "(model.safetensors)")
        if os.path.exists(os.path.join(folder, shards[1])):
            os.remove(os.path.join(folder, shards[1]))  # the index names a shard that is gone
    print("model.safetensors beside an index with shards: loaded as transformers loads it, "
          "also with a stale index")


def bad_configs(trainer, model, work):
    """3. config.json fields that change the math, and keys that disagree with it."""
    folder = os.path.join(work, "bad_cfg")
    save_folder(model, folder)
    cfg_path = os.path.join(folder, "config.json")
    with open(cfg_path) as f:
        good = json.load(f)
    edits = [
        ("rope yarn", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
        ("attention bias", {"attention_bias": True}, "attention_bias"),
        ("activation", {"hidden_act": "gelu"}, "hidden_act"),
        ("mlp bias", {"mlp_bias": True}, "mlp_bias"),
        ("model type", {"model_type": "gemma"}, "model_type"),
        ("qwen2 window", {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16,
                          "max_window_layers": 0}, "sliding_window"),
        ("mistral window", {"model_type": "mistral", "sliding_window": 16}, "sliding_window"),
        ("vocab size 0", {"vocab_size": 0}, "vocab_size is 0, expected a positive integer"),
        ("head_dim 0", {"head_dim": 0}, "head_dim is 0, expected a positive integer"),
        ("intermediate size 1e9", {"intermediate_size": 10**9}, "parameters, but the weights"),
        ("layers 1e12", {"num_hidden_layers": 1e12}, "parameters, but the weights"),
    ]
    for label, edit, field in edits:
        with open(cfg_path, "w") as f:
            json.dump({**good, **edit}, f)
        expect_refusal(trainer, run_config(work, "cfg", folder), work, label,
                       ["config.json", field])
    with open(cfg_path, "w") as f:
        f.write('{"model_type": "llama",')
    expect_refusal(trainer, run_config(work, "cfg", folder), work, "config.json not JSON",
                   ["config.json:1:", ": not JSON: "])
    with open(cfg_path, "w") as f:
        json.dump(good, f)
    expect_refusal(trainer, run_config(work, "heads", folder, ["n_head: 2"]), work,
                   "disagreeing key", ["model.n_head", "2", str(good["num_attention_heads"])])
    expect_refusal(trainer, run_config(work, "gpt", folder, ["name: gpt"]), work, "model.name gpt",
                   ["model.name", "gpt", "llama"])
    # A weights file with config.json beside it: the model's keys are the config's, checked.
    single = os.path.join(work, "single")
    model.save_pretrained(single, safe_serialization=True)
    keys = ["name: llama", "n_layer: 2", "n_head: 4", "n_kv_head: 2", "n_embd: 64",
            "intermediate_size: 96", f"vocab_size: {VOCAB}", f"block_size: {CTX}",
            "rms_norm_eps: 1e-5", "rope_theta: 500000", "rope_scaling: llama3", "rope_factor: 32",
            "rope_original_context: 32", "tie_embeddings: true"]
    file_cfg = run_config(work, "file", os.path.join(single, "model.safetensors"), keys)
    r = train(trainer, file_cfg, os.path.join(work, "file_run"))
    if r.returncode != 0:
        sys.exit(f"a weights file with its config.json beside is refused: {r.stderr}")
    expect_refusal(trainer, file_cfg, work, "file with another rope_theta",
                   ["config.json", "model.rope_theta"], ["model.rope_theta=10000"])
    mistral = os.path.join(work, "mistral")
    shutil.copytree(folder, mistral)
    with open(os.path.join(mistral, "config.json"), "w") as f:
        json.dump({**good, "model_type": "mistral", "sliding_window": None,
                   "architectures": ["MistralForCausalLM"]}, f)
    r = train(trainer, run_config(work, "mistral", mistral), os.path.join(work, "mistral_run"))
    if r.returncode != 0:
        sys.exit(f"a Mistral folder without a sliding window is refused: {r.stderr}")
    print("mistral without a sliding window: loads")


def llama_shapes(hidden, inter, layers, heads, kv, vocab):
    """The state-dict names and shapes of LlamaForCausalLM with these sizes, untied."""
    hd = hidden // heads
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (hidden,),
                       p + "post_attention_layernorm.weight": (hidden,),
                       p + "self_attn.q_proj.weight": (heads * hd, hidden),
                       p + "self_attn.k_proj.weight": (kv * hd, hidden),
                       p + "self_attn.v_proj.weight": (kv * hd, hidden),
                       p + "self_attn.o_proj.weight": (hidden, heads * hd),
                       p + "mlp.gate_proj.weight": (inter, hidden),
                       p + "mlp.up_proj.weight": (inter, hidden),
                       p + "mlp.down_proj.weight": (hidden, inter)})
    return shapes


def big_folder(work, layers=5):
    """A random bf16 Llama folder of >= 1.5 GB (0.35 GB a layer) in layers + 1 shards, written
    tensor by tensor with torch (fast, no transformers init; the layers repeat one random layer's
    values): (folder, its tensors' bytes)."""
    hidden, inter, heads, kv, vocab = 4096, 11008, 32, 8, 256
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, max_position_embeddings=CTX,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)
    folder = os.path.join(work, "big")
    os.makedirs(folder)
    cfg.save_pretrained(folder)
    shapes = llama_shapes(hidden, inter, layers, heads, kv, vocab)
    weight_map, total, gen = {}, 0, torch.Generator().manual_seed(0)
    groups = [["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]] + \
        [[k for k in shapes if k.startswith(f"model.layers.{i}.")] for i in range(layers)]
    drawn = {}  # a layer's tensors drawn once, every layer the same: the bytes are the point

    def draw(name):
        role = name.split(".", 3)[-1] if name.startswith("model.layers.") else name
        if role not in drawn:
            drawn[role] = (torch.randn(shapes[name], generator=gen) * 0.02).to(torch.bfloat16)
        return drawn[role]
    for k, names in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        part = {n: draw(n) for n in names}
        save_file(part, os.path.join(folder, file), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in part.values())
        weight_map.update({n: file for n in names})
        del part
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    assert total >= 1.5e9, total
    return folder, total


def peak_rss_of(command):
    """(exit code, stderr, the peak RSS in bytes of the largest process `command` started,
    itself and every descendant it waited for)."""
    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "sys.stderr.write(r.stdout + r.stderr)\n"
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    r = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True)
    code, peak_kib = (int(x) for x in r.stdout.split())
    return code, r.stderr, peak_kib * 1024


def peak_rss_loading(trainer, work):
    """4. Peak RSS while a bf16 folder of >= 1.5 GB loads: <= 1.3x the float32 model."""
    folder, total = big_folder(work)
    model_bytes = total * 2  # float32 parameters
    config = run_config(work, "big", folder)
    code, err, peak = peak_rss_of([trainer, "generate", "--config", config, "--prompt", "a",
                                   "--max-new-tokens", "1", "--temperature", "0",
                                   "--set", "data.num_classes=256"])
    shutil.rmtree(folder)
    if code != 0:
        sys.exit(f"loading the big folder failed: {err}")
    print(f"memory: {total / 1e9:.2f} GB bf16 folder, {model_bytes / 1e9:.2f} GB float32 model, "
          f"peak RSS {peak / 1e9:.2f} GB = {peak / model_bytes:.2f}x the model")
    if peak > 1.3 * model_bytes:
        sys.exit(f"peak RSS {peak} > 1.3 x {model_bytes}")


STREAMED = "each process reading the part it keeps"  # the trainer's log line when it streams
LAUNCH2 = ["launch", "--standalone", "--nproc-per-node", "2", "--"]
LAUNCH4 = ["launch", "--standalone", "--nproc-per-node", "4", "--"]
# layout, launcher, settings
PART_LAYOUTS = (("fsdp", LAUNCH2, ["dist.strategy=fsdp"]),
                ("tp 2", LAUNCH2, ["dist.tp_size=2"]),
                ("fsdp x tp 2", LAUNCH4, ["dist.strategy=fsdp", "dist.tp_size=2"]))


def train_losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [rec["loss"] for rec in records if rec.get("split") == "train"]


def streams_exactly(trainer, models, work):
    """5. Under launch --nproc-per-node 2, with fsdp and with tp 2 (the tied folder also on 4
    processes with both), each rank reads only what it keeps from the folder: 3 AdamW steps give,
    bit for bit, the losses of the same run that loads the whole model first and then shards or
    splits it (model.pretrained_skip_head: true takes that path; the folder holds every tensor, so
    nothing is re-initialised). A bf16 untied folder and a float32 tied one."""
    common = ["train.max_steps=3", "optim.name=adamw", "optim.lr=0.001", "run.log_every=1"]
    # fsdp x tp on the tied float32 folder (a bf16 base under fsdp x tp: lora_load_check.py).
    for name, model, dtype, layouts in (("llama31", models[0][1], torch.bfloat16, PART_LAYOUTS[:2]),
                                        ("qwen3", models[3][1], None, PART_LAYOUTS)):
        folder = os.path.join(work, name + "_parts")
        save_folder(copy.deepcopy(model), folder, dtype=dtype)
        cfg = run_config(work, name + "_parts", folder)
        for mode, launch, sets in layouts:
            losses = {}
            for path, extra in (("streamed", []), ("whole", ["model.pretrained_skip_head=true"])):
                run_dir = os.path.join(work, f"{name}_{mode}_{path}".replace(" ", "_"))
                args = [trainer, *launch, "--config", cfg, "--run-dir", run_dir]
                for s in common + sets + extra:
                    args += ["--set", s]
                r = subprocess.run(args, capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"{name} {mode}: training ({path}) failed: {r.stdout}{r.stderr}")
                if (STREAMED in r.stdout + r.stderr) != (path == "streamed"):
                    sys.exit(f"{name} {mode}: the {path} run took the other loading path: "
                             f"{r.stdout}{r.stderr}")
                losses[path] = train_losses(run_dir)
            if len(losses["streamed"]) != 3 or losses["streamed"] != losses["whole"]:
                sys.exit(f"{name} {mode}: streamed losses {losses['streamed']} != the whole "
                         f"model's {losses['whole']}")
            print(f"{name} {mode}, parts read from the folder: losses "
                  f"{losses['streamed']} equal the whole-model load's bit for bit")


def peak_rss_loading_parts(trainer, work, layouts=PART_LAYOUTS[:2]):
    """6. launch --nproc-per-node 2, with fsdp and with tp 2 (and 4 processes with both: a quarter
    each), loading a random bf16 folder of
    >= 1.5 GB (--dry-run=load: built, loaded and sharded or split, then exits): the peak RSS of every
    rank is at most 0.6x the whole model as training holds it (float32, 2x the bf16 folder's
    bytes) + 10%, i.e. 0.66x. Each rank keeps half of it in float32, 0.5x, beside the ~0.5 GB
    that any trainer process holds (LibTorch): 7 layers, 2.5 GB of bf16, keep that below 0.1x."""
    folder, total = big_folder(work, layers=7)
    model_bytes = total * 2  # float32 parameters, the dtype the ranks keep
    config = run_config(work, "big_parts", folder)
    failed = []
    for mode, launch, sets in layouts:
        args = [trainer, *launch, "--config", config, "--dry-run=load", "--set", "data.num_classes=256"]
        for s in sets:
            args += ["--set", s]
        code, err, peak = peak_rss_of(args)
        if code != 0:
            sys.exit(f"loading the big folder under {mode} failed: {err}")
        if STREAMED not in err:
            sys.exit(f"{mode}: the ranks did not read their parts from the folder: {err}")
        print(f"{mode} memory: {total / 1e9:.2f} GB bf16 folder, {model_bytes / 1e9:.2f} GB "
              f"float32 model, the largest rank's peak RSS {peak / 1e9:.2f} GB = "
              f"{peak / model_bytes:.2f}x the model (limit 0.66x)")
        if peak > 0.6 * 1.1 * model_bytes:
            failed.append(f"{mode}: a rank's peak RSS {peak} > 0.6 x 1.1 x {model_bytes}")
    shutil.rmtree(folder)
    if failed:
        sys.exit("; ".join(failed))


def main():
    trainer = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    with tempfile.TemporaryDirectory() as work:
        if mode == "--parts":  # 5 and 6 alone (CTest Interop.HfFolderStreamsIntoRankParts)
            streams_exactly(trainer, cases(), work)
            peak_rss_loading_parts(trainer, work)
            print("OK")
            return
        if mode == "--parts-memory":  # 6 in every layout (docs/benchmarks.md's figures)
            peak_rss_loading_parts(trainer, work, PART_LAYOUTS)
            print("OK")
            return
        if mode != "--memory-only":
            models = cases()
            for name, model in models:
                round_trip(trainer, name, model, work)
            v5_layouts(trainer, work, models, VOCAB)
            config_fields(trainer, work, models, VOCAB)
            bad_weights(trainer, models[0][1], work)
            bad_configs(trainer, models[1][1], work)
            single_file_first(trainer, models[0][1], work)
            generate_stops_at_eos(trainer, work)
            generate_with_the_folders_tokenizer(trainer, work)
            bf16_round_trip(trainer, models[1][1], work)
        if mode != "--no-memory":
            peak_rss_loading(trainer, work)
    print("OK")


if __name__ == "__main__":
    main()
