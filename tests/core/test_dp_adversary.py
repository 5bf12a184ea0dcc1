"""Differential privacy judged by what someone holding the run directory can do, for every method
that runs DP (FedIT, SFT-P, FlexLoRA), through each strategy's own `dp_aggregate`:

(a) neighbouring datasets: the release with and without one client's reply differs by at most C/m
    before noise, over random replies, ranks and dropouts (and the bound is reached, so the test can
    fail);
(b) fresh noise: two strategies with the same seed and config release different models; without
    noise, or with `dp-reproducible-noise` (ε then void), the same; the run's seed replayed through
    NumPy's global RNG does not recover the noise, and a release leaves that RNG untouched;
(c) resume: a round released after the last checkpoint stays charged (the ledger file), its
    re-release draws fresh noise and is charged again;
(d) noise statistics on every released tensor along the real round (`train_round`, σ > 0);
(e) Flower's `aggregate_train`, which knows no DP, refuses to run with DP on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedprune_app.core import registry
from fedprune_app.core.config import RunConfig
from fedprune_app.core.privacy import LEDGER_FILE, VOID
from fedprune_app.core.protocol import numpy_state, to_record
from fedprune_app.core.statefile import read_state, write_state
from fedprune_app.llm.lora import LORA_A, LORA_B, truncate_factors
from fedprune_app.methods.flexlora.svd import lora_delta
from tests.dp_reference import dp_accounting_epsilon
from tests.fake_grid import AnsweringGrid

METHODS = ("fedit", "sftp", "flexlora")
LAYERS = ("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.v_proj")
ALPHA, R_MAX = 8.0, 4
SETTINGS: dict[str, dict[str, Any]] = {
    "fedit": {},
    "sftp": {"sftp-aggregation": "equal", "sftp-deploy-state": "global"},
    "flexlora": {"flexlora-ranks": "2,4,1,3,4,2", "lora-alpha": ALPHA},
}


def _strategy(method: str, rows: list[dict[str, Any]] | None = None, **dp: Any) -> Any:
    cfg = RunConfig.from_flower(
        {
            "method": method,
            **SETTINGS[method],
            **{k.replace("_", "-"): v for k, v in dp.items()},
        }
    )
    recorder = (rows if rows is not None else []).append
    strategy = registry.strategy_class(method)(cfg, recorder=recorder)
    strategy.num_connected = 8
    if method == "flexlora":
        strategy.layers = [layer + ".lora" for layer in LAYERS]
    return strategy


def _lora(rng: np.random.Generator, rank: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    out = {}
    for layer in LAYERS:
        out[f"{layer}.lora{LORA_A}"] = rng.normal(size=(rank, 5)).astype(np.float32)
        out[f"{layer}.lora{LORA_B}"] = (scale * rng.normal(size=(6, rank))).astype(np.float32)
    return out


def _global(method: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    state = _lora(rng, R_MAX)
    if method == "sftp":  # Θ (the mask generator) beside Φ
        state |= {
            "mask-generator.net.0.weight": rng.normal(size=(7, 3)).astype(np.float32),
            "mask-generator.net.0.bias": rng.normal(size=7).astype(np.float32),
        }
    return state


def _reply(
    method: str, rng: np.random.Generator, glob: dict[str, np.ndarray], pid: int, scale: float
) -> RecordDict:
    """A client's train reply: what it was sent (FlexLoRA: the global at its rank) moved by
    `scale`-sized noise."""
    metrics: dict[str, Any] = {"num-examples": 10 * (pid + 1), "partition-id": pid}
    if method == "flexlora":
        rank = int(rng.integers(1, R_MAX + 1))
        sent = {}
        for layer in LAYERS:
            b, a = f"{layer}.lora{LORA_B}", f"{layer}.lora{LORA_A}"
            sent[b], sent[a] = truncate_factors(glob[b], glob[a], rank)
        metrics["rank"] = rank
    else:
        sent = glob
    state = {k: (v + scale * rng.normal(size=v.shape)).astype(v.dtype) for k, v in sent.items()}
    return RecordDict({"arrays": to_record(state), "metrics": MetricRecord(metrics)})


def _release(strategy: Any, replies: list[RecordDict], glob: dict, sampled: int) -> dict:
    """The round's release before any post-processing: the new global arrays (FlexLoRA: the dense
    ΔW of every layer, before its SVD), in float64."""
    if strategy.cfg.method != "flexlora":
        out = numpy_state(strategy.dp_aggregate(1, replies, to_record(glob), sampled))
        return {k: v.astype(np.float64) for k, v in out.items()}
    seen: list[dict[str, np.ndarray]] = []
    real = strategy.factors

    def capture(server_round: int, deltas: dict) -> Any:
        seen.append({k: np.array(v, np.float64) for k, v in deltas.items()})
        return real(server_round, deltas)

    strategy.factors = capture
    try:
        strategy.dp_aggregate(1, replies, to_record(glob), sampled)
    finally:
        strategy.factors = real
    return seen[0]


def _distance(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert set(a) == set(b)
    return float(np.sqrt(sum(np.sum((a[k] - b[k]) ** 2) for k in a)))


# --- (a) neighbouring datasets --------------------------------------------------------------------


@pytest.mark.parametrize("trial", range(4))
@pytest.mark.parametrize("method", METHODS)
def test_removing_one_clients_reply_moves_the_release_by_at_most_c_over_m(
    method: str, trial: int
) -> None:
    """σ = 0: the release itself. m sampled clients, some dropped; every reply removed in turn
    (whatever its rank); at least one update far above C, so the bound C/m is reached."""
    rng = np.random.default_rng(100 * trial + len(method))
    c, sampled = 0.5, int(rng.integers(3, 7))
    glob = _global(method, rng)
    scales = [float(rng.choice([0.01, 1.0, 10.0])) for _ in range(sampled)]
    scales[0] = 10.0
    replies = [_reply(method, rng, glob, pid, s) for pid, s in enumerate(scales)]
    present = [replies[0]] + [r for r in replies[1:] if rng.random() > 0.3]
    if len(present) < 2:
        present.append(replies[1])
    full = _release(_strategy(method, dp_clipping_norm=c), present, glob, sampled)
    worst = 0.0
    for i in range(len(present)):
        without = present[:i] + present[i + 1 :]
        moved = _distance(
            full, _release(_strategy(method, dp_clipping_norm=c), without, glob, sampled)
        )
        assert moved <= c / sampled * (1 + 1e-6), (i, moved, c / sampled)
        worst = max(worst, moved)
    assert worst > 0.99 * c / sampled  # a clipped update of norm C: the bound is tight


def test_nothing_outside_the_released_tensors_comes_from_the_clients() -> None:
    """A tensor the method does not release rides along as the global state had it, even when the
    method's own aggregate would change it."""
    rng = np.random.default_rng(3)
    glob = _global("fedit", rng)
    strategy = _strategy("fedit", dp_clipping_norm=0.5)
    held = sorted(glob)[0]
    strategy.dp_release_keys = lambda server_round, reference: [k for k in reference if k != held]
    replies = [_reply("fedit", rng, glob, pid, 5.0) for pid in range(3)]
    out = numpy_state(strategy.dp_aggregate(1, replies, to_record(glob), 3))
    np.testing.assert_array_equal(out[held], glob[held])
    assert not np.array_equal(out[sorted(glob)[1]], glob[sorted(glob)[1]])


