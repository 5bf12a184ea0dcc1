"""`sftp-deploy-state`: a client deploys the global (Θ, Φ) (default) or its own last-trained (Θ_k,
Φ_k)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from clients.sftp import LOCAL_STATE_RECORD
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.core.replies import to_record
from fedprune_app.methods.sftp.generator import GENERATOR_PREFIX
from fedprune_app.methods.sftp.models import load_pair
from fedprune_app.structural.routing import MASK_NAMES, load_compiled, masked
from strategies.sftp import SFTPStrategy
from tests.fake_grid import FakeGrid
from tests.methods.sftp.test_sftp import ROUNDS, content, make_client, sftp_config


def _scores(reply: RecordDict) -> tuple[dict[str, np.ndarray], float]:
    return (
        {k: v.numpy() for k, v in reply.array_records["masks"].items()},
        float(reply.metric_records["metrics"]["ppl"]),
    )


def test_local_deploys_the_clients_own_last_trained_state(
    tiny_model_dir: Path, flower_ids: None
) -> None:
    """Under 'local' the final evaluation ignores the message's (global) arrays and scores exactly
    what the 'global' client would score had the server sent back this client's own upload; under
    'global' (the default) the message's arrays decide, and here they give another model."""
    local_cfg = sftp_config(
        tiny_model_dir,
        local_steps=3,
        batch_size=1,
        seq_len=16,
        sftp_gate_tau=1.0,
        sftp_generator_lr=5e-2,
        sftp_lora_lr=5e-2,
        sftp_deploy_state="local",
    )
    initial = SFTPStrategy(local_cfg).initial_arrays()
    client = make_client(local_cfg)
    assert LOCAL_STATE_RECORD not in client.context.state.array_records
    assert (
        client.evaluate(content(initial, 0)).metric_records["metrics"]["kept-ratio-prunable"] == 1.0
    )
    upload = client.train(content(initial, ROUNDS)).array_records["arrays"]
    stored = client.context.state.array_records[LOCAL_STATE_RECORD]
    assert set(stored) == set(upload) and all(
        np.array_equal(stored[k].numpy(), upload[k].numpy()) for k in upload
    )

    local = _scores(client.evaluate(content(initial, ROUNDS)))
    global_client = make_client(
        local_cfg.replace(sftp_deploy_state="global"), state=client.context.state
    )
    own_upload = _scores(global_client.evaluate(content(upload, ROUNDS)))
    the_global = _scores(global_client.evaluate(content(initial, ROUNDS)))
    assert local[1] == own_upload[1] and all(
        np.array_equal(local[0][k], own_upload[0][k]) for k in MASK_NAMES
    )
    assert the_global[1] != pytest.approx(local[1], rel=1e-6)


def _replies(strategy: SFTPStrategy, states: dict[int, dict[str, np.ndarray]]) -> list[RecordDict]:
    return [
        RecordDict(
            {
                "arrays": to_record(s),
                "metrics": MetricRecord({"num-examples": 4, "partition-id": pid}),
            }
        )
        for pid, s in states.items()
    ]


def _logits(
    model: torch.nn.Module, masks: dict[str, np.ndarray] | None, ids: torch.Tensor
) -> torch.Tensor:
    layers = model.config.num_hidden_layers
    routing = (
        None
        if masks is None
        else [{n: torch.from_numpy(masks[n][i]).float() for n in MASK_NAMES} for i in range(layers)]
    )
    with masked(model, routing), torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("deploy_state", ["global", "local"])
def test_the_compiled_model_carries_the_deployed_phi(
    deploy_state: str, tiny_model_dir: Path, flower_ids: None, tmp_path: Path
) -> None:
    """The server compiles client k with the Φ of the state it deploys: under 'local' the Φ_k of k's
    last train reply (kept through a checkpoint round trip), under 'global' the aggregate."""
    cfg = sftp_config(tiny_model_dir, sftp_speed_prefill=0, sftp_deploy_state=deploy_state)
    strategy = SFTPStrategy(cfg)
    initial = {k: v.numpy() for k, v in strategy.initial_arrays().items()}
    rng = np.random.default_rng(3)
    states = {
        pid: {
            k: (v + rng.normal(scale=0.05, size=v.shape)).astype(np.float32)
            for k, v in initial.items()
        }
        for pid in (0, 1)
    }
    aggregate = strategy.aggregate(ROUNDS, _replies(strategy, states))
    resumed = SFTPStrategy(cfg)
    resumed.load_state_dict(strategy.state_dict())
    config = load_pair(cfg, aggregate.to_torch_state_dict())[0].config
    layers, d = config.num_hidden_layers, config.hidden_size
    masks = {pid: {n: rng.random((layers, d)) < 0.6 for n in MASK_NAMES} for pid in (0, 1)}
    sent = list(resumed.configure_evaluate(ROUNDS, aggregate, ConfigRecord(), FakeGrid([10, 11])))
    resumed.aggregate_evaluate(
        ROUNDS,
        [
            Message(
                RecordDict(
                    {
                        "metrics": MetricRecord(
                            {"acc": 0.5, "num-examples": 4, "partition-id": pid}
                        ),
                        "masks": to_record(masks[pid]),
                    }
                ),
                reply_to=m,
            )
            for pid, m in zip((0, 1), sent, strict=True)
        ],
    )
    resumed.report_class(resumed).save_final(aggregate, tmp_path)

    ids = torch.tensor([[1, 20, 300, 4000, 5]])
    compiled = load_compiled(tmp_path / "compiled" / "client-1")
    with torch.no_grad():
        deployed = compiled(input_ids=ids).logits
    with_global = _logits(load_pair(cfg, aggregate.to_torch_state_dict())[0], masks[1], ids)
    own_phi = {
        k: torch.from_numpy(v) for k, v in states[1].items() if not k.startswith(GENERATOR_PREFIX)
    }
    with_own = _logits(load_pair(cfg, aggregate.to_torch_state_dict() | own_phi)[0], masks[1], ids)
    expected, other = (
        (with_own, with_global) if deploy_state == "local" else (with_global, with_own)
    )
    torch.testing.assert_close(deployed, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(deployed, other, rtol=1e-4, atol=1e-4)
    assert bool(resumed.local_adapters) == (deploy_state == "local")


def test_an_unknown_deploy_state_names_the_key_and_values() -> None:
    with pytest.raises(ConfigError, match=r"sftp-deploy-state.*'global'.*'local'"):
        RunConfig.from_flower({"method": "sftp", "sftp-deploy-state": "mine"})
