"""TRL 1.16's preference losses on crafted batches: the reference for tests/test_preference.cpp.

Usage: preference_check.py OUT_DIR

Each case runs TRL's own code on a tiny stand-in model whose "backbone" returns fixed hidden states
H [2P, T, C] and whose head is a linear layer (W [V, C], b [V]):
  - sigmoid, ipo, hinge, robust and a weighted mix: DPOTrainer._compute_loss, the policy and the
    reference patched with TRL's fused LM head (add_fused_lm_head), as DPOTrainer patches them;
  - simpo: CPOTrainer.get_batch_loss_metrics (loss_type "simpo");
  - orpo: ORPOTrainer.get_batch_loss_metrics.
The trainers are built with object.__new__ and given only the attributes those methods read.
Written per case under OUT_DIR/<case>/: the inputs (H, W, b of the policy and the reference,
labels, full_labels), the loss, the gradients of the loss with respect to H, W, b and to the
per-sequence summed log-probabilities, and every metric TRL logs, as TRL computes it.
Files: index.txt lines "name dtype d0 d1 ..." for NAME.bin (raw little-endian), metrics.txt and
options.txt lines "key value". Exits 77 (skip) when trl is not installed.
"""

import os
import sys
import types
from collections import defaultdict

import torch
from torch import nn

try:
    import trl
    from trl.experimental.cpo import CPOTrainer
    from trl.experimental.orpo import ORPOTrainer
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head
    from transformers import PretrainedConfig
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

P, C, V = 3, 16, 64  # pairs, hidden size, vocabulary


class Backbone(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.hidden = nn.Parameter(hidden.clone())

    def forward(self, *args, **kwargs):
        return types.SimpleNamespace(last_hidden_state=self.hidden)


class TinyLM(nn.Module):
    """A causal LM whose backbone output is the parameter H, with a linear head (W, b)."""

    def __init__(self, hidden, weight, bias):
        super().__init__()
        self.config = PretrainedConfig()
        self.backbone = Backbone(hidden)
        self.lm_head = nn.Linear(weight.size(1), weight.size(0), bias=True)
        with torch.no_grad():
            self.lm_head.weight.copy_(weight)
            self.lm_head.bias.copy_(bias)
        self.is_gradient_checkpointing = False

    @property
    def base_model(self):  # what add_fused_lm_head calls for the last hidden state
        return self.backbone

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, *args, **kwargs):
        return types.SimpleNamespace(logits=self.lm_head(self.backbone.hidden))


def accelerator():
    identity = lambda x: x  # noqa: E731  one process: gathers return their input
    return types.SimpleNamespace(device=torch.device("cpu"), gather=identity,
                                 gather_for_metrics=identity, unwrap_model=identity)


def batch(gen, empty_prompt=False):
    """2P rows [chosen..., rejected...], right-padded: ids, attention mask, completion mask."""
    rows = []
    prompts = [int(torch.randint(2, 5, (1,), generator=gen)) for _ in range(P)]
    if empty_prompt:
        prompts[0] = 0
    for side in range(2):
        for i in range(P):
            n = int(torch.randint(2, 7, (1,), generator=gen)) + side
            rows.append((prompts[i], n))
    T = max(p + n for p, n in rows) + 1  # at least one padded position in every batch
    ids = torch.randint(0, V, (2 * P, T), generator=gen)
    attention = torch.zeros(2 * P, T, dtype=torch.long)
    completion = torch.zeros(2 * P, T, dtype=torch.long)
    for r, (p, n) in enumerate(rows):
        attention[r, : p + n] = 1
        completion[r, p : p + n] = 1
    ids = ids.masked_fill(attention == 0, 0)  # the pad token
    return ids, attention, completion


def weights(gen, T, scale):
    H = torch.randn(2 * P, T, C, generator=gen)
    W = torch.randn(V, C, generator=gen) * scale
    b = 1.0 + 0.5 * torch.randn(V, generator=gen)  # a nonzero mean logit
    return H, W, b