# --- (b) fresh noise ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_the_same_seed_releases_different_noise_and_the_seed_does_not_recover_it(
    method: str,
) -> None:
    rng = np.random.default_rng(5)
    glob = _global(method, rng)
    replies = [_reply(method, rng, glob, pid, 1.0) for pid in range(4)]
    dp = {"dp_clipping_norm": 0.5, "seed": 0}
    clean = _release(_strategy(method, **dp), replies, glob, 4)
    assert _distance(clean, _release(_strategy(method, **dp), replies, glob, 4)) == 0.0

    before = np.random.get_state()
    first = _release(_strategy(method, **dp, dp_noise_multiplier=1.0), replies, glob, 4)
    after = np.random.get_state()
    # NumPy's global RNG (seeded by `seed`, kept in the checkpoint) is not the noise's source
    assert before[0] == after[0] and np.array_equal(before[1], after[1]) and before[2] == after[2]
    second = _release(_strategy(method, **dp, dp_noise_multiplier=1.0), replies, glob, 4)
    noise = _distance(first, clean)
    assert noise > 0 and _distance(first, second) > 0.5 * noise

    # the audit's attack: seed NumPy as the run did, replay Flower's noise, subtract it
    from flwr.supercore.differential_privacy import add_gaussian_noise_inplace, compute_stdv

    np.random.seed(0)
    replay = [np.zeros_like(first[k]) for k in first]
    add_gaussian_noise_inplace(replay, compute_stdv(1.0, 0.5, 4))
    guess = {k: first[k] - r for k, r in zip(first, replay, strict=True)}
    assert _distance(guess, clean) > 0.5 * noise  # no closer to the clean mean than the release


