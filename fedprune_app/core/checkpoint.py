"""Checkpoints: what lets an interrupted run continue as if it had never stopped
(`checkpoint-every`, `resume-from`).

Server side, `<run dir>/checkpoint/state.safetensors`, rewritten atomically after every k-th round:
`{"round": r, "run-key": ..., "arrays": {name: ndarray}, "strategy": strategy.state_dict()}` — the
loop's global arrays and the strategy's server-side state (sampling RNG, pruned weights and so their
masks, per-client keep ratios, last losses and ranks, kept-ratio histories; with differential
privacy the accountant's ledger, Flower's JSON `state_dict`; a resume continues the interrupted
run's `privacy-ledger.json` where it holds more releases, `core/privacy.py`). The
checkpoint holds no DP noise generator: the noise is drawn afresh at every release, so an
interrupted run is continued, not replayed, where DP noise is involved.

Client side, on the client's own device: `<state-dir>/<run-key>/partition-<id>/round-<r>.pb` = its
`context.state` after its round-r train message (e.g. importance EMAs, a client embedding and its
optimizer moments). It never travels; a resumed run's client, starting with an empty
`context.state`, loads the newest file from before the current round.

The run key is the first run's directory name and is kept by every resume, so the clients find their
state. Neither file is a pickle: reading them parses data and never runs code (`core/statefile.py`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedprune_app.core import registry
from fedprune_app.core.config import ConfigError, RunConfig, defaults, safe_name, with_current_names
from fedprune_app.core.protocol import spec_of
from fedprune_app.core.replies import spec_problem
from fedprune_app.core.rundir import resolve_output_dir
from fedprune_app.core.statefile import (
    StateFileError,
    pickle_refusal,
    read_records,
    read_state,
    write_records,
    write_state,
)
from fedprune_app.llm.assets import cache_root, model_config

STATE_FILE = "state.safetensors"
OLD_STATE_FILE = "state.pkl"  # written by older versions: refused, never unpickled
# keys a resumed run may change; every other key must equal the interrupted run's
RESUME_FREE_KEYS = ("resume-from", "run-tag", "output-dir", "num-server-rounds", "device")
CLIENT_STATES_KEPT = 3


@dataclass(frozen=True)
class Checkpoint:
    """A server checkpoint: the last completed round, its global arrays and the strategy state."""

    run_dir: Path
    round: int
    run_key: str
    arrays: dict[str, np.ndarray]
    strategy: dict[str, Any]

    @property
    def path(self) -> Path:
        """Its state file."""
        return self.run_dir / "checkpoint" / STATE_FILE

    def rows(self) -> list[dict[str, Any]]:
        """The interrupted run's metrics rows of rounds 0..round (what a resumed run's metrics.jsonl
        starts with); a torn last line is dropped (`read_rows`)."""
        rows, _torn = read_rows(self.run_dir / "metrics.jsonl")
        return [r for r in rows if isinstance(r.get("round"), int) and r["round"] <= self.round]


def read_rows(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The rows of a metrics.jsonl and whether its last line was torn (not a JSON table: a write
    the interruption cut short), which is dropped. ConfigError naming `resume-from`, the file and
    the line for a bad line before the last: that file was not written by a run."""
    if not path.is_file():
        return [], False
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif number == len(lines):
            return rows, True
        else:
            raise ConfigError(
                f"run-config key 'resume-from': {path} line {number} is not a JSON row; the "
                "interrupted run's rows cannot be carried over"
            )
    return rows, False


def save_checkpoint(
    run_dir: Path,
    server_round: int,
    run_key: str,
    arrays: dict[str, np.ndarray],
    strategy_state: dict[str, Any],
) -> Path:
    """Write `<run_dir>/checkpoint/` atomically: the round, the run key, the global arrays and the
    strategy's state (`state_dict`); return the file written.
    """
    path = run_dir / "checkpoint" / STATE_FILE
    write_state(
        path,
        {"round": server_round, "run-key": run_key, "arrays": arrays, "strategy": strategy_state},
    )
    return path


