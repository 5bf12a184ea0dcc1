"""What a checkpoint of an SFT-P run holds, from the config alone (no torch): Θ, the mask
generator's tensors (`generator.MaskGenerator`), and with `sftp-adapters` the LoRA Φ."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedprune_app.core.config import RunConfig
from fedprune_app.llm.shapes import Spec, lora_spec
from fedprune_app.methods.sftp.config import SFTPConfig

GENERATOR_PREFIX = "mask-generator."  # Θ's tensors in a message; Φ (LoRA) keeps peft's names
MASKS_PER_LAYER = 4  # the generator's heads: MASK_NAMES (attn-in, attn-out, ffn-in, ffn-out)


def checkpoint_spec(cfg: RunConfig, config: Mapping[str, Any]) -> Spec | None:
    """Θ's tensors (layer embedding, the MLP's two layers; float32), then with adapters Φ's
    (`llm.shapes.lora_spec`); None where the model's sizes are not known from its config.json."""
    sftp = cfg.section(SFTPConfig)
    layers, d = config.get("num_hidden_layers"), config.get("hidden_size")
    if not isinstance(layers, int) or not isinstance(d, int):
        return None
    e, h, heads = sftp.sftp_embed_dim, sftp.sftp_generator_hidden, MASKS_PER_LAYER * d
    theta = {
        "layer_embedding.weight": (layers, e),
        "fc1.weight": (h, 2 * e),
        "fc1.bias": (h,),
        "fc2.weight": (heads, h),
        "fc2.bias": (heads,),
    }
    spec: Spec = {GENERATOR_PREFIX + k: (shape, "float32") for k, shape in theta.items()}
    if not sftp.sftp_adapters:
        return spec
    adapters = lora_spec(cfg, config)
    return None if adapters is None else spec | adapters
