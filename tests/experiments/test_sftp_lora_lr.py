"""probes.sftp.lora_lr: Φ's movement against peft's own ΔW, and one learning rate measured on the
tiny model."""

from __future__ import annotations

from pathlib import Path

import torch

from experiments.probes.sftp.lora_lr import adapter_movement, measure
from fedprune_app.llm.models import initial_adapter_state, set_adapter_state
from fedprune_app.methods.sftp.models import routed_model
from tests.methods.sftp.test_sftp import sftp_config


def test_adapter_movement_against_peft_delta_weight(tiny_model_dir: Path) -> None:
    cfg = sftp_config(tiny_model_dir)
    model, _ = routed_model(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "lora_B") and module.lora_B:
                for layer in module.lora_B.values():
                    layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.1)
    rel, peak = [], 0.0
    for module in model.modules():
        if hasattr(module, "get_delta_weight") and module.lora_A:
            delta, weight = (
                module.get_delta_weight("default").float(),
                module.base_layer.weight.float(),
            )
            rel.append(float(delta.norm() / weight.norm()))
            peak = max(peak, float(delta.abs().max() / weight.pow(2).mean().sqrt()))
    got = adapter_movement(model)
    assert got["modules"] == len(rel) > 0
    assert (
        abs(got["delta-rel-fro"] - sum(rel) / len(rel)) < 1e-6
        and abs(got["delta-max-over-rms"] - peak) < 1e-6
    )
    set_adapter_state(model, initial_adapter_state(model))
    assert adapter_movement(model)["delta-rel-fro"] == 0.0  # fresh adapters: B = 0


def test_a_larger_learning_rate_moves_phi_further(tiny_model_dir: Path) -> None:
    rows = [
        measure(
            sftp_config(
                tiny_model_dir,
                sftp_lora_lr=lr,
                hold_open="all",
                local_steps=4,
                batch_size=1,
                seq_len=16,
            ),
            0,
            4,
            4,
        )
        for lr in (1e-4, 1e-2)
    ]
    assert 0 < rows[0]["delta-rel-fro"] < rows[1]["delta-rel-fro"]
    assert all(r["answer-nll"] > 0 for r in rows)
