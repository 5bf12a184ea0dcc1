"""FedSpaLLM's masks: the exact ⌈s·d⌉ zero count, sparsity reports, `masks.npz` (wire format:
core.encoding)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedprune_app.core.config import RunConfig
from fedprune_app.core.encoding import (
    MASK_SUFFIX as MASK_SUFFIX,
)  # `<name>:mask`: bit-packed, True = kept
from fedprune_app.llm.layers import model_with_weights


def target_count(sparsity: float, size: int) -> int:
    """⌈s·d⌉ zeros of a d-weight matrix at sparsity s (FedSpaLLM Eq. 7), immune to float noise
    (0.55 · 100 is 55.000000000000007 in binary)."""
    return math.ceil(round(sparsity * size, 9))


def sparsity_report(state: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per matrix (zeros, size, their ratio) and overall: the exact zeros of each pruned matrix."""
    per = {
        k: {"zeros": int((v == 0).sum()), "size": int(v.size), "sparsity": float((v == 0).mean())}
        for k, v in state.items()
    }
    total = sum(m["size"] for m in per.values())
    zeros = sum(m["zeros"] for m in per.values())
    return {
        "overall": zeros / total if total else 0.0,
        "zeros": zeros,
        "size": total,
        "matrices": per,
    }


def save_pruned(cfg: RunConfig, state: dict[str, np.ndarray], out_dir: Path) -> dict[str, str]:
    """`model/` (save_pretrained, zeros in place), `masks.npz` (kept = True) and `sparsity.json`."""
    model, tokenizer = model_with_weights(cfg, state)
    model.save_pretrained(out_dir / "model")
    tokenizer.save_pretrained(out_dir / "model")
    np.savez_compressed(out_dir / "masks.npz", **{k: v != 0 for k, v in state.items()})
    (out_dir / "sparsity.json").write_text(json.dumps(sparsity_report(state), indent=2) + "\n")
    return {"model": "model", "masks": "masks.npz", "sparsity": "sparsity.json"}
