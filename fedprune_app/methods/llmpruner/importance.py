"""LLM-Pruner's first-order Taylor importance (Ma et al. 2023, "LLM-Pruner", §3.2 Eq. 2–5) of the
coupled structures of a LLaMA-family model, in the form a federation can average.

Structures (LLM-Pruner's dependency groups, §3.1) per decoder layer:
- a kv group j: the key/value head j (rows of k_proj, v_proj), the G = heads / kv-heads query heads
  that read it (rows of q_proj) and their columns of o_proj. With GQA (SmolLM2: 9 query heads, 3 kv
  heads) a key/value head cannot go without its query heads, so the group is the unit, as
  LLM-Pruner's LLaMA-3 script prunes GQA models (root k_proj, consecutive groups of head_dim); the
  query-per-kv ratio G stays uniform, so HF's attention runs.
- an MLP channel c: row c of gate_proj and up_proj, column c of down_proj.

Element-wise importance (Eq. 4, first order): I(w) = |w · ∂L/∂w| with L the causal-LM loss on
calibration text. A structure's importance is the sum over its weights (LLM-Pruner's
`group_reduction="sum"`) of
- `param_first` (LLM-Pruner's default `--taylor param_first`, used by its LLaMA recipes): Σ_rows
  Σ_cols |w·g|;
- `vectorize` (Eq. 3's vector-wise form): Σ_rows |Σ_cols w·g| (per row of q/k/v/gate/up, per column
  of o/down).

Federated form: each client sends, per matrix of the group, one number per row (or column): Σ|w·g_k|
or Σ w·g_k (`taylor_rows`, a few thousand floats per layer), with g_k the gradient of its mean token
loss and its token count T_k as the weight. The server averages the rows (Σ T_k r_k / Σ T_k), takes
|·| and sums them per structure (`group_scores`). With `vectorize` that is exactly the pooled
importance (the rows are linear in the gradient and the pooled gradient is Σ T_k g_k / Σ T_k); with
`param_first` it is the average of the clients' importances, which is ≥ the pooled one (triangle
inequality) and equal when the clients' gradients agree in sign element-wise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedprune_app.core.replies import weighted_average
from fedprune_app.llm.layers import decoder_layers
from fedprune_app.llm.models import model_device

ROWS = (
    "q",
    "k",
    "v",
    "o",
    "gate",
    "up",
    "down",
)  # per layer: rows of q/k/v/gate/up, columns of o/down
IMPORTANCE_PREFIX = "taylor."  # a round-1 reply: float32 (layers, width) per ROWS name


def dims(config: Any) -> dict[str, int]:
    """d, heads, kv heads, G (query heads per kv head), head_dim, intermediate, layers of a
    LLaMA-family config."""
    d, heads = int(config.hidden_size), int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or d // heads)
    return {
        "d": d,
        "heads": heads,
        "kv": kv,
        "groups": heads // kv,
        "head_dim": head_dim,
        "inter": int(config.intermediate_size),
        "layers": int(config.num_hidden_layers),
    }


def row_widths(config: Any) -> dict[str, int]:
    """The width of each `ROWS` array per layer (q/o: heads·head_dim; k/v: kv·head_dim;
    gate/up/down: inter)."""
    s = dims(config)
    q, kv = s["heads"] * s["head_dim"], s["kv"] * s["head_dim"]
    return {
        "q": q,
        "k": kv,
        "v": kv,
        "o": q,
        "gate": s["inter"],
        "up": s["inter"],
        "down": s["inter"],
    }


def _matrices(layer: nn.Module) -> dict[str, tuple[Tensor, int]]:
    """ROWS name -> (weight, the axis summed over: 1 = per output row, 0 = per input column)."""
    attn, mlp = layer.self_attn, layer.mlp
    return {
        "q": (attn.q_proj.weight, 1),
        "k": (attn.k_proj.weight, 1),
        "v": (attn.v_proj.weight, 1),
        "o": (attn.o_proj.weight, 0),
        "gate": (mlp.gate_proj.weight, 1),
        "up": (mlp.up_proj.weight, 1),
        "down": (mlp.down_proj.weight, 0),
    }


def loss_gradients(model: nn.Module, batches: Iterable[Mapping[str, Tensor]]) -> int:
    """Accumulate into `.grad` of every prunable weight (and only those) the gradient of the mean
    token loss over all `batches` (Σ token losses / T, labels shifted as HF does, -100 ignored);
    returns T. Other parameters get no gradient; the model's `requires_grad` flags are restored."""
    weights = [w for layer in decoder_layers(model) for w, _ in _matrices(layer).values()]
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for w in weights:
        w.requires_grad_(True)
        w.grad = None
    device, tokens = model_device(model), 0
    try:
        for batch in batches:
            labels = batch["labels"].to(device)
            logits = model(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
            ).logits
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            targets = labels[:, 1:]
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                targets.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            loss.backward()
            tokens += int((targets != -100).sum())
    finally:
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)
    if tokens == 0:
        raise ValueError("the calibration batches hold no target tokens")
    for w in weights:
        w.grad.div_(tokens)
    return tokens


