"""`hold-open`: gates fixed at 1 in every mask (the massive-activation coordinates, or all of
them for the dense-with-the-same-recipe ceiling), in training, in the deployed masks and in the
server's view."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from fedprune_app.core.config import ConfigError
from fedprune_app.methods.sftp.generator import (
    deterministic_mask,
    generator_for,
    layer_masks,
    reinmax_binary,
)
from fedprune_app.methods.sftp.local import RoundPlan, local_round
from fedprune_app.methods.sftp.models import routed_model
from fedprune_app.structural.held import (
    PROBE_TEXT,
    force_open,
    held_coordinates,
    massive_coordinates,
)
from fedprune_app.structural.routing import (
    MASK_NAMES,
    install_routing,
    kept_parameters,
    prunable_parameters,
)
from strategies.sftp import SFTPStrategy
from tests.methods.sftp.test_sftp import content, make_client, sftp_config

PLANTED = 5


@pytest.fixture(scope="module")
def planted_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny LLaMA with bus coordinate PLANTED made massive (its embedding column × 300, so every
    token's residual stream carries a large value there through every layer)."""
    out = tmp_path_factory.mktemp("planted")
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, PLANTED] *= 300.0
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def test_force_open_fixes_the_held_gates_and_blocks_only_their_gradient() -> None:
    s = torch.randn(2, len(MASK_NAMES), 8, requires_grad=True)
    held = torch.zeros(8)
    held[[1, 6]] = 1.0
    g = force_open(reinmax_binary(s, 1.0, -1.0, torch.Generator().manual_seed(0)), held)
    assert torch.all(g[..., [1, 6]] == 1.0)
    free = reinmax_binary(s.detach(), 1.0, -1.0, torch.Generator().manual_seed(0))
    assert torch.equal(g[..., [0, 2, 3, 4, 5, 7]], free[..., [0, 2, 3, 4, 5, 7]])
    g.sum().backward()
    assert torch.all(s.grad[..., [1, 6]] == 0) and torch.all(s.grad[..., [0, 2, 3, 4, 5, 7]] != 0)
    assert force_open(free, None) is free


def test_massive_coordinates_against_the_hidden_states(planted_dir: Path) -> None:
    """The planted coordinate is found; and the rule (mean |h| over layers and probe
    tokens > f × median) equals a direct computation on the unrouted model for several f."""
    model = LlamaForCausalLM.from_pretrained(planted_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(planted_dir)
    with torch.no_grad():
        states = model(
            **tokenizer(PROBE_TEXT, return_tensors="pt"), output_hidden_states=True
        ).hidden_states[1:]
    magnitude = torch.stack([h[0].abs().mean(0) for h in states]).mean(0)
    install_routing(model)
    assert massive_coordinates(model, tokenizer, 10.0) == [PLANTED]
    for factor in (1.0, 1.5, 3.0):
        expected = [
            i for i in range(magnitude.numel()) if magnitude[i] > factor * magnitude.median()
        ]
        assert massive_coordinates(model, tokenizer, factor) == expected


def test_held_coordinates_per_setting(planted_dir: Path) -> None:
    for setting, expected in (
        ("none", None),
        ("all", torch.ones(64)),
        ("massive", torch.eye(64)[PLANTED]),
    ):
        cfg = sftp_config(planted_dir, hold_open=setting)
        model, tokenizer = routed_model(cfg)
        held = held_coordinates(cfg, model, tokenizer)
        assert (held is None) if expected is None else torch.equal(held, expected), setting


def test_bad_setting_names_the_key_and_the_choices(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"hold-open.*massive.*none.*all"):
        sftp_config(tiny_model_dir, hold_open="some")


def test_a_closed_generator_deploys_exactly_the_held_gates(
    planted_dir: Path, flower_ids: None
) -> None:
    """With every logit far below −c the client's deployed mask (rule 'threshold') is the held set
    itself (massive), or all ones (ceiling); the server's view holds them open the same way."""
    for setting, kept in (("massive", 1.0 / 64), ("all", 1.0)):
        cfg = sftp_config(planted_dir, hold_open=setting, sftp_deploy_mask="threshold")
        strategy = SFTPStrategy(cfg)
        client = make_client(cfg)
        model, tokenizer, generator = client.load(content(strategy.initial_arrays(), 1))
        with torch.no_grad():
            generator.fc2.bias.fill_(-50.0)
        masks = client.own_masks(model, tokenizer, generator, client.client_state().embedding)
        for layer in masks:
            for name in MASK_NAMES:
                expected = torch.ones(64) if setting == "all" else torch.eye(64)[PLANTED]
                assert torch.equal(layer[name], expected), (setting, name)
        assert kept_parameters(model.config, masks).item() / prunable_parameters(
            model.config
        ) == pytest.approx(kept)


def test_training_never_drops_a_held_coordinate(planted_dir: Path) -> None:
    """A budget of 0.3 pulls the gates down, the planted coordinate stays in every deployed mask;
    with every gate held (the ceiling) the deployed model stays dense whatever the budget."""
    for setting in ("massive", "all"):
        cfg = sftp_config(
            planted_dir,
            sftp_gate_tau=1.0,
            sftp_generator_lr=3e-2,
            local_steps=20,
            batch_size=1,
            seq_len=16,
            hold_open=setting,
        )
        client = make_client(cfg)
        model, tokenizer = routed_model(cfg)
        generator = generator_for(cfg, model.config, seed=0)
        state = client.client_state()
        local_round(
            cfg, model, tokenizer, generator, state, client.data.train, RoundPlan(1, 0, 0.3)
        )
        embedding = state.embedding
        with torch.no_grad():
            gates = force_open(
                deterministic_mask(generator(embedding), 3.0),
                held_coordinates(cfg, model, tokenizer),
            )
            free = deterministic_mask(generator(embedding), 3.0)
        assert torch.all(gates[..., PLANTED] == 1.0)
        ratio = kept_parameters(model.config, layer_masks(gates)).item() / prunable_parameters(
            model.config
        )
        if setting == "all":
            assert ratio == 1.0
        else:
            assert ratio < 0.9 and free.mean() < 0.9, (
                ratio
            )  # the other gates did move toward the budget