@pytest.mark.parametrize("method", METHODS)
def test_reproducible_noise_repeats_and_reports_epsilon_as_void(method: str) -> None:
    rng = np.random.default_rng(6)
    glob = _global(method, rng)
    replies = [_reply(method, rng, glob, pid, 1.0) for pid in range(3)]
    dp = {"dp_clipping_norm": 0.5, "dp_noise_multiplier": 1.0, "dp_reproducible_noise": True}
    rows: list[dict[str, Any]] = []
    strategy = _strategy(method, rows, **dp)
    strategy.dp_allows(1, 3)
    first = _release(strategy, replies, glob, 3)
    assert _distance(first, _release(_strategy(method, **dp), replies, glob, 3)) == 0.0
    (row,) = [r for r in rows if r.get("status") == "released"]
    assert row["dp-epsilon"] is None and row["dp-void"] == VOID
    assert strategy.privacy_summary()["epsilon"] is None
    assert strategy.privacy_summary()["void"] == VOID
    from fedprune_app.report.tables import render_privacy

    assert "**ε is void**" in render_privacy(rows) and "| void |" in render_privacy(rows)


# --- (c) resume -----------------------------------------------------------------------------------


def test_a_resume_keeps_every_release_charged_and_draws_fresh_noise(tmp_path: Path) -> None:
    """Rounds 1-2, checkpoint, round 3 released (its model evaluated), crash; the resumed run
    re-runs round 3. Its ledger counts 4 releases (the uninterrupted run's 3 and the repeat), ε is
    larger than the uninterrupted run's, and no noise vector repeats."""
    rng = np.random.default_rng(7)
    glob = _global("fedit", rng)
    replies = [_reply("fedit", rng, glob, pid, 0.01) for pid in range(4)]  # norms far below C
    dp = {"dp_clipping_norm": 1.0, "dp_noise_multiplier": 0.9}
    clean = _release(_strategy("fedit", dp_clipping_norm=1.0), replies, glob, 4)

    def noise_of(strategy: Any, server_round: int) -> dict[str, np.ndarray]:
        assert strategy.dp_allows(server_round, 3)
        out = numpy_state(strategy.dp_aggregate(server_round, replies, to_record(glob), 4))
        return {k: v.astype(np.float64) - clean[k] for k, v in out.items()}

    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    cut = _strategy("fedit", **dp)
    cut.keep_ledger(first_dir)
    noises = [noise_of(cut, 1), noise_of(cut, 2)]
    write_state(tmp_path / "checkpoint.safetensors", cut.state_dict())  # after round 2
    noises.append(noise_of(cut, 3))  # released, then the server dies before its checkpoint
    assert json.loads((first_dir / LEDGER_FILE).read_text())["releases"] == 3

    rows: list[dict[str, Any]] = []
    resumed = _strategy("fedit", rows, **dp)
    resumed.load_state_dict(read_state(tmp_path / "checkpoint.safetensors"))
    assert resumed.privacy.releases == 2  # the checkpoint alone would forget round 3
    resumed.continue_ledger(first_dir, 2)
    resumed.keep_ledger(second_dir)
    noises.append(noise_of(resumed, 3))

    assert resumed.privacy.releases == 4 and resumed.privacy.released_rounds == [1, 2, 3, 3]
    assert json.loads((second_dir / LEDGER_FILE).read_text())["releases"] == 4
    uninterrupted = dp_accounting_epsilon(0.9, 3, 1e-5)
    assert resumed.privacy.epsilon() == pytest.approx(dp_accounting_epsilon(0.9, 4, 1e-5))
    assert resumed.privacy.epsilon() > uninterrupted
    (carried,) = [r for r in rows if r.get("status") == "carried"]
    assert carried["dp-releases"] == 3 and carried["dp-beyond-checkpoint"] == 1
    flat = [np.concatenate([n[k].ravel() for k in sorted(n)]) for n in noises]
    scale = 0.9 * 1.0 / 4
    for i in range(len(flat)):
        assert abs(flat[i].std() / scale - 1) < 0.35  # noise of the calibrated size
        for j in range(i):
            assert np.linalg.norm(flat[i] - flat[j]) > scale * np.sqrt(flat[i].size)