def dpo_case(gen, loss_types, loss_weights=None, beta=0.1, label_smoothing=0.0, empty_prompt=False):
    ids, attention, completion = batch(gen, empty_prompt)
    T = ids.size(1)
    policy = TinyLM(*weights(gen, T, 0.7))
    reference = TinyLM(*weights(gen, T, 0.7))
    predicted = policy().logits.argmax(-1).detach()  # [2P, T]: position t's most likely token
    follow = torch.rand(ids[:, 1:].shape, generator=gen) < 0.5
    ids[:, 1:] = torch.where(follow & (attention[:, 1:] == 1), predicted[:, :-1], ids[:, 1:])
    add_fused_lm_head(policy, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    add_fused_lm_head(reference)
    captured = []
    fused = policy.forward

    def forward(*args, **kwargs):  # keeps the per-token log-probabilities' gradient
        out = fused(*args, **kwargs)
        if torch.is_grad_enabled():
            out.log_probs.retain_grad()
            captured.append(out)
        return out

    policy.forward = forward
    policy.train()
    t = object.__new__(DPOTrainer)
    t.__dict__.update(
        model=policy, ref_model=reference, accelerator=accelerator(), aux_loss_enabled=False,
        ld_alpha=None, precompute_ref_logps=False, f_divergence_type="reverse_kl",
        loss_types=list(loss_types), loss_weights=list(loss_weights or [1.0] * len(loss_types)),
        beta=beta, label_smoothing=label_smoothing, use_weighting=False,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None, discopop_tau=0.05),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0,
        _tp_size=1)
    inputs = {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}
    loss = DPOTrainer._compute_loss(t, policy, inputs, return_outputs=False)
    loss.backward()
    shift_mask = completion[:, 1:].float()
    per_token_grad = captured[0].log_probs.grad
    # Every completion token of a row has the gradient of the row's sum.
    logps_grad = (per_token_grad * shift_mask).sum(1) / shift_mask.sum(1).clamp(min=1)
    metrics = {k: v[0] for k, v in t._metrics["train"].items() if k != "num_tokens"}
    labels = ids.masked_fill(completion == 0, -100)
    options = {"loss_type": ",".join(loss_types),
               "loss_weights": ",".join(str(w) for w in t.loss_weights),
               "beta": beta, "label_smoothing": label_smoothing}
    return dict(policy=policy, reference=reference, labels=labels, full_labels=None, loss=loss,
                logps_grad=logps_grad, metrics=metrics, options=options)


def cpo_like_case(gen, kind, beta, label_smoothing=0.0, simpo_gamma=0.5, cpo_alpha=0.0):
    ids, attention, completion = batch(gen)
    T = ids.size(1)
    policy = TinyLM(*weights(gen, T, 0.4))
    labels = ids.masked_fill(completion == 0, -100)
    b = {"chosen_input_ids": ids[:P], "chosen_attention_mask": attention[:P],
         "chosen_labels": labels[:P], "rejected_input_ids": ids[P:],
         "rejected_attention_mask": attention[P:], "rejected_labels": labels[P:]}
    cls = CPOTrainer if kind == "simpo" else ORPOTrainer
    t = object.__new__(cls)
    t.__dict__.update(accelerator=accelerator(), aux_loss_enabled=False, is_encoder_decoder=False,
                      pad_token_id=0, padding_value=0, beta=beta, label_smoothing=label_smoothing,
                      loss_type="simpo", simpo_gamma=simpo_gamma, cpo_alpha=cpo_alpha, alpha=0.0)
    captured = []

    def get_batch_logps(*args, **kwargs):  # keeps the averaged log-probabilities' gradient
        out = cls.get_batch_logps(*args, **kwargs)
        out.retain_grad()
        captured.append(out)
        return out

    t.get_batch_logps = get_batch_logps
    loss, metrics = cls.get_batch_loss_metrics(t, policy, b, train_eval="train")
    loss.backward()
    tokens = (labels[:, 1:] != -100).sum(1).float()
    logps_grad = captured[0].grad / tokens  # d loss / d sum = d loss / d average / count
    if kind == "simpo" and cpo_alpha != 0:
        # CPO's NLL (cross_entropy over the chosen rows' completion tokens, cpo_trainer.py:826-845)
        # reads the logits, not get_batch_logps; as a function of the rows' summed log-probabilities
        # it is -Σ chosen sums / Σ chosen tokens, whose gradient is added here.
        logps_grad[:P] -= cpo_alpha / tokens[:P].sum()
    options = {"loss_type": kind, "loss_weights": "1.0", "beta": beta,
               "label_smoothing": label_smoothing, "simpo_gamma": simpo_gamma,
               "cpo_alpha": cpo_alpha}
    full_labels = ids.masked_fill(attention == 0, -100) if kind == "orpo" else None
    return dict(policy=policy, reference=None, labels=labels, full_labels=full_labels, loss=loss,
                logps_grad=logps_grad, metrics={k: float(v) for k, v in metrics.items()},
                options=options)