def load_checkpoint(cfg: RunConfig) -> Checkpoint:
    """The checkpoint `resume-from` names, after checking (before any model is loaded) that it
    exists, that the run config matches the interrupted run's (keys other than RESUME_FREE_KEYS) and
    that rounds remain."""
    given = resolve_output_dir(cfg.resume_from)  # a relative path resolves as `output-dir` does
    run_dir = given.parent if given.name == "checkpoint" else given
    path = run_dir / "checkpoint" / STATE_FILE
    if not path.is_file() and (run_dir / "checkpoint" / OLD_STATE_FILE).is_file():
        raise ConfigError(
            "run-config key 'resume-from': "
            f"{pickle_refusal(run_dir / 'checkpoint' / OLD_STATE_FILE)}"
        )
    if not path.is_file():
        raise ConfigError(
            f"run-config key 'resume-from' must be a run directory holding checkpoint/{STATE_FILE} "
            f"(written when checkpoint-every > 0), got {str(given)!r}: {path} does not exist"
        )
    old = with_current_names(json.loads((run_dir / "config.json").read_text()))
    new = cfg.to_dict()
    # a key added after the interrupted run was written (absent from its config.json) is the same if
    # the resumed run leaves it at its default: the default is what that run did (e.g.
    # `payload-dtype` = "float32")
    old.update({k: v for k, v in defaults().items() if k not in old and new.get(k) == v})
    differ = sorted(
        k for k in set(old) | set(new) if k not in RESUME_FREE_KEYS and old.get(k) != new.get(k)
    )
    if differ:
        detail = ", ".join(f"'{k}' ({old.get(k)!r} -> {new.get(k)!r})" for k in differ)
        raise ConfigError(
            f"run-config key 'resume-from': the run config differs from the interrupted run's in "
            f"{detail}; only {', '.join(RESUME_FREE_KEYS)} may change"
        )
    try:
        state = read_state(path)
        if not isinstance(state, dict) or not {"round", "run-key", "arrays", "strategy"} <= set(
            state
        ):
            raise StateFileError(f"{path} holds no checkpoint (round, run-key, arrays, strategy)")
        problem = checkpoint_problem(state)
        if problem:
            raise StateFileError(f"{path} is not a checkpoint of this version: {problem}")
    except StateFileError as err:
        raise ConfigError(f"run-config key 'resume-from': {err}") from err
    if state["round"] >= cfg.num_server_rounds:
        raise ConfigError(
            f"run-config key 'resume-from': {run_dir.name} has already completed round "
            f"{state['round']} of num-server-rounds = {cfg.num_server_rounds}; raise "
            "num-server-rounds to continue it"
        )
    read_rows(run_dir / "metrics.jsonl")  # a bad line before the last stops the resume here
    return Checkpoint(
        run_dir, int(state["round"]), str(state["run-key"]), state["arrays"], state["strategy"]
    )


def checkpoint_problem(state: dict[str, Any]) -> str:
    """What makes a read checkpoint unusable ('' when nothing): each entry of the type
    `save_checkpoint` writes, the arrays finite numbers or bools."""
    rnd, arrays = state["round"], state["arrays"]
    if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
        return f"'round' must be an int >= 0, got {rnd!r}"
    if not safe_name(state["run-key"]) or not isinstance(state["strategy"], dict):
        return (
            "'run-key' must be a name of letters, digits, '.', '_' and '-' (it names the clients' "
            "state directories) and 'strategy' a table"
        )
    if not isinstance(arrays, dict):
        return "'arrays' must be a table of named arrays"
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "fbiu":
            return f"array {name!r} is not a numeric array"
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return f"array {name!r} holds NaN or infinite values"
    return ""


