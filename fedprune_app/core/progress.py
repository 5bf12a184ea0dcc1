"""Progress lines for long work: how long a step took, the time elapsed, and the time left.

The time left is the mean duration of the steps done so far times the steps still to do: what a user
reads in the run's stream (`[round 3/8] ...`), in a client's layer-by-layer pruning loop
(`layer 4/30 ...`) and in a grid (`cell 2/12 ...`). Pure bookkeeping over a clock, so it is tested
with a fake one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

Clock = Callable[[], float]


def duration(seconds: float) -> str:
    """'41.2 s' under a minute, '2 min 05 s' under an hour, '1 h 02 min' beyond (rounded, never
    negative)."""
    seconds = max(0.0, float(seconds))
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    minutes = int(round(seconds / 60))
    return f"{minutes // 60} h {minutes % 60:02d} min"


def mean(samples: Sequence[float]) -> float | None:
    """The mean of `samples`, None when there are none."""
    return sum(samples) / len(samples) if samples else None


class Countdown:
    """Steps of similar work (decoder layers, grid cells): each finished step's duration is
    recorded; the time left is their mean times the steps left. `units` is the number of steps still
    to do at the start."""

    def __init__(self, units: int, clock: Clock = time.monotonic) -> None:
        self.units = units
        self.clock = clock
        self.started = clock()
        self.took: list[float] = []

    def done(self, seconds: float) -> None:
        """Record one finished step and its duration."""
        self.took.append(float(seconds))

    @property
    def left_units(self) -> int:
        """Steps still to do."""
        return max(0, self.units - len(self.took))

    def left(self) -> float | None:
        """Seconds left: mean step time × steps left (0 when none is left; None before the first
        step ends)."""
        if not self.left_units:
            return 0.0
        avg = mean(self.took)
        return None if avg is None else avg * self.left_units

    def status(self) -> str:
        """'2 min 05 s elapsed, ~3 min 30 s left' (without the estimate before the first step ends
        or after the last)."""
        text = f"{duration(self.clock() - self.started)} elapsed"
        left = self.left()
        return text if left is None or not self.left_units else f"{text}, ~{duration(left)} left"


class RoundProgress:
    """A federated run's rounds. Each round's time is split into training (`trained`) and what
    follows it (federated and server evaluation, checkpoint: `round_done`); the latter is kept apart
    for rounds that run the federated evaluation (`evaluates(round)`: round 0, the last round, every
    `eval-every`) and rounds that do not. Round 0 (evaluating the untouched model) is a sample of an
    evaluating round's cost. The time left is Σ over the rounds still to run of
    mean(train time) + mean(after-train time of its kind) (the other kind's mean while a kind has no
    sample yet). Elapsed counts from the start of the run loop."""

    def __init__(
        self, total: int, evaluates: Callable[[int], bool], clock: Clock = time.monotonic
    ) -> None:
        self.total = total
        self.evaluates = evaluates
        self.clock = clock
        self.started = self.mark = self.round_started = clock()
        self.train: list[float] = []
        self.after: dict[bool, list[float]] = {True: [], False: []}

    def _lap(self) -> float:
        now = self.clock()
        lap, self.mark = now - self.mark, now
        return lap

    def start_round(self) -> None:
        """Mark a round's start."""
        self.round_started = self.mark = self.clock()

    def trained(self) -> None:
        """Mark the end of the round's training (the rest is evaluation)."""
        self.train.append(self._lap())

    def left(self, server_round: int) -> float | None:
        """Seconds the rounds after `server_round` will take (None while no round has trained)."""
        avg_train = mean(self.train)
        if avg_train is None:
            return None
        every = mean(self.after[True] + self.after[False]) or 0.0
        kinds = {kind: mean(self.after[kind]) for kind in (True, False)}
        return sum(
            avg_train
            + (kinds[self.evaluates(r)] if kinds[self.evaluates(r)] is not None else every)
            for r in range(server_round + 1, self.total + 1)
        )

    def round_done(self, server_round: int) -> str:
        """Record the end of `server_round` and return its progress line."""
        self.after[self.evaluates(server_round)].append(self._lap())
        now = self.clock()
        head = f"[round {server_round}/{self.total}] {duration(now - self.round_started)} "
        elapsed = f"{duration(now - self.started)} elapsed"
        if server_round == 0:
            return head + f"evaluating the untouched model, {elapsed}"
        left = self.left(server_round)
        tail = (
            "the last round"
            if server_round >= self.total
            else ("" if left is None else f"~{duration(left)} left")
        )
        return head + f"this round, {elapsed}" + (f", {tail}" if tail else "")


def layer_logger(
    log: logging.Logger, prefix: str, layer_ids: Sequence[int], clock: Clock = time.monotonic
) -> Callable[[int, float], None]:
    """An `on_layer(decoder layer, seconds)` callback for a layer-by-layer pruning loop that logs
    `<prefix>: layer i/N (decoder layer j) in 3.2 s, ~1 min 28 s left`, i counting the layers in
    `layer_ids`."""
    order = {j: i for i, j in enumerate(sorted(set(layer_ids)), 1)}
    countdown = Countdown(len(order), clock)

    def on_layer(layer: int, seconds: float) -> None:
        countdown.done(seconds)
        left = countdown.left()
        log.info(
            "%s: layer %d/%d (decoder layer %d) in %s%s",
            prefix,
            order.get(layer, 0),
            len(order),
            layer,
            duration(seconds),
            f", ~{duration(left)} left" if left else "",
        )

    return on_layer