def taylor_rows(model: nn.Module, mode: str = "param_first") -> dict[str, np.ndarray]:
    """Per ROWS name a float64 (layers, width) array from the weights and their `.grad`
    (`loss_gradients`): `param_first` Σ|w·g| and `vectorize` Σ w·g over each row (q/k/v/gate/up) or
    column (o/down)."""
    if mode not in ("param_first", "vectorize"):
        raise ValueError(
            f"run-config key 'llmpruner-taylor' must be 'param_first' or 'vectorize', got {mode!r}"
        )
    out: dict[str, list[np.ndarray]] = {name: [] for name in ROWS}
    with torch.no_grad():
        for layer in decoder_layers(model):
            for name, (w, axis) in _matrices(layer).items():
                if w.grad is None:
                    raise RuntimeError(f"{name} weight has no gradient: call loss_gradients first")
                s = w.detach().double() * w.grad.double()
                out[name].append((s.abs() if mode == "param_first" else s).sum(axis).cpu().numpy())
    return {name: np.stack(v) for name, v in out.items()}


def client_importance(
    model: nn.Module, batches: Iterable[Mapping[str, Tensor]], mode: str
) -> tuple[dict[str, np.ndarray], int]:
    """One client's round-1 contribution: (`taylor_rows` of its mean-loss gradient, its token count
    T_k)."""
    tokens = loss_gradients(model, batches)
    try:
        return taylor_rows(model, mode), tokens
    finally:
        model.zero_grad(set_to_none=True)


def average_rows(
    states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """Σ_k T_k r_k / Σ_k T_k per ROWS array (float64): FedAvg of the clients' Taylor rows."""
    return weighted_average(
        [{k: np.asarray(v, np.float64) for k, v in s.items()} for s in states], weights
    )


def group_scores(rows: Mapping[str, np.ndarray], config: Any) -> dict[str, np.ndarray]:
    """{"heads": (layers, kv), "channels": (layers, inter)}: per structure the sum of |row| over its
    rows and columns (LLM-Pruner's group_reduction "sum"): kv group j = q rows and o columns of its
    G query heads + k and v rows of head j; channel c = gate row + up row + down column c."""
    s = dims(config)
    layers, hd, g, kv = rows["q"].shape[0], s["head_dim"], s["groups"], s["kv"]
    a = {k: np.abs(np.asarray(v, np.float64)) for k, v in rows.items()}
    heads = (a["q"] + a["o"]).reshape(layers, kv, g * hd).sum(-1) + (a["k"] + a["v"]).reshape(
        layers, kv, hd
    ).sum(-1)
    return {"heads": heads, "channels": a["gate"] + a["up"] + a["down"]}
