"""Reference tensors from bitsandbytes for nn/quant (NF4 with double quantization, int8 rows).

    quant_check.py OUT_DIR

writes OUT_DIR/refs.safetensors: for each case i (metadata "cases" = their count, "case.i" = a
description) the input `i.w` and what bitsandbytes makes of it:
  i.packed, i.absmax, i.nested_absmax, i.nested_code, i.offset   quantize_4bit(w, blocksize=64,
                                                                  quant_type="nf4",
                                                                  compress_statistics=True)
  i.absmax_plain                                                 the same, compress_statistics=False
  i.deq_float32, i.deq_bfloat16, i.deq_float16                   dequantize_4bit of the nested
                                                                  state, quant_state.dtype = each
                                                                  (bitsandbytes' PyTorch kernel
                                                                  where its CPU kernel reads other
                                                                  blocks' absmax: row_blocks_differ)
  i.cb, i.scb                                                    Int8Params' CB and SCB
  i.i8_deq                                                       int8_vectorwise_dequant(CB, SCB)
  i.i8_mm_float32, i.i8_mm_bfloat16                              the weight Linear8bitLt's CPU
                                                                  training forward multiplies by
plus `nf4_code` (get_4bit_type("nf4")) and `dynamic_code` (create_dynamic_map()).

With transformers installed it also writes OUT_DIR/tiny_nf4/ (a tiny Llama loaded with
BitsAndBytesConfig(load_in_4bit=True, nf4, double quantization) and saved by save_pretrained) and
OUT_DIR/tiny_nf4_refs.safetensors: each quantized weight P as bitsandbytes dequantizes it
(`P.deq`, in the saved quant_state's dtype), for the loader's test.

Runs with one intra-op thread (the offset is ATen's mean; its summation order follows the thread
count). Exits 77 when bitsandbytes or safetensors is not installed.
"""

import os
import sys

try:
    import torch
    import bitsandbytes.functional as F
    import safetensors.torch
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
except ImportError as e:  # the test that runs this skips
    print(f"skipped: {e}", file=sys.stderr)
    sys.exit(77)


def nf4_midpoints():
    code = F.get_4bit_type("nf4", device="cpu")
    return (code[:-1] + code[1:]) / 2


def case_weights():
    """(description, weight) pairs: shapes, dtypes and values that exercise the edge cases."""
    g = torch.Generator().manual_seed(55)
    randn = lambda *s: torch.randn(*s, generator=g)
    mids = nf4_midpoints()

    def ties(rows, cols):
        # Every value on a midpoint between two NF4 codes, each block's absmax 1.
        w = mids[torch.randint(0, 15, (rows * cols,), generator=g)].clone()
        w[::64] = 1.0
        return w.view(rows, cols)

    zero_rows = randn(129, 257)
    zero_rows[5:40] = 0
    scaled = randn(96, 160) * torch.logspace(-4, 3, 96)[:, None]
    return [
        ("float32 [64, 128]", randn(64, 128)),
        ("float32 [33, 77]: odd numel, ragged last block", randn(33, 77)),
        ("float32 [3, 5463]: 256*64 + 5 values, ragged 4-bit and 8-bit blocks", randn(3, 5463)),
        ("bfloat16 [50, 300]", randn(50, 300).bfloat16()),
        ("bfloat16 [129, 257] with zero rows (zero blocks)", zero_rows.bfloat16()),
        ("float32 [40, 64]: exact ties on the NF4 midpoints", ties(40, 64)),
        ("bfloat16 [40, 128]: ties rounded to bfloat16", ties(40, 128).bfloat16()),
        ("float32 [96, 160] rows scaled 1e-4 ... 1e3", scaled),
        ("float32 [8, 64] all zeros", torch.zeros(8, 64)),
        ("float32 [3, 21] all zeros, one ragged block", torch.zeros(3, 21)),
        ("float32 [16, 128] constant 0.02 (absmax - offset all zero)", torch.full((16, 128), 0.02)),
        ("float16 [64, 96]", randn(64, 96).half()),
        ("float32 [1024, 2112]: 33792 blocks", randn(1024, 2112) * 0.02),
        ("bfloat16 [2049, 2050]: over 2^22 values, a ragged last block", (randn(2049, 2050) * 0.02).bfloat16()),
    ]


