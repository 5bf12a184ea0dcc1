"""`fedprune run`: the command (its options and what it does with them). One checked simulation is
`fedprune_cli.launch`; SFT-P beside its references (`--references`) is
`fedprune_cli.references`."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from fedprune_app.core.config import ConfigError
from fedprune_cli import references
from fedprune_cli.launch import (
    APP_DIR,
    DEFAULT_FEDERATION,
    STOPS,
    Terminated,
    checked_config,
    launch,
    preset_federation,
    raise_terminated,
    stop_when_orphaned,
    write_run_config,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fedprune run`."""
    parser.add_argument(
        "--run-config",
        action="append",
        default=[],
        metavar="PRESET_OR_OVERRIDES",
        help="a TOML preset (conf/X.toml) or 'key=value ...' overrides; repeatable, later "
        "wins (keys: `fedprune keys`, docs/config.md)",
    )
    parser.add_argument(
        "--federation-config",
        default=None,
        help="Flower's simulation sizing (default: the preset's `# federation:` line, else "
        f"{DEFAULT_FEDERATION!r})",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="check the configuration as a run would (preflight), print what would run, and exit "
        "without starting Flower (0: it would start)",
    )
    parser.add_argument(
        "--save-run-config",
        metavar="PATH",
        type=Path,
        help="with --check: also write the merged, checked run config (presets and overrides in "
        "one TOML file, paths absolute) to PATH, for `flwr run . <federation> --run-config PATH` "
        "on a real deployment",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=7200,
        help="seconds the run may take before it is stopped (default: %(default)s)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when any client reply was left out (failed, timed out or "
        "rejected), even if the run completed: for CI",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="HOST:PORT",
        help="run the simulation on this existing Ray cluster (the head's address, as `ray start "
        "--head` prints it) instead of starting Ray; see docs/scale.md",
    )
    parser.add_argument(
        "--references",
        action="store_true",
        help="SFT-P only: also run its ceiling (every gate open) and floor (post hoc cut) on the "
        "same clients and print the three side by side (what `make run-references` does)",
    )
    parser.add_argument(
        "--render",
        nargs=3,
        type=Path,
        metavar=("SFTP", "CEILING", "FLOOR"),
        help="with --references: only re-render the table from three finished runs",
    )


def run(args: argparse.Namespace) -> int:
    """`fedprune run`: one checked simulation, or SFT-P with its references; with `--check`, the
    checks alone."""
    if args.render and not args.references:
        print("error: --render needs --references", file=sys.stderr)
        return 2
    if args.save_run_config is not None and not args.check:
        print("error: --save-run-config needs --check", file=sys.stderr)
        return 2
    if args.federation_config is None:
        args.federation_config = preset_federation(args.run_config) or DEFAULT_FEDERATION
    if args.check:
        try:
            values = checked_config(
                APP_DIR, args.run_config, args.federation_config, cluster=bool(args.ray_address)
            )
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(
            f"[fedprune] ok: method {values['method']!r}, {values['num-server-rounds']} round(s), "
            f"federation {args.federation_config!r}; nothing started"
        )
        if args.save_run_config is not None:
            write_run_config(args.save_run_config, values)
            print(f"[fedprune] run config written to {args.save_run_config}")
        return 0
    signal.signal(signal.SIGTERM, raise_terminated)  # `launch` cleans up on TERM as on Ctrl-C
    stop_when_orphaned()
    try:
        if args.references:
            return references.run_references(
                args.run_config, args.federation_config, args.timeout, args.render
            )
        return launch(
            args.run_config,
            args.federation_config,
            timeout=args.timeout,
            ray_address=args.ray_address,
            strict=args.strict,
        ).code
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as stop:  # before or after a launch: nothing runs
        reason, code = STOPS[type(stop)]
        print(f"[fedprune] stopped by {reason}; no run was running", file=sys.stderr)
        return code
