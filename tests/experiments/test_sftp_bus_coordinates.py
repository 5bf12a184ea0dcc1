"""experiments/probes/sftp/bus_coordinates.py: the masks drop exactly the named coordinates, in
every layer and mask."""

from __future__ import annotations

from pathlib import Path

import torch

from experiments.probes.sftp.bus_coordinates import coordinate_magnitude, masks_without
from fedprune_app.methods.sftp.models import routed_model
from fedprune_app.structural.routing import MASK_NAMES
from tests.conftest import small_config


def test_masks_drop_exactly_the_coordinates_and_magnitude_is_per_coordinate(
    tiny_model_dir: Path,
) -> None:
    cfg = small_config(tiny_model_dir, method="sftp")
    model, tokenizer = routed_model(cfg)
    masks = masks_without(model, [1, 5])
    d = model.config.hidden_size
    assert len(masks) == model.config.num_hidden_layers
    for layer in masks:
        assert set(layer) == set(MASK_NAMES)
        for m in layer.values():
            assert m.shape == (d,) and m[1] == 0 and m[5] == 0 and m.sum() == d - 2
    from fedprune_app.llm.data import client_data

    data = client_data(cfg, 0, 1)
    magnitude = coordinate_magnitude(model, tokenizer, data.train[:2], cfg.seq_len)
    assert magnitude.shape == (d,) and bool(torch.all(magnitude >= 0))