def row_blocks_differ(w):
    """Whether bitsandbytes' CPU 4-bit dequantization kernel gives other weights than its
    quantization meant: with AVX-512 it reads the absmax of row r, column c at
    r * (n // 64) + c // 64 for rows of n values, which is the block's own, (r * n + c) // 64, only
    when 64 divides n (rows of odd length take the PyTorch kernel). Checked here, not assumed."""
    n = w.shape[-1]
    if n % 2 == 1 or n % 64 == 0:
        return False
    rows = w.numel() // n
    packed = torch.full(((w.numel() + 1) // 2, 1), 0xFF, dtype=torch.uint8)  # every code 1.0
    absmax = torch.arange(-(-w.numel() // 64), dtype=torch.float32)
    got = torch.ops.bitsandbytes.dequantize_4bit.default(packed, absmax, 64, "nf4", (rows, n), torch.float32)
    return not torch.equal(got.view(-1), absmax.repeat_interleave(64)[: w.numel()])


def nf4_refs(i, w, out):
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    out[f"{i}.packed"] = packed
    out[f"{i}.absmax"] = state.absmax
    out[f"{i}.nested_absmax"] = state.state2.absmax
    out[f"{i}.nested_code"] = state.state2.code
    out[f"{i}.offset"] = state.offset.reshape(())
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        state.dtype = dtype
        name = str(dtype).removeprefix("torch.")
        if row_blocks_differ(w):
            # bitsandbytes' PyTorch kernel, the same arithmetic as its CUDA kernel.
            absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
            out[f"{i}.deq_{name}"] = _dequantize_4bit_compute(packed.view(-1), absmax, state.code, 64,
                                                              w.shape, dtype)
        else:
            out[f"{i}.deq_{name}"] = F.dequantize_4bit(packed, state)
    _, plain = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
    out[f"{i}.absmax_plain"] = plain.absmax


def int8_refs(i, w, out):
    import bitsandbytes as bnb

    param = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False)
    param = param._quantize("cpu")
    out[f"{i}.cb"], out[f"{i}.scb"] = param.CB, param.SCB
    out[f"{i}.i8_deq"] = F.int8_vectorwise_dequant(param.CB, param.SCB)
    # autograd._functions.MatMul8bitFp.forward's weight, for a float32 and a bfloat16 input.
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        out[f"{i}.i8_mm_{name}"] = param.CB.data.to(dtype).mul_(param.SCB.unsqueeze(1).mul(1.0 / 127.0))


def tiny_folder(out_dir):
    """A transformers-saved bnb-4bit folder and bitsandbytes' dequantized weights of it."""
    try:
        import transformers
        from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    except ImportError:
        return
    transformers.logging.set_verbosity_error()
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    plain = os.path.join(out_dir, "tiny_plain")
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(plain)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                               bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    model = LlamaForCausalLM.from_pretrained(plain, quantization_config=quant, device_map="cpu")
    model.save_pretrained(os.path.join(out_dir, "tiny_nf4"))
    refs = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is not None and weight.__class__.__name__ == "Params4bit":
            refs[f"{name}.weight.deq"] = F.dequantize_4bit(weight.data, weight.quant_state)
    safetensors.torch.save_file(refs, os.path.join(out_dir, "tiny_nf4_refs.safetensors"))


def main():
    if len(sys.argv) != 2:
        print("usage: quant_check.py OUT_DIR", file=sys.stderr)
        return 2
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    out, meta = {}, {}
    cases = case_weights()
    for i, (what, w) in enumerate(cases):
        out[f"{i}.w"] = w
        meta[f"case.{i}"] = what
        meta[f"deq.{i}"] = "pytorch kernel" if row_blocks_differ(w) else "dequantize_4bit"
        nf4_refs(i, w, out)
        int8_refs(i, w, out)
    out["nf4_code"] = F.get_4bit_type("nf4", device="cpu")
    out["dynamic_code"] = F.create_dynamic_map()
    meta["cases"] = str(len(cases))
    out = {k: v.contiguous() for k, v in out.items()}
    safetensors.torch.save_file(out, os.path.join(out_dir, "refs.safetensors"), metadata=meta)
    tiny_folder(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
