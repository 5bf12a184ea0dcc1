"""SFT-P's models: the routed backbone (+ LoRA under `sftp-adapters`) from the shared cache, and the
pair (Θ, Φ) loaded into it from a message or the global arrays."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.models import model_device, set_adapter_state
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.methods.sftp.generator import (
    GENERATOR_PREFIX,
    MaskGenerator,
    generator_for,
    set_generator_state,
)
from fedprune_app.structural.models import ROUTED_MODELS


def routed_model(cfg: RunConfig) -> tuple[nn.Module, Any]:
    """The process's cached (routed backbone [+ LoRA when `sftp-adapters`], tokenizer): dense
    outside a `masked` block; callers load the adapter state they use. The backbone is frozen."""
    return ROUTED_MODELS.routed(cfg, adapters=cfg.section(SFTPConfig).sftp_adapters)


def load_pair(cfg: RunConfig, state: Mapping[str, Tensor]) -> tuple[nn.Module, Any, MaskGenerator]:
    """`routed_model` in eval mode with Φ from `state` when `sftp-adapters`, and h_Θ with the Θ
    (`mask-generator.*`) of `state`, on the model's device: what a client loads from a message and
    the server from the global arrays."""
    model, tokenizer = routed_model(cfg)
    model.eval()  # dropout off outside local training, whatever an earlier use left
    generator = generator_for(cfg, model.config, device=model_device(model))
    set_generator_state(generator, state)
    if cfg.section(SFTPConfig).sftp_adapters:
        phi = {k: v for k, v in state.items() if not k.startswith(GENERATOR_PREFIX)}
        set_adapter_state(model, phi)
    return model, tokenizer, generator
