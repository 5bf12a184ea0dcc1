"""The `fedprune` command line: its sub-commands, their help, and that help never loads torch."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from fedprune_cli.main import BENCHMARKS, COMMANDS, GRIDS, main, parser


def subparsers(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every (name, parser) of the command line, nested sub-commands (rescore accuracy|rouge)
    included."""
    found = []
    for name, sub in subparsers(parser()).items():
        found.append((name, sub))
        nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        found += [(f"{name} {k}", p) for a in nested for k, p in a.choices.items()]
    return found


def test_every_command_is_listed_and_every_option_has_help() -> None:
    assert set(subparsers(parser())) == set(COMMANDS)
    for name, sub in all_parsers():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            assert action.help, (
                f"fedprune {name}: {action.option_strings or action.dest} has no help text"
            )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["run"],
        ["compare"],
        ["rescore"],
        ["rescore", "accuracy"],
        ["grid"],
        ["deploy"],
        ["keys"],
        ["bench"],
    ],
)
def test_help_answers_without_importing_torch_or_flower(argv: list[str]) -> None:
    """`fedprune [<cmd>] --help` prints its usage and exits 0 in a fresh interpreter that never
    imported torch, transformers or flwr (what makes it answer at once)."""
    code = (
        "import sys\nfrom fedprune_cli.main import main\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = [m for m in ('torch', 'transformers', 'flwr') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *argv, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: fedprune")


def test_bench_and_grid_hand_over_to_the_named_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fedprune bench <name> ARGS` runs benchmarks/<name>.py's main(ARGS);
    `fedprune grid <paper> ARGS` the grids' main with the paper first; an unknown name is refused by
    the parser."""
    import importlib

    called = []

    class Fake:
        @staticmethod
        def main(argv: list[str]) -> int:
            called.append(argv)
            return 3

    monkeypatch.setattr(importlib, "import_module", lambda name: called.append(name) or Fake)
    assert main(["bench", "compiled", "--repeats", "2"]) == 3
    assert main(["grid", "fedtpa", "--render-only"]) == 3
    assert called == [
        "benchmarks.compiled",
        ["--repeats", "2"],
        "experiments.grids.__main__",
        ["fedtpa", "--render-only"],
    ]
    root = Path(__file__).resolve().parents[2]
    assert all((root / "benchmarks" / f"{name}.py").is_file() for name in BENCHMARKS)
    assert all(
        (root / "experiments" / "grids" / paper / "__init__.py").is_file() for paper in GRIDS
    )
    monkeypatch.undo()
    with pytest.raises(SystemExit):
        main(["bench", "nosuch"])
