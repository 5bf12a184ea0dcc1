"""`fedprune`: the command line of fedprune (`fedprune --help`, `fedprune <command> --help`).

Each command lives in its own module with `add_arguments(parser)` and `run(args) -> int`; the
modules import torch, transformers and Flower only inside `run`, so `--help` answers at once.
`bench` and `grid` hand their arguments to a benchmark (benchmarks/<name>.py) or a paper's grid
(experiments/grids/), which need a source checkout (`git clone`, `make setup`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# command -> (module, one line for `fedprune --help`)
COMMANDS = {
    "run": (
        "fedprune_cli.run",
        "run one Flower simulation of a preset (checked before Ray starts)",
    ),
    "compare": (
        "fedprune_cli.compare",
        "compare two re-scored runs (or seed-paired sets), with 95%% intervals",
    ),
    "rescore": ("fedprune_cli.rescore", "score finished runs again on more held-out examples"),
    "grid": (
        "experiments.grids.__main__",
        "run or re-render a paper's tables (sftp, fedspallm, fedtpa)",
    ),
    "deploy": (
        "fedprune_cli.deploy",
        "a real deployment on this machine: SuperLink + SuperNodes over TLS",
    ),
    "keys": ("fedprune_cli.keys", "the run-config keys: check, list or regenerate their reference"),
    "dp-sigma": (
        "fedprune_cli.dp_sigma",
        "the dp-noise-multiplier that reaches a target ε at δ over the planned rounds",
    ),
    "bench": ("benchmarks", "a standing benchmark; each writes a record under docs/bench/"),
}
# benchmark -> one line; `fedprune bench <name> --help` shows its options
BENCHMARKS = {
    "compiled": (
        "SFT-P's compiled models against the dense model: size and CPU speed vs the FLOP ceiling"
    ),
    "deployed": (
        "the deployed models of finished runs against the dense model, timed away from the run"
    ),
    "overhead": "Flower's overhead: the same FedIT work through `flwr run` and as a plain loop",
    "profile": (
        "where `fedprune run`'s wall time goes, phase by phase (or a finished run's, --from); "
        "--isa native avx2: the same run as on a CPU without AMX and AVX-512"
    ),
    "precision": (
        "mixed precision (bf16 autocast) against float32: CPU seconds per local training step"
    ),
    "cores": "k clients at once with 1 thread each against one client at a time with k threads",
    "pruning": "seconds to prune the embedded model with SparseGPT, Wanda and magnitude",
    "scale": "one simulation with many virtual SuperNodes on the tiny LLaMA",
    "llama7b": "each method's client step and aggregation on LLaMA-7B-shaped layers, extrapolated",
    "render": (
        "print a benchmark record (docs/bench/*.json) as the docs show it; --check the docs' tables"
    ),
}
GRIDS = ("sftp", "fedspallm", "fedtpa")
EPILOG = (
    "The Flower-native way runs too: `flwr run . --run-config conf/<preset>.toml` "
    "(docs/running.md).\n"
    "Manual: README.md; every key: `fedprune keys --list` or docs/config.md."
)


def parser() -> argparse.ArgumentParser:
    """The top-level parser; each command's options come from its module's `add_arguments`."""
    top = argparse.ArgumentParser(
        prog="fedprune",
        description="Federated pruning and tuning of language models with Flower.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="<command>")
    for name, (module, text) in COMMANDS.items():
        if name in ("bench", "grid"):
            continue
        sub = commands.add_parser(
            name,
            help=text,
            description=importlib.import_module(module).__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        importlib.import_module(module).add_arguments(sub)
    grid = commands.add_parser(
        "grid",
        help=COMMANDS["grid"][1],
        description="Run a paper's cells that are missing, then render its tables. "
        "`fedprune grid <paper> --help` lists the grid's options.",
    )
    grid.add_argument("paper", choices=GRIDS, help="the paper whose tables to regenerate")
    bench = commands.add_parser(
        "bench",
        help=COMMANDS["bench"][1],
        description="Standing benchmarks: "
        + "; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items())
        + ". `fedprune bench <name> --help` lists a benchmark's options.",
    )
    bench.add_argument("name", choices=sorted(BENCHMARKS), help="the benchmark to run")
    return top


def _hand_over(module: str, prog: str, argv: list[str]) -> int:
    """Run a benchmark's or grid's own `main(argv)` under the name `prog`."""
    try:
        target = importlib.import_module(module)
    except ModuleNotFoundError as err:
        print(
            (
                f"error: {prog} needs a source checkout of fedprune (git clone, then "
                f"`make setup`): {err}"
            ),
            file=sys.stderr,
        )
        return 2
    sys.argv[0] = prog  # argparse names the program after it
    return int(target.main(argv) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the command line) and run the command; its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 2 and args[0] == "bench" and args[1] in BENCHMARKS:
        return _hand_over(f"benchmarks.{args[1]}", f"fedprune bench {args[1]}", args[2:])
    if len(args) >= 2 and args[0] == "grid" and args[1] in GRIDS:
        return _hand_over(COMMANDS["grid"][0], "fedprune grid", args[1:])
    parsed = parser().parse_args(args)
    return int(importlib.import_module(COMMANDS[parsed.command][0]).run(parsed))


if __name__ == "__main__":
    sys.exit(main())
