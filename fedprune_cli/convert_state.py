"""Convert state files that older versions wrote as pickles: run it only on files your own runs
wrote.

    python -m fedprune_cli.convert_state outputs/<run>/checkpoint/state.pkl
    python -m fedprune_cli.convert_state \\
        ~/.cache/fedprune/client-state/<run key>/partition-*/round-*.pkl

Loading a pickle runs whatever code it carries, which is why fedprune no longer reads them. This
command does, once, for files you name: a server checkpoint `state.pkl` becomes `state.safetensors`
beside it, a client's `round-<r>.pkl` becomes `round-<r>.pb`; `resume-from` then reads the new
files. The pickles are left in place.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path


def convert(path: Path) -> Path:
    """Unpickle one trusted file and write it in the current format; the new file's path."""
    from fedprune_app.core.checkpoint import OLD_STATE_FILE, STATE_FILE
    from fedprune_app.core.statefile import write_records, write_state

    with open(path, "rb") as f:
        # the user names a file of their own run, knowing what it does
        state = pickle.load(f)  # noqa: S301
    if path.name == OLD_STATE_FILE:
        target = path.with_name(STATE_FILE)
        write_state(target, state)
    elif path.name.startswith("round-"):
        target = path.with_suffix(".pb")
        write_records(target, state)
    else:
        raise SystemExit(
            f"error: {path} is neither a checkpoint/{OLD_STATE_FILE} nor a client's round-<r>.pkl"
        )
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedprune_cli.convert_state",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="pickles an older fedprune wrote (checkpoint/state.pkl, round-<r>.pkl)",
    )
    for path in parser.parse_args(argv).files:
        print(f"{path} -> {convert(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
