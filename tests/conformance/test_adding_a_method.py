"""Adding a method takes the files docs/architecture.md lists and edits none: a toy method proves
it.

`toy_method/` holds a whole method in the layout's places (methods/toy/, strategies/toy.py,
clients/toy.py, conf/toy.toml, tests/toy/). The test puts those folders on the packages' paths (as
if the files had been dropped into fedprune_app/methods/, strategies/, clients/ and tests/methods/),
and the method registers, validates its keys, runs a round in-process and passes the conformance
suites.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import MessageType

import clients
import fedprune_app.methods
import strategies
import tests.methods
from fedprune_app.core import registry
from fedprune_app.core.config import RunConfig
from fedprune_app.core.protocol import flat_metrics, numpy_state
from fedprune_cli import launch
from tests.conformance.test_bad_replies import check_bad_replies
from tests.conformance.test_privacy import check_privacy
from tests.conformance.test_reliability import check_resume
from tests.core.test_layout import cross_method_imports, offenders
from tests.local_grid import LocalGrid, method_config, run_server

TOY = Path(__file__).resolve().parent / "toy_method"
# docs/architecture.md's list: where each file of a new method goes
FILES = {
    "methods/toy/__init__.py": "fedprune_app/methods/toy/__init__.py",
    "methods/toy/config.py": "fedprune_app/methods/toy/config.py",
    "strategies/toy.py": "strategies/toy.py",
    "clients/toy.py": "clients/toy.py",
    "conf/toy.toml": "conf/toy.toml",
    "tests/toy/__init__.py": "tests/methods/toy/__init__.py",
}


@pytest.fixture()
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy method's folders on the packages' paths, discovered afresh; the registry restored
    afterwards."""
    monkeypatch.setattr(registry, "_METHODS", {k: v for k, v in registry._METHODS.items()})
    monkeypatch.setattr(registry, "_LOADED", set())
    for package, folder in (
        (fedprune_app.methods, "methods"),
        (strategies, "strategies"),
        (clients, "clients"),
        (tests.methods, "tests"),
    ):
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(TOY / folder)])
    # imported afresh, so each test's discovery registers the method again
    for module in (
        "fedprune_app.methods.toy",
        "fedprune_app.methods.toy.config",
        "strategies.toy",
        "clients.toy",
        "tests.methods.toy",
    ):
        monkeypatch.delitem(sys.modules, module, raising=False)


def test_a_method_is_the_files_the_readme_lists() -> None:
    found = {
        p.relative_to(TOY).as_posix()
        for p in TOY.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert found == set(FILES)
    assert offenders([TOY / "strategies" / "toy.py"], ("clients", "fedprune_cli")) == []
    assert offenders([TOY / "clients" / "toy.py"], ("strategies", "fedprune_cli")) == []
    assert (
        offenders(
            sorted((TOY / "methods").rglob("*.py")),
            ("strategies", "clients", "fedprune_cli", "flwr"),
        )
        == []
    )
    # the LoRA base, not FedIT's
    assert cross_method_imports("toy", sorted(TOY.rglob("*.py"))) == []


def test_the_toy_method_registers_and_validates_its_keys(toy: None) -> None:
    assert "toy" in registry.names()
    assert registry.strategy_class("toy").__name__ == "ToyStrategy"
    assert registry.client_class("toy").__name__ == "ToyClient"
    cfg = RunConfig.from_flower(
        launch.merged_config(launch.APP_DIR, [str(TOY / "conf" / "toy.toml")])
    )
    assert cfg.method == "toy" and cfg["toy-server-lr"] == 0.5
    with pytest.raises(ValueError, match=r"'toy-server-lr' must be a float in \[0, 1\], got 2.0"):
        RunConfig.from_flower({"method": "toy", "toy-server-lr": 2.0})


def test_the_toy_method_runs_a_round_and_applies_its_server_rule(
    toy: None, tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    """global_1 = global_0 + eta * (Σ n_k x_k / Σ n_k - global_0), checked against the messages of
    the run."""
    cfg = method_config(
        tiny_model_dir,
        tmp_path,
        "toy",
        num_server_rounds=1,
        fraction_train=1.0,
        fraction_evaluate=1.0,
        toy_server_lr=0.25,
    )
    grid = LocalGrid(cfg, 4, seed=0)
    run_dir, err = run_server(cfg, grid)
    assert err is None, err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    train = [(m, r) for m, r in grid.exchanges if m.metadata.message_type == MessageType.TRAIN]
    after = [
        m
        for m, _ in grid.exchanges
        if m.metadata.message_type == MessageType.EVALUATE
        and m.content.config_records["config"]["server-round"] == 1
    ]
    assert len(train) == 4 and after
    start = numpy_state(train[0][0].content.array_records["arrays"])
    sizes = [float(flat_metrics(r.content)["num-examples"]) for _, r in train]
    states = [numpy_state(r.content.array_records["arrays"]) for _, r in train]
    got = numpy_state(after[0].content.array_records["arrays"])
    moved = 0
    for k, x0 in start.items():
        mean = sum(n * s[k].astype(np.float64) for n, s in zip(sizes, states, strict=True)) / sum(
            sizes
        )
        np.testing.assert_allclose(got[k], x0 + 0.25 * (mean - x0), rtol=1e-5, atol=1e-7)
        moved += int(not np.allclose(got[k], x0))
    assert moved > 0


@pytest.mark.parametrize(
    "suite",
    [check_privacy, check_bad_replies, check_resume],
    ids=["privacy", "bad-replies", "resume"],
)
def test_the_toy_method_passes_the_conformance_suites(
    suite, toy: None, tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    suite("toy", tiny_model_dir, tmp_path)


def test_a_registered_method_without_a_test_configuration_fails_the_suites(
    toy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conformance import conformance_of

    monkeypatch.setattr(
        tests.methods, "__path__", [p for p in tests.methods.__path__ if not p.startswith(str(TOY))]
    )
    monkeypatch.delitem(sys.modules, "tests.methods.toy", raising=False)
    with pytest.raises(
        pytest.fail.Exception, match=r"method 'toy' has no test configuration.*tests/methods/toy"
    ):
        conformance_of("toy")
