"""`fedprune dp-sigma`: the σ it prints reaches the target ε over the rounds (against
dp_accounting), and bad options get one line and exit 2."""

from __future__ import annotations

import re

import pytest

from fedprune_cli.main import main
from tests.dp_reference import dp_accounting_epsilon


def test_the_printed_sigma_reaches_the_target_epsilon_and_no_less_noise_would(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--epsilon", "8", "--delta", "1e-5", "--rounds", "3"]
    assert main(["dp-sigma", *args, "--clipping-norm", "0.1", "--sampled", "4"]) == 0
    out = capsys.readouterr().out
    sigma = float(re.match(r"dp-noise-multiplier = ([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    assert (
        dp_accounting_epsilon(sigma, 3, 1e-5) <= 8.0 < dp_accounting_epsilon(sigma / 1.003, 3, 1e-5)
    )
    assert f"σ·C/m = {sigma * 0.1 / 4:.4g}" in out


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--epsilon", "0", "--delta", "1e-5", "--rounds", "3"], "--epsilon"),
        (["--epsilon", "8", "--delta", "1", "--rounds", "3"], "--delta"),
        (["--epsilon", "8", "--delta", "1e-5", "--rounds", "0"], "--rounds"),
        (
            ["--epsilon", "8", "--delta", "1e-5", "--rounds", "3", "--sampled", "4"],
            "--clipping-norm",
        ),
    ],
)
def test_a_bad_option_gets_one_line_naming_it(
    args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dp-sigma", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err