def check_fits(
    checkpoint: Checkpoint, cfg: RunConfig, spec: Mapping[str, tuple[tuple[int, ...], str]] | None
) -> None:
    """ConfigError naming the state file when the checkpoint cannot continue a run of `cfg`: what
    it holds differs in keys, shapes or dtypes from `spec`, the method's `checkpoint_spec` for
    `cfg` (its global arrays by name; a state table `t`'s arrays as `t/<name>`). None: not
    checked."""
    if spec is None:
        return
    held = dict(checkpoint.arrays)
    for table in {k.split("/", 1)[0] for k in spec if "/" in k}:
        entries = checkpoint.strategy.get(table)
        if isinstance(entries, Mapping):
            held |= {f"{table}/{k}": v for k, v in entries.items() if isinstance(v, np.ndarray)}
    problem = spec_problem(spec_of(held), spec)
    if problem:
        raise ConfigError(
            f"run-config key 'resume-from': {checkpoint.path} does not fit what "
            f"method {cfg.method!r} builds for model {cfg.model_name!r} with this "
            f"run config: {problem}"
        )


def resume_spec(
    cfg: RunConfig, initial: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> dict[str, tuple[tuple[int, ...], str]] | None:
    """What a checkpoint of `cfg` must hold (`check_fits`), as the launcher derives it: the spec
    the method registered (`register_method`: from the model's config.json, or from config.json
    and the structure the checkpoint's `arrays` record); for a model whose config.json a
    config-fixed spec cannot read, the keys, shapes and dtypes of `initial` (this config's
    `initial_arrays()`, which every round keeps). None: not checked (a structure-following spec
    on a model it cannot read)."""
    method = registry.get(cfg.method)
    config = model_config(cfg.model_name)
    if method.spec_from_checkpoint is not None:
        return method.spec_from_checkpoint(cfg, config, arrays)
    spec = method.checkpoint_spec(cfg, config) if method.checkpoint_spec is not None else None
    return spec if spec is not None else spec_of(initial)


# --- client side ----------------------------------------------------------------------------------


def new_run_key(run_name: str) -> str:
    """The key a new run's clients file their private state under: its directory name and 8 random
    hex digits (two runs started in the same second never share one)."""
    return f"{run_name}-{secrets.token_hex(4)}"


def client_state_dir(state_dir: str | None, run_key: str, partition_id: int) -> Path:
    """`<state-dir>/<run-key>/partition-<id>` (state-dir defaults to
    `<fedprune cache>/client-state`). ValueError for a run key that is not a plain name or a path
    that would leave state-dir: the key comes from a message, and a tampered one must not make a
    client write or delete files elsewhere."""

    if not safe_name(run_key):
        raise ValueError(
            f"message config 'run-key' must be letters, digits, '.', '_' and '-', got {run_key!r}"
        )
    root = (Path(state_dir).expanduser() if state_dir else cache_root() / "client-state").resolve()
    directory = (root / run_key / f"partition-{int(partition_id)}").resolve()
    if not directory.is_relative_to(root):
        raise ValueError(f"client state directory {directory} is outside {root}")
    return directory


def save_client_state(directory: Path, server_round: int, state: Any) -> None:
    """Write the client's `context.state` after round `server_round`; keep the newest
    CLIENT_STATES_KEPT."""
    write_records(directory / f"round-{server_round}.pb", state)
    for old in sorted(_rounds(directory))[:-CLIENT_STATES_KEPT]:
        (directory / f"round-{old}.pb").unlink(missing_ok=True)


def load_client_state(directory: Path, before_round: int) -> Any | None:
    """The newest state saved after a round < `before_round`, or None."""
    rounds = [r for r in _rounds(directory) if r < before_round]
    if not rounds:
        old = [r for r in _rounds(directory, ".pkl") if r < before_round]
        if old:
            raise pickle_refusal(directory / f"round-{max(old)}.pkl")
        return None
    return read_records(directory / f"round-{max(rounds)}.pb")


def _rounds(directory: Path, suffix: str = ".pb") -> list[int]:
    if not directory.is_dir():
        return []
    return [
        int(p.stem.split("-", 1)[1])
        for p in directory.glob(f"round-*{suffix}")
        if p.stem.split("-", 1)[1].isdigit()
    ]
