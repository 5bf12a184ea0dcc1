"""`sftp-budget-warmup-steps`: Eq. 13's budget target falls linearly from 1 to p over the first W
global steps (not in the paper; Sheared-LLaMA's target warm-up); `sftp-budget-warmup-start` 'gap'
starts it at 1 − (p_max − p) so that mixed budgets keep their gaps."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import Tensor

import fedprune_app.methods.sftp.local as local
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.methods.sftp.schedules import ramped_keep_ratio
from strategies.sftp import SFTPStrategy
from tests.methods.sftp.test_sftp import content, make_client, sftp_config


@pytest.mark.parametrize("p", [0.5, 0.8])
@pytest.mark.parametrize("warmup", [1, 4, 7])
def test_the_target_falls_from_one_to_p_in_equal_steps_then_stays(p: float, warmup: int) -> None:
    targets = [ramped_keep_ratio(p, step, warmup) for step in range(warmup + 5)]
    assert targets[0] == pytest.approx(
        1 - (1 - p) / warmup
    )  # the first step already moves 1/W of the way
    assert targets[warmup - 1] == p  # exactly p at step W−1, and after
    assert all(t == p for t in targets[warmup:])
    drops = [a - b for a, b in zip([1.0, *targets[: warmup - 1]], targets[:warmup], strict=True)]
    assert drops == pytest.approx([(1 - p) / warmup] * warmup)  # linear: W equal drops of (1−p)/W


@pytest.mark.parametrize("p", [0.5, 0.8, 1.0])
def test_no_warmup_is_the_papers_constant_target(p: float) -> None:
    assert [ramped_keep_ratio(p, step, 0) for step in range(6)] == [p] * 6


@pytest.mark.parametrize("warmup", [1, 4, 7])
def test_the_gap_ramp_keeps_every_budgets_gap_and_ends_at_p(warmup: int) -> None:
    """'gap': the 0.8 client's ramp is the plain one from 1; the 0.5 client's is the same ramp 0.3
    lower at every step (from 1 − 0.3 − 0.2/W at step 0), and both reach their p at step W−1."""
    high = [ramped_keep_ratio(0.8, step, warmup, highest=0.8) for step in range(warmup + 3)]
    low = [ramped_keep_ratio(0.5, step, warmup, highest=0.8) for step in range(warmup + 3)]
    assert high == [
        ramped_keep_ratio(0.8, step, warmup) for step in range(warmup + 3)
    ]  # bitwise the plain ramp
    assert [a - b for a, b in zip(high, low, strict=True)] == pytest.approx([0.3] * (warmup + 3))
    assert low[0] == pytest.approx(0.5 + 0.2 * (1 - 1 / warmup))
    assert low[warmup - 1 :] == [0.5] * 4 and high[warmup - 1 :] == [0.8] * 4
    assert (
        ramped_keep_ratio(0.5, 0, 0, highest=0.8) == 0.5
    )  # W = 0: the paper's constant p either way


def test_a_highest_budget_below_the_clients_is_refused() -> None:
    with pytest.raises(ValueError, match="highest budget"):
        ramped_keep_ratio(0.8, 0, 4, highest=0.5)


def _record_targets(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The keep-ratio target each local step hands to Eq. 13 (`sftp_objective` as the client calls
    it)."""
    seen: list[float] = []
    objective = local.sftp_objective

    def recording(
        clm: Tensor, kept: Tensor, keep_ratio: float, total: int, lam: float
    ) -> tuple[Tensor, Tensor]:
        seen.append(keep_ratio)
        return objective(clm, kept, keep_ratio, total, lam)

    monkeypatch.setattr(local, "sftp_objective", recording)
    return seen


@pytest.mark.parametrize("warmup", [0, 4])
def test_local_steps_train_towards_the_ramped_target_across_rounds(
    tiny_model_dir: Path, flower_ids: None, monkeypatch: pytest.MonkeyPatch, warmup: int
) -> None:
    """Two rounds of 3 steps with W = 4: the steps of round 2 continue the ramp where round 1
    stopped (global step 3 is the last below p, step 4 on is p); W = 0 keeps p at every step."""
    cfg = sftp_config(
        tiny_model_dir,
        local_steps=3,
        batch_size=1,
        seq_len=16,
        sftp_gate_tau=1.0,
        sftp_budget_warmup_steps=warmup,
    )
    client = make_client(cfg)  # partition 1: p = 0.5
    seen = _record_targets(monkeypatch)
    sent = SFTPStrategy(cfg).initial_arrays()
    reply = client.train(content(sent, 1))
    client.train(content(reply.array_records["arrays"], 2))
    p = client.keep_ratio
    expected = [1 - (1 - p) * min(1, (step + 1) / 4) for step in range(6)] if warmup else [p] * 6
    assert p == 0.5 and seen == pytest.approx(expected, abs=0)


@pytest.mark.parametrize(("start", "top"), [("one", 1.0), ("gap", 0.7)])
def test_the_client_starts_its_ramp_where_the_key_says(
    tiny_model_dir: Path, flower_ids: None, monkeypatch: pytest.MonkeyPatch, start: str, top: float
) -> None:
    """Budgets 0.8, 0.5, 0.5, 0.5, W = 4, one round of 3 steps on the 0.5 client: 'one' ramps from
    1, 'gap' from 1 − (0.8 − 0.5) = 0.7, i.e. target_t = 0.5 + (top − 0.5)·(1 − (t+1)/4)."""
    cfg = sftp_config(
        tiny_model_dir,
        local_steps=3,
        batch_size=1,
        seq_len=16,
        sftp_gate_tau=1.0,
        sftp_budget_warmup_steps=4,
        sftp_budget_warmup_start=start,
    )
    client = make_client(cfg)
    seen = _record_targets(monkeypatch)
    client.train(content(SFTPStrategy(cfg).initial_arrays(), 1))
    assert client.keep_ratio == 0.5
    assert seen == pytest.approx([0.5 + (top - 0.5) * (1 - (t + 1) / 4) for t in range(3)])


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"sftp-budget-warmup-start": "zero"}, r"sftp-budget-warmup-start.*'one'.*'gap'"),
        (
            {"num-server-rounds": 2, "local-steps": 5, "sftp-budget-warmup-steps": 11},
            r"sftp-budget-warmup-steps.* = 10",
        ),
        (
            {
                "num-server-rounds": 3,
                "local-steps": 5,
                "sftp-recovery-rounds": 1,
                "sftp-budget-warmup-steps": 11,
            },
            r"sftp-budget-warmup-steps.* = 10",
        ),
        ({"sftp-budget-warmup-steps": -1}, r"sftp-budget-warmup-steps"),
    ],
)
def test_a_warmup_longer_than_the_mask_training_names_the_key(
    overrides: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_flower({"method": "sftp", **overrides})


def test_a_warmup_of_every_mask_training_step_is_accepted() -> None:
    cfg = RunConfig.from_flower(
        {
            "method": "sftp",
            "num-server-rounds": 3,
            "local-steps": 5,
            "sftp-recovery-rounds": 1,
            "sftp-budget-warmup-steps": 10,
        }
    )
    assert cfg.to_dict()["sftp-budget-warmup-steps"] == 10
