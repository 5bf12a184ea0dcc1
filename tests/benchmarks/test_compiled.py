"""benchmarks/compiled.py's time breakdown: every profiled op lands in one category, and the
projections' FLOPs behind its GF/s equal a count from the models' weight shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks.compiled import BREAKDOWN, random_masks, time_breakdown
from fedprune_app.llm.models import load_base_model
from fedprune_app.structural.routing import CompiledAttention, CompiledMLP, compile_model


def projection_weights(model: nn.Module) -> int:
    """Weights of the pruned projections (q, k, v, o, gate, up, down), dense or compiled."""
    names = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "qkv_proj",
        "gate_up_proj",
    )
    return sum(
        m.weight.numel()
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in names
    )


def test_breakdown_adds_up_and_counts_the_projection_flops(tiny_model_dir: Path) -> None:
    dense = load_base_model(str(tiny_model_dir))
    config = dense.config
    compiled = compile_model(
        dense, random_masks(int(config.num_hidden_layers), int(config.hidden_size), 0.5, 0)
    )
    assert any(isinstance(m, CompiledAttention | CompiledMLP) for m in compiled.modules())
    tokens = 16
    prompt = torch.randint(
        0, int(config.vocab_size), (1, tokens), generator=torch.Generator().manual_seed(0)
    )
    out = time_breakdown({"dense": dense, "keep 0.5": compiled}, prompt, repeats=2)
    for name, model in (("dense", dense), ("keep 0.5", compiled)):
        row = out[name]
        assert row["total"] == pytest.approx(sum(row[c] for c in BREAKDOWN))
        assert row["projections"] > 0 and row["LM head"] > 0 and row["attention"] > 0
        flops = row["projections GF/s"] * 1e9 * row["projections"] / 1e3
        assert flops == pytest.approx(2 * tokens * projection_weights(model), rel=1e-9)
    assert out["keep 0.5"]["gather/scatter"] > 0  # the lanes' index_select / index_add_
    assert projection_weights(compiled) < 0.6 * projection_weights(dense)
