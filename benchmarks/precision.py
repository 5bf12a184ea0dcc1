"""Mixed precision on this machine: one client's first train message, `mixed-precision` 'no' against
'bf16'.

    fedprune bench precision [--methods fedit,sftp] [--steps 8] [--repeats 3] [--threads 1]
        [--out docs/bench/precision.json]

Each repeat runs the same message (round 1, the same seed) once per mode, the modes interleaved, in
this process with `--threads` torch threads; it reports the message's thread CPU seconds per local
step (robust to other load on a shared machine) and its training loss. The ratio is 'no' / mode:
above 1, the mode is faster. The losses of the two modes differ by rounding only; whether that
changes a run's results is a question for paired runs (`fedprune compare`), not for this benchmark.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, RecordDict

from benchmarks.render import finish_record, start_record
from fedprune_app.core import registry
from fedprune_app.core.config import RunConfig
from fedprune_app.core.runtime import quiet_libraries

PRESETS = {"fedit": "conf/fedit.toml", "sftp": "conf/sftp.toml"}


def preset(method: str, steps: int, mode: str) -> RunConfig:
    """The method's preset (the default clients), `steps` local steps, the given mixed precision."""
    import tomllib

    values = (
        tomllib.loads(open(PRESETS[method]).read()) if method in PRESETS else {"method": method}
    )
    values |= {"local-steps": steps, "mixed-precision": mode, "torch-threads": 0}
    return RunConfig.from_flower(values, methods=registry.names())


def first_message(
    cfg: RunConfig, partition: int, strategy: Any, initial: Any, partitions: int = 4
) -> tuple[Any, RecordDict]:
    """Partition `partition`'s client (of `partitions`) and its round-1 train message from the
    global state `initial`, as the strategy would send it."""
    context = Context(
        run_id=1,
        node_id=partition + 1,
        state=RecordDict(),
        run_config=cfg.to_dict(),
        node_config={"partition-id": partition, "num-partitions": partitions},
    )
    client = registry.client_class(cfg.method)(cfg, context)
    payload, own = strategy.configure_round(1, initial, [partition + 1])[partition + 1]
    config = {**strategy.message_config(1), **own}
    return client, RecordDict({"arrays": payload, "config": ConfigRecord(config)})


def train_once(cfg: RunConfig, partition: int) -> tuple[float, float]:
    """Thread CPU seconds and training loss of partition `partition`'s round-1 train message."""
    strategy = registry.strategy_class(cfg.method)(cfg)
    client, content = first_message(cfg, partition, strategy, strategy.initial_arrays())
    start = time.thread_time()
    reply = client.train(content)
    seconds = time.thread_time() - start
    return seconds, float(reply.metric_records["metrics"]["train-loss"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--methods", default="fedit,sftp", help="comma-separated (default: %(default)s)"
    )
    parser.add_argument(
        "--modes", default="no,bf16", help="mixed-precision values (default: %(default)s)"
    )
    parser.add_argument(
        "--steps", type=int, default=8, help="local steps per message (default: %(default)s)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="interleaved repeats (default: %(default)s)"
    )
    parser.add_argument(
        "--partition", type=int, default=0, help="the client (default: %(default)s)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default: %(default)s)"
    )
    parser.add_argument("--note", default="", help="free text stored in the record")
    parser.add_argument(
        "--out", default="", help="the JSON record (e.g. docs/bench/precision.json)"
    )
    args = parser.parse_args(argv)
    record = start_record("precision", "benchmarks.precision", argv, note=args.note)
    quiet_libraries()
    torch.set_num_threads(args.threads)
    modes = args.modes.split(",")
    rows: list[dict[str, Any]] = []
    for method in args.methods.split(","):
        cfgs = {m: preset(method, args.steps, m) for m in modes}
        train_once(cfgs[modes[0]], args.partition)  # warm-up: model load, caches
        seconds: dict[str, list[float]] = {m: [] for m in modes}
        losses: dict[str, float] = {}
        for _ in range(args.repeats):
            for mode in modes:
                s, loss = train_once(cfgs[mode], args.partition)
                seconds[mode].append(s / args.steps)
                losses[mode] = loss
        base = statistics.median(seconds[modes[0]])
        for mode in modes:
            med = statistics.median(seconds[mode])
            rows.append(
                {
                    "method": method,
                    "mode": mode,
                    "cpu-s-per-step": round(med, 3),
                    "all": [round(x, 3) for x in seconds[mode]],
                    "ratio": round(base / med, 3),
                    "train-loss": round(losses[mode], 4),
                }
            )
            print(
                f"{method:6s} {mode:5s} {med:.3f} CPU s/step  ({base / med:.2f}x)  loss "
                f"{losses[mode]:.4f}",
                flush=True,
            )
    record["rows"] = rows
    record["settings"] = vars(args)
    finish_record(record, args.out or None)


if __name__ == "__main__":
    main()