def test_a_ledger_that_cannot_be_read_stops_the_resume(tmp_path: Path) -> None:
    from fedprune_app.core.config import ConfigError

    (tmp_path / LEDGER_FILE).write_text("{not json")
    strategy = _strategy("fedit", dp_clipping_norm=1.0, dp_noise_multiplier=0.9)
    with pytest.raises(ConfigError, match="resume-from.*privacy ledger"):
        strategy.continue_ledger(tmp_path, 2)


# --- (d) the noise on every released tensor, along the real round ---------------------------------


class EchoGrid(AnsweringGrid):
    """Nodes that answer identity queries and send back exactly what they were sent (a zero update,
    FlexLoRA: at the rank asked): what the server releases is then the noise alone."""

    def __init__(self, nodes: int) -> None:
        super().__init__(list(range(101, 101 + nodes)))

    def answer(self, msg: Message) -> Message:
        metrics: dict[str, Any] = {
            "partition-id": msg.metadata.dst_node_id - 101,
            "num-examples": 10,
        }
        content = RecordDict()
        if msg.metadata.message_type == MessageType.TRAIN:
            config = msg.content.config_records["config"]
            if "rank" in config:
                metrics["rank"] = int(config["rank"])
            content["arrays"] = msg.content.array_records["arrays"]
        content["metrics"] = MetricRecord(metrics)
        return Message(content, reply_to=msg)


@pytest.mark.parametrize("method", METHODS)
def test_every_released_tensor_carries_noise_of_std_sigma_c_over_m(
    method: str, flower_ids: None
) -> None:
    sigma, c, nodes = 1.5, 0.2, 6
    rng = np.random.default_rng(8)
    glob = _global(method, rng)
    glob = {k: np.repeat(v, 8, axis=-1) if k.endswith(LORA_A) else v for k, v in glob.items()}
    strategy = _strategy(method, dp_clipping_norm=c, dp_noise_multiplier=sigma)
    grid = EchoGrid(nodes)
    strategy.identify(grid)
    strategy.num_connected = nodes
    arrays = to_record(glob)
    if method == "flexlora":  # a round to learn each node's rank, then the measured round
        strategy.train_round(1, grid, arrays, ConfigRecord())
        strategy.partition_rank = {pid: R_MAX for pid in strategy.partition_rank}
    seen: list[dict[str, np.ndarray]] = []
    if method == "flexlora":
        real = strategy.factors
        strategy.factors = lambda r, deltas: seen.append(deltas) or real(r, deltas)
    new, _ = strategy.train_round(2, grid, arrays, ConfigRecord())
    if method == "flexlora":
        reference = {
            layer: lora_delta(glob[layer + LORA_B], glob[layer + LORA_A], ALPHA, R_MAX)
            for layer in strategy.layers
        }
        noise = {k: seen[0][k] - reference[k] for k in reference}
    else:
        out = numpy_state(new)
        noise = {k: out[k].astype(np.float64) - glob[k].astype(np.float64) for k in glob}
    m = len(strategy.sent)
    assert m == nodes  # fraction-train = 1
    std = sigma * c / m
    assert set(noise) == (set(reference) if method == "flexlora" else set(glob))
    for k, n in noise.items():  # each tensor: std within 6 standard errors, mean near 0
        se = 1 / np.sqrt(2 * n.size)
        assert abs(n.std() / std - 1) < 6 * se, (k, n.std(), std)
        assert abs(n.mean()) < 6 * std / np.sqrt(n.size), k


# --- (e) no path around the release ---------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_flowers_aggregate_train_refuses_to_bypass_dp(method: str) -> None:
    strategy = _strategy(method, dp_clipping_norm=0.5, dp_noise_multiplier=1.0)
    with pytest.raises(RuntimeError, match="bypasses differential privacy"):
        strategy.aggregate_train(1, [])
    assert _strategy(method).aggregate_train(1, []) == (None, None)  # DP off: Flower's hook