def write(out_dir, name, case):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    tensors = {"labels": case["labels"], "loss": case["loss"].detach().reshape(1),
               "logps_grad": case["logps_grad"]}
    if case["full_labels"] is not None:
        tensors["full_labels"] = case["full_labels"]
    for who in ("policy", "reference"):
        m = case[who]
        if m is None:
            continue
        tensors[f"{who}_H"] = m.backbone.hidden.detach()
        tensors[f"{who}_W"] = m.lm_head.weight.detach()
        tensors[f"{who}_b"] = m.lm_head.bias.detach()
        if who == "policy":
            tensors["grad_H"] = m.backbone.hidden.grad
            tensors["grad_W"] = m.lm_head.weight.grad
            tensors["grad_b"] = m.lm_head.bias.grad
    with open(os.path.join(d, "index.txt"), "w") as index:
        for key, t in tensors.items():
            t = t.contiguous()
            dtype = "int64" if t.dtype == torch.long else "float32"
            t = t.to(torch.long if dtype == "int64" else torch.float32)
            index.write(" ".join([key, dtype] + [str(s) for s in t.shape]) + "\n")
            with open(os.path.join(d, key + ".bin"), "wb") as f:
                f.write(t.numpy().tobytes())
    with open(os.path.join(d, "metrics.txt"), "w") as f:
        for key, v in case["metrics"].items():
            f.write(f"{key} {float(v)!r}\n")
    with open(os.path.join(d, "options.txt"), "w") as f:
        for key, v in case["options"].items():
            f.write(f"{key} {v}\n")


def main():
    if len(sys.argv) != 2:
        print("usage: preference_check.py OUT_DIR", file=sys.stderr)
        return 2
    if trl.__version__ != "1.16.0":
        print(f"note: trl {trl.__version__}; the C++ side cites 1.16.0's lines", file=sys.stderr)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(53)
    cases = {
        "sigmoid": dpo_case(gen, ["sigmoid"]),
        "ipo": dpo_case(gen, ["ipo"], empty_prompt=True),
        "hinge": dpo_case(gen, ["hinge"], beta=0.05),
        "robust": dpo_case(gen, ["robust"], label_smoothing=0.2),
        "mix": dpo_case(gen, ["sigmoid", "ipo", "hinge"], loss_weights=[0.7, 0.2, 0.1], beta=0.2),
        "simpo": cpo_like_case(gen, "simpo", beta=2.0, simpo_gamma=0.5),
        "simpo_nll": cpo_like_case(gen, "simpo", beta=2.5, label_smoothing=0.1, simpo_gamma=1.0,
                                   cpo_alpha=1.0),
        "orpo": cpo_like_case(gen, "orpo", beta=0.1),
    }
    for name, case in cases.items():
        write(sys.argv[1], name, case)
    with open(os.path.join(sys.argv[1], "cases.txt"), "w") as f:
        f.write("\n".join(cases) + "\n")
    print(f"wrote {len(cases)} cases to {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
