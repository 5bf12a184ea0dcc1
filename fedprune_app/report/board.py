"""TensorBoard: every numeric value of `metrics.jsonl` as a scalar (`board_scalars`), for
`tensorboard --logdir outputs/`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BOARD_IDENTITY = frozenset({"time", "round", "phase", "node", "client", "partition-id"})
BOARD_QUALIFIERS = {
    "server-evaluate": ("data",),
    "reference": ("model", "data"),
    "compiled": ("model",),
}


def _tag_part(value: Any) -> str:
    return re.sub(r"/+", "_", re.sub(r"\s+", "-", str(value).strip())) or "_"


def board_scalars(row: Mapping[str, Any], final_round: int) -> list[tuple[str, int, float, float]]:
    """(tag, step, value, seconds since the run started) of every numeric value of one metrics row,
    but for `BOARD_IDENTITY` fields. Tag `<phase>/<key>`, then what names the row within its phase
    (`BOARD_QUALIFIERS`: server-evaluate `data`, reference `model` and `data`, compiled `model`),
    then `client-<k>` for a client's row: `train/train-loss/client-0`,
    `server-evaluate/ppl/wikitext`, `reference/ppl/standalone/wikitext/client-2`. Step: the row's
    round; rows without one (scored after the last round: references, compiled models) at
    `final_round`. Failed and rejected replies are left out."""
    if row.get("status") in ("failed", "rejected"):
        return []
    phase = _tag_part(row.get("phase", "run"))
    names = [
        _tag_part(row[k])
        for k in BOARD_QUALIFIERS.get(str(row.get("phase")), ())
        if row.get(k) is not None
    ]
    if row.get("client") is not None:
        names.append(f"client-{_tag_part(row['client'])}")
    suffix = "".join(f"/{n}" for n in names)
    step = int(row["round"]) if isinstance(row.get("round"), int | float) else final_round
    offset = float(row["time"]) if isinstance(row.get("time"), int | float) else 0.0
    return [
        (f"{phase}/{_tag_part(key)}{suffix}", step, float(value), offset)
        for key, value in row.items()
        if key not in BOARD_IDENTITY and isinstance(value, int | float)
    ]


class Board:
    """The TensorBoard event writer of `<run>/tensorboard`, opened at the first scalar."""

    def __init__(self, path: Path, final_round: int, started: float) -> None:
        self.path, self.final_round, self.started = path, final_round, started
        self.writer: Any = None

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Each row's scalars as one event (torch.utils.tensorboard's FileWriter, the writer under
        SummaryWriter, without its per-scalar overhead): queued in memory, written every 30 s and
        at `close`."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        for row in rows:
            scalars = board_scalars(row, self.final_round)
            if not scalars:
                continue
            if self.writer is None:
                from torch.utils.tensorboard.writer import FileWriter

                self.writer = FileWriter(str(self.path), max_queue=1000, flush_secs=30)
            summary = Summary(
                value=[Summary.Value(tag=tag, simple_value=value) for tag, _, value, _ in scalars]
            )
            self.writer.add_summary(summary, scalars[0][1], walltime=self.started + scalars[0][3])

    def close(self) -> None:
        """Flush and close the writer, if one was opened."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
