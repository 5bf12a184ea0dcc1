"""Client-level DP (DP-FedAvg, `core/privacy.py`) against references: clipping, the noise's standard
deviation, ε against dp_accounting's own RDP computation, the budget, resume, the refusals, and σ =
0 = clipping alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, MetricRecord, RecordDict

from fedprune_app.core import registry
from fedprune_app.core.client import FederatedClient
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.core.lora import LoRAStrategy
from fedprune_app.core.privacy import (
    DPConfig,
    PrivacyLedger,
    check_private,
    clip_update,
    epsilon_after,
    noise_multiplier_for,
    private_mean,
)
from fedprune_app.core.protocol import numpy_state, to_record
from fedprune_app.core.statefile import read_state, write_state
from tests.dp_reference import dp_accounting_epsilon

KEYS = ("a.lora_A.weight", "a.lora_B.weight")


def _cfg(**dp: Any) -> RunConfig:
    return RunConfig.from_flower(
        {"method": "fedit", **{k.replace("_", "-"): v for k, v in dp.items()}}
    )


def _state(rng: np.random.Generator, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "a.lora_A.weight": (scale * rng.normal(size=(4, 8))).astype(np.float32),
        "a.lora_B.weight": (scale * rng.normal(size=(8, 4))).astype(np.float32),
    }


def _norm(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return float(
        np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k].astype(np.float64)) ** 2) for k in KEYS))
    )


def _reply(state: dict[str, np.ndarray], pid: int) -> RecordDict:
    return RecordDict(
        {
            "arrays": to_record(state),
            "metrics": MetricRecord({"num-examples": 10 * (pid + 1), "partition-id": pid}),
        }
    )


def _manual_clip(
    local: dict[str, np.ndarray], ref: dict[str, np.ndarray], c: float
) -> dict[str, np.ndarray]:
    """The reference clipping, written out: Δ·min(1, C/‖Δ‖₂)."""
    norm = _norm(local, ref)
    scale = min(1.0, c / norm) if norm > 0 else 1.0
    return {
        k: ref[k].astype(np.float64)
        + scale * (local[k].astype(np.float64) - ref[k].astype(np.float64))
        for k in KEYS
    }


# --- clipping -------------------------------------------------------------------------------------


def test_clipping_leaves_an_update_under_c_untouched_and_scales_a_larger_one_to_exactly_c() -> None:
    rng = np.random.default_rng(0)
    ref = _state(rng)
    small = {k: v + np.float32(1e-3) for k, v in ref.items()}
    assert _norm(small, ref) < 1.0
    out, norm = clip_update(small, ref, KEYS, 1.0)
    assert norm == pytest.approx(_norm(small, ref))
    for k in KEYS:
        np.testing.assert_array_equal(out[k], small[k])  # bit for bit
    big = {k: v + _state(rng, 3.0)[k] for k, v in ref.items()}
    assert _norm(big, ref) > 5.0
    out, norm = clip_update(big, ref, KEYS, 1.0)
    assert norm == pytest.approx(_norm(big, ref))
    assert _norm(out, ref) == pytest.approx(1.0, rel=1e-5)
    want = _manual_clip(big, ref, 1.0)
    for k in KEYS:  # same direction: Δ scaled, not truncated per tensor
        np.testing.assert_allclose(out[k], want[k], rtol=1e-5, atol=1e-6)
        assert out[k].dtype == np.float32


class _Client(FederatedClient):
    dp_clips_on_client = True


def _client(cfg: RunConfig) -> _Client:
    context = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 2},
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    return _Client(cfg, context)


def test_a_client_clips_its_reply_before_it_leaves_and_only_with_dp_on() -> None:
    rng = np.random.default_rng(1)
    sent, local = _state(rng), _state(rng, 5.0)
    content = RecordDict({"arrays": to_record(sent)})
    reply = _client(_cfg(dp_clipping_norm=0.5)).private_reply(content, _reply(local, 0))
    assert _norm(numpy_state(reply.array_records["arrays"]), sent) == pytest.approx(0.5, rel=1e-5)
    assert reply.metric_records["metrics"]["dp-clipped"] == 1
    # DP off: the reply as trained
    untouched = _client(_cfg()).private_reply(content, _reply(local, 0))
    assert _norm(numpy_state(untouched.array_records["arrays"]), local) == 0.0
    assert "dp-clipped" not in untouched.metric_records["metrics"]


# --- the server's release -------------------------------------------------------------------------


def test_the_noise_std_is_sigma_c_over_the_sampled_m_not_the_replies() -> None:
    """Δ = 0 for every reply: what is left is the noise. 3 replies of m = 8 sampled: std σ·C/8
    (±1%)."""
    ref = {"w": np.zeros(400_000, np.float32)}
    out, _ = private_mean(
        ref,
        [ref, ref, ref],
        ["w"],
        clipping_norm=0.7,
        noise_multiplier=1.3,
        sampled=8,
        rng=np.random.default_rng(1234),
    )
    noise = out["w"].astype(np.float64)
    assert noise.std() == pytest.approx(1.3 * 0.7 / 8, rel=0.01)  # SE of the std: 1/sqrt(2n) ≈ 0.1%
    assert abs(noise.mean()) < 5 * (1.3 * 0.7 / 8) / np.sqrt(noise.size)


def test_sigma_zero_is_the_uniform_mean_of_clipped_updates_over_m() -> None:
    """DP with σ = 0 = clipping alone: θ + Σ_k clip(Δ_k) / m, uniform weights (num-examples
    ignored), fixed m."""
    rng = np.random.default_rng(2)
    ref = _state(rng)
    states = [{k: ref[k] + _state(rng, s)[k] for k in KEYS} for s in (0.01, 1.0, 4.0)]
    out, norms = private_mean(ref, states, KEYS, clipping_norm=1.0, noise_multiplier=0.0, sampled=4)
    clipped = [_manual_clip(s, ref, 1.0) for s in states]
    for k in KEYS:
        want = ref[k] + sum(c[k] - ref[k] for c in clipped) / 4
        np.testing.assert_allclose(out[k], want, rtol=1e-5, atol=1e-6)
    assert norms == pytest.approx([_norm(s, ref) for s in states])


def _strategy(rows: list[dict[str, Any]], **dp: Any) -> LoRAStrategy:
    strategy = LoRAStrategy(_cfg(**dp), recorder=rows.append)
    strategy.num_connected = 4
    return strategy


def test_the_strategy_clips_unclipped_replies_and_sigma_zero_equals_clipping_alone() -> None:
    rng = np.random.default_rng(3)
    ref = _state(rng)
    states = [{k: ref[k] + _state(rng, s)[k] for k in KEYS} for s in (0.01, 2.0, 5.0)]
    rows: list[dict[str, Any]] = []
    strategy = _strategy(rows, dp_clipping_norm=1.0)
    assert strategy.dp_allows(1, 3)
    out = numpy_state(
        strategy.dp_aggregate(1, [_reply(s, i) for i, s in enumerate(states)], to_record(ref), 4)
    )
    clipped = [_manual_clip(s, ref, 1.0) for s in states]
    for k in KEYS:
        np.testing.assert_allclose(
            out[k], ref[k] + sum(c[k] - ref[k] for c in clipped) / 4, rtol=1e-5, atol=1e-6
        )
    (row,) = [r for r in rows if r["phase"] == "privacy"]
    # σ = 0: no guarantee, ε infinite
    assert row["status"] == "released" and row["dp-epsilon"] is None
    assert row["dp-clipped"] == 2 and row["dp-sampled"] == 4 and row["dp-replies"] == 3


def _run_rounds(strategy: LoRAStrategy, first: int, last: int, rng: np.random.Generator) -> None:
    ref = _state(rng)
    for r in range(first, last + 1):
        assert strategy.dp_allows(r, last)
        strategy.dp_aggregate(
            r,
            [_reply({k: ref[k] + _state(rng)[k] for k in KEYS}, i) for i in range(4)],
            to_record(ref),
            4,
        )


def test_reported_epsilon_equals_dp_accountings_rdp_computation_every_round() -> None:
    rows: list[dict[str, Any]] = []
    strategy = _strategy(rows, dp_clipping_norm=1.0, dp_noise_multiplier=1.1, dp_delta=1e-4)
    _run_rounds(strategy, 1, 4, np.random.default_rng(4))
    released = [r for r in rows if r.get("status") == "released"]
    assert [r["round"] for r in released] == [1, 2, 3, 4]
    for r in released:
        assert r["dp-epsilon"] == pytest.approx(
            dp_accounting_epsilon(1.1, r["round"], 1e-4), rel=1e-9
        )
        assert r["dp-noise-std"] == pytest.approx(1.1 * 1.0 / 4)
    (plan,) = [r for r in rows if r.get("status") == "planned"]
    assert plan["round"] == 0 and plan["dp-planned-epsilon"] == pytest.approx(
        released[-1]["dp-epsilon"]
    )


def test_a_round_that_would_exceed_dp_max_epsilon_is_not_started() -> None:
    budget = (dp_accounting_epsilon(1.1, 2, 1e-5) + dp_accounting_epsilon(1.1, 3, 1e-5)) / 2
    rows: list[dict[str, Any]] = []
    strategy = _strategy(rows, dp_clipping_norm=1.0, dp_noise_multiplier=1.1, dp_max_epsilon=budget)
    _run_rounds(strategy, 1, 2, np.random.default_rng(5))
    assert not strategy.dp_allows(3, 5)
    (stop,) = [r for r in rows if r.get("status") == "budget-exhausted"]
    assert stop["round"] == 3 and stop["dp-epsilon-next"] > budget >= stop["dp-epsilon"]
    assert [r["dp-allowed-rounds"] for r in rows if r.get("status") == "planned"] == [2]
    assert strategy.evaluates(2)  # the last allowed round's models are scored by the clients
    assert strategy.privacy_summary()["stopped-after-round"] == 2


def test_resume_continues_the_same_epsilon(tmp_path: Path) -> None:
    """Three rounds in one go, or two, a checkpoint (statefile, no pickle) and a fresh strategy for
    the third."""

    def run(strategy: LoRAStrategy, first: int, last: int) -> None:
        _run_rounds(strategy, first, last, np.random.default_rng(100 + first))

    whole_rows: list[dict[str, Any]] = []
    whole = _strategy(whole_rows, dp_clipping_norm=1.0, dp_noise_multiplier=0.9)
    run(whole, 1, 2)
    run(whole, 3, 3)
    cut = _strategy([], dp_clipping_norm=1.0, dp_noise_multiplier=0.9)
    run(cut, 1, 2)
    write_state(tmp_path / "state.safetensors", cut.state_dict())
    resumed_rows: list[dict[str, Any]] = []
    resumed = _strategy(resumed_rows, dp_clipping_norm=1.0, dp_noise_multiplier=0.9)
    resumed.load_state_dict(read_state(tmp_path / "state.safetensors"))
    run(resumed, 3, 3)
    eps = [r["dp-epsilon"] for r in resumed_rows if r.get("status") == "released"]
    assert eps == [[r["dp-epsilon"] for r in whole_rows if r.get("status") == "released"][-1]]
    assert eps[0] == pytest.approx(dp_accounting_epsilon(0.9, 3, 1e-5), rel=1e-9)
    # the plan was the first run's
    assert not [r for r in resumed_rows if r.get("status") == "planned"]
    assert resumed.privacy.releases == 3


def test_the_noise_multiplier_for_a_target_epsilon_reaches_it_over_the_planned_rounds() -> None:
    sigma = noise_multiplier_for(8.0, 3, 1e-5)
    assert (
        dp_accounting_epsilon(sigma, 3, 1e-5) <= 8.0 < dp_accounting_epsilon(sigma / 1.002, 3, 1e-5)
    )
    assert epsilon_after(sigma, 3, 1e-5) == pytest.approx(
        dp_accounting_epsilon(sigma, 3, 1e-5), rel=1e-9
    )
    assert sigma == pytest.approx(1.104, abs=0.002)  # conf/fedit-dp.toml's


def test_the_ledger_without_noise_reports_infinity_and_no_release_zero() -> None:
    ledger = PrivacyLedger(_cfg(dp_clipping_norm=1.0).section(DPConfig))
    ledger.start(4)
    assert ledger.epsilon() == 0.0 and ledger.allows(4)
    ledger.compose(4)
    assert ledger.epsilon() is None


# --- configuration and refusals -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"dp-noise-multiplier": 1.0}, "'dp-noise-multiplier'"),
        ({"dp-clipping-norm": 1.0, "dp-delta": 0.0}, "'dp-delta'"),
        ({"dp-clipping-norm": 1.0, "dp-max-epsilon": 4.0}, "'dp-max-epsilon'"),
        ({"dp-clipping-norm": -1.0}, "'dp-clipping-norm'"),
        ({"dp-clipping-norm": float("nan")}, "'dp-clipping-norm'"),
    ],
)
def test_bad_dp_keys_are_refused_naming_the_key(values: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RunConfig.from_flower(values)


REFUSING = {
    "fedspallm": "SparseGPT",
    "fedtpa": "contribution-weighted",
    "fedflap": "one-shot",
    "llmpruner": "one-shot",
    "slicegpt": "one-shot",
}


@pytest.mark.parametrize("method", registry.names())
def test_each_method_runs_dp_or_refuses_in_one_line_naming_itself(method: str) -> None:
    cfg = RunConfig.from_flower(
        {
            "method": method,
            "dp-clipping-norm": 1.0,
            "dp-noise-multiplier": 1.0,
            "flexlora-ranks": "8",
        }
    )
    if method not in REFUSING:
        check_private(cfg)
        return
    with pytest.raises(ConfigError) as err:
        check_private(cfg)
    text = str(err.value)
    assert "\n" not in text and f"method '{method}' cannot run with differential privacy" in text
    assert REFUSING[method] in text


def test_sftp_refuses_a_deployment_or_weighting_that_dp_does_not_cover() -> None:
    base = {"method": "sftp", "dp-clipping-norm": 1.0}
    check_private(RunConfig.from_flower(base))
    with pytest.raises(ConfigError, match="sftp-deploy-state = 'local'"):
        check_private(RunConfig.from_flower({**base, "sftp-deploy-state": "local"}))
    with pytest.raises(ConfigError, match="sftp-aggregation = 'num-examples'"):
        check_private(RunConfig.from_flower({**base, "sftp-aggregation": "num-examples"}))


def test_the_server_refuses_before_any_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedprune_app import server_app

    strategy = registry.strategy_class("fedspallm")
    monkeypatch.setattr(strategy, "initial_arrays", lambda self: pytest.fail("a model was loaded"))
    monkeypatch.setattr(
        server_app.ReportedRun, "create", lambda cfg: pytest.fail("a run directory was made")
    )
    cfg = RunConfig.from_flower(
        {"method": "fedspallm", "dp-clipping-norm": 1.0, "dp-noise-multiplier": 1.0}
    )
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg.to_dict()
    )
    with pytest.raises(
        ConfigError, match="method 'fedspallm' cannot run with differential privacy"
    ):
        server_app.main(None, context)


@pytest.mark.parametrize("preset", ["fedit-dp", "sftp-dp"])
def test_the_dp_presets_run_every_planned_round_within_their_budget(preset: str) -> None:
    from fedprune_cli import launch

    root = Path(__file__).resolve().parents[2]
    cfg = RunConfig.from_flower(launch.merged_config(root, [str(root / "conf" / f"{preset}.toml")]))
    check_private(cfg)
    dp = cfg.section(DPConfig)
    assert dp.enabled and dp.dp_noise_multiplier > 0
    eps = epsilon_after(dp.dp_noise_multiplier, cfg.num_server_rounds, dp.dp_delta)
    assert dp.dp_max_epsilon - 0.02 < eps <= dp.dp_max_epsilon


def test_fedprune_run_refuses_a_method_that_cannot_be_private_before_flower_starts() -> None:
    from fedprune_cli.preflight import preflight

    with pytest.raises(ConfigError, match="method 'fedtpa' cannot run with differential privacy"):
        preflight({"method": "fedtpa", "dp-clipping-norm": 1.0}, 4)
