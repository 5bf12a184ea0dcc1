"""How to spend a machine's cores on the clients: k clients at once with one torch thread each,
or one client at a time with k threads.

    fedprune bench cores [--method sftp] [--cores 2] [--steps 4] [--repeats 2] [--mode bf16]
        [--out docs/bench/cores.json]

Both layouts run the same round-1 train messages of the method's preset, one per client (`--clients`
partitions), in worker processes started and warmed up (model loaded once) before the clock starts:

- `concurrent`: `--cores` workers of 1 thread each, the messages dealt round-robin (as Ray runs
  clients with `client-resources-num-cpus=1`);
- `threaded`: one worker of `--cores` threads running the messages one after another (as Ray runs
  clients with `client-resources-num-cpus=<cores>` and `torch-threads = 0`).

Each repeat times both layouts back to back (wall clock, from a barrier until the last message is
done), alternating which goes first. The ratio is concurrent / threaded: above 1, one client at a
time with all the threads finishes the same work sooner. Training losses are kept per message: the
thread count changes the order of floating-point sums, so they agree to rounding, not bit for bit.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from typing import Any

from benchmarks.render import finish_record, start_record


def _worker(
    method: str, steps: int, mode: str, threads: int, partitions: list[int], barrier: Any, out: Any
) -> None:
    """Warm up, wait at the barrier, run `partitions`' messages in order; report wall s, losses."""
    import torch

    from benchmarks.precision import preset, train_once
    from fedprune_app.core.runtime import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(threads)
    cfg = preset(method, steps, mode)
    train_once(preset(method, 1, mode), partitions[0])  # model load, caches
    barrier.wait()
    start = time.perf_counter()
    losses = {p: train_once(cfg, p)[1] for p in partitions}
    out.put((time.perf_counter() - start, losses))


def timed(layout: str, args: argparse.Namespace) -> tuple[float, dict[int, float]]:
    """Wall seconds from the barrier until every message of the layout is done, and each loss."""
    ctx = mp.get_context("spawn")
    clients = list(range(args.clients))
    if layout == "concurrent":
        jobs = [(1, clients[i :: args.cores]) for i in range(args.cores)]
    else:
        jobs = [(args.cores, clients)]
    barrier, out = ctx.Barrier(len(jobs)), ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker, args=(args.method, args.steps, args.mode, threads, parts, barrier, out)
        )
        for threads, parts in jobs
    ]
    for proc in procs:
        proc.start()
    results = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    return max(s for s, _ in results), {p: v for _, losses in results for p, v in losses.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="sftp", help="fedit or sftp (default: %(default)s)")
    parser.add_argument(
        "--cores", type=int, default=2, help="cores to spend (default: %(default)s)"
    )
    parser.add_argument(
        "--clients", type=int, default=4, help="messages, one per client (default: %(default)s)"
    )
    parser.add_argument(
        "--steps", type=int, default=4, help="local steps per message (default: %(default)s)"
    )
    parser.add_argument("--mode", default="no", help="mixed-precision (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=2, help="repeats (default: %(default)s)")
    parser.add_argument("--note", default="", help="free text stored in the record")
    parser.add_argument("--out", default="", help="the JSON record (e.g. docs/bench/cores.json)")
    args = parser.parse_args(argv)
    record = start_record("cores", "benchmarks.cores", argv, note=args.note)
    seconds: dict[str, list[float]] = {"concurrent": [], "threaded": []}
    losses: dict[str, dict[int, float]] = {}
    for rep in range(args.repeats):
        order = ["concurrent", "threaded"] if rep % 2 == 0 else ["threaded", "concurrent"]
        for layout in order:
            wall, losses[layout] = timed(layout, args)
            seconds[layout].append(round(wall, 2))
            print(f"repeat {rep} {layout:10s} {wall:7.1f} s", flush=True)
    concurrent, threaded = (statistics.median(seconds[k]) for k in ("concurrent", "threaded"))
    record["rows"] = [
        {
            "layout": k,
            "wall-s": statistics.median(v),
            "all": v,
            "losses": {str(p): round(x, 4) for p, x in sorted(losses[k].items())},
        }
        for k, v in seconds.items()
    ]
    record["ratio"] = round(concurrent / threaded, 3)
    record["settings"] = {k: v for k, v in vars(args).items() if k not in ("out", "note")}
    print(f"concurrent / threaded: {record['ratio']:.2f}x", flush=True)
    finish_record(record, args.out or None)


if __name__ == "__main__":
    main()
