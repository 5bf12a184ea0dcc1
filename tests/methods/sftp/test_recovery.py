"""`sftp-recovery-rounds`: the last rounds train Φ alone on the client's deployed mask held fixed
(not in Alg. 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from clients.sftp import EMBEDDING_RECORD
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.methods.sftp.generator import GENERATOR_PREFIX
from strategies.sftp import SFTPStrategy
from tests.methods.sftp.test_sftp import content, make_client, record_set_masks, sftp_config


def _arrays(reply: RecordDict, prefix: str | None) -> dict[str, np.ndarray]:
    arrays = reply.array_records["arrays"]
    return {k: arrays[k].numpy() for k in arrays if (prefix is None) or k.startswith(prefix)}


def test_a_recovery_round_trains_phi_on_the_deployed_mask(
    tiny_model_dir: Path, flower_ids: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 2 of 2 with one recovery round: every step runs the mask the client deploys (the same
    mask its evaluation uses), Θ comes back bitwise as it was sent, e_k and its optimiser state
    stay, and Φ moves. Round 1 (mask training) samples gates: its steps' masks differ."""
    cfg = sftp_config(
        tiny_model_dir,
        local_steps=3,
        batch_size=1,
        seq_len=16,
        sftp_recovery_rounds=1,
        sftp_gate_tau=1.0,
        sftp_generator_lr=5e-2,
    )
    strategy = SFTPStrategy(cfg)
    client = make_client(cfg)
    seen = record_set_masks(monkeypatch)
    first = client.train(content(strategy.initial_arrays(), 1))
    sampled = seen[:3]
    assert any(
        not all(torch.equal(a[k], b[k]) for a, b in zip(sampled[0], s, strict=True) for k in a)
        for s in sampled[1:]
    )  # mask training draws a new sample each step
    sent = first.array_records["arrays"]
    private = {
        k: v.numpy().copy() for k, v in client.context.state.array_records[EMBEDDING_RECORD].items()
    }
    seen.clear()
    second = client.train(content(sent, 2))
    model, tokenizer, generator = client.load(content(sent, 2))
    deployed = client.own_masks(model, tokenizer, generator, client.client_state().embedding)
    assert len(seen) == 4  # three steps, then the validation loss
    for step in seen:
        assert all(torch.equal(a[k], b[k]) for a, b in zip(step, deployed, strict=True) for k in a)
    theta_in = {k: sent[k].numpy() for k in sent if k.startswith(GENERATOR_PREFIX)}
    theta_out = _arrays(second, GENERATOR_PREFIX)
    assert theta_in.keys() == theta_out.keys() and all(
        np.array_equal(theta_in[k], theta_out[k]) for k in theta_in
    )
    after = {k: v.numpy() for k, v in client.context.state.array_records[EMBEDDING_RECORD].items()}
    assert all(np.array_equal(private[k], after[k]) for k in private)
    phi_in = {k: sent[k].numpy() for k in sent if not k.startswith(GENERATOR_PREFIX)}
    phi_out = {k: v for k, v in _arrays(second, None).items() if not k.startswith(GENERATOR_PREFIX)}
    assert phi_in and max(float(np.abs(phi_in[k] - phi_out[k]).max()) for k in phi_in) > 0
    metrics = second.metric_records["metrics"]
    assert metrics["train-loss"] == pytest.approx(
        metrics["clm-loss"]
    )  # the fixed mask's penalty is not trained


def test_without_recovery_rounds_the_last_round_trains_the_masks(
    tiny_model_dir: Path, flower_ids: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default (0, the paper): the last round still samples gates and moves Θ."""
    cfg = sftp_config(
        tiny_model_dir,
        local_steps=2,
        batch_size=1,
        seq_len=16,
        sftp_gate_tau=1.0,
        sftp_generator_lr=5e-2,
    )
    client = make_client(cfg)
    sent = SFTPStrategy(cfg).initial_arrays()
    reply = client.train(content(sent, cfg.num_server_rounds))
    theta_in = {k: sent[k].numpy() for k in sent if k.startswith(GENERATOR_PREFIX)}
    theta_out = _arrays(reply, GENERATOR_PREFIX)
    assert any(not np.array_equal(theta_in[k], theta_out[k]) for k in theta_in)
    metrics = reply.metric_records["metrics"]
    assert (
        metrics["train-loss"] > metrics["clm-loss"]
    )  # the budget penalty is part of the objective


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            {"sftp-recovery-rounds": 3, "num-server-rounds": 3},
            r"sftp-recovery-rounds.*below num-server-rounds \(3\)",
        ),
        (
            {"sftp-recovery-rounds": 1, "sftp-adapters": False},
            r"sftp-recovery-rounds.*sftp-adapters = true",
        ),
        ({"sftp-recovery-rounds": -1}, r"sftp-recovery-rounds"),
    ],
)
def test_bad_recovery_rounds_name_the_key(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_flower({"method": "sftp", **overrides})


def test_local_training_is_reproducible_whatever_ran_before(tiny_model_dir: Path) -> None:
    """LoRA dropout draws from torch's global generator; a client's round must not depend on what
    else the process (a Ray worker, the trajectory tool) drew before it: the same seed gives the
    same Θ, e_k and Φ."""
    from fedprune_app.methods.sftp.generator import generator_for
    from fedprune_app.methods.sftp.local import RoundPlan, local_round
    from fedprune_app.methods.sftp.models import routed_model

    results = []
    for noise in (1, 2):
        cfg = sftp_config(
            tiny_model_dir,
            local_steps=3,
            batch_size=1,
            seq_len=16,
            lora_dropout=0.5,
            sftp_gate_tau=1.0,
            sftp_generator_lr=1e-2,
        )
        client = make_client(cfg)
        model, tokenizer = routed_model(cfg)
        generator = generator_for(cfg, model.config, seed=0)
        lora = [p for p in model.parameters() if p.requires_grad]
        start = [p.detach().clone() for p in lora]
        state = client.client_state()
        torch.manual_seed(noise)
        torch.rand(noise * 7)  # another history of the global generator
        local_round(
            cfg, model, tokenizer, generator, state, client.data.train, RoundPlan(1, 11, 0.5)
        )
        results.append(
            [p.detach().clone() for p in (*lora, *generator.parameters(), state.embedding)]
        )
        with torch.no_grad():
            for p, p0 in zip(lora, start, strict=True):  # the routed model is cached: put Φ back
                p.copy_(p0)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
