"""Scale check: one `flwr run` simulation with many virtual SuperNodes on the tiny LLaMA, timed and
measured.

FedIT with `--clients` SuperNodes (default 100), `--fraction` of them sampled for training and for
evaluation each round (default 0.1 = 10), `--rounds` rounds of a few LoRA steps on the tiny 2-layer
LLaMA of the tests (random weights, the real SmolLM2 tokenizer; built once into
$FEDPRUNE_CACHE/tiny-llama). The data are the four default BIG-bench tasks, dealt by source: each
task's training examples are split into equal shares among the clients that hold it,
`--examples-per-client` each (so max-train-examples = that x ceil(clients / 4)).

The run goes through `fedprune run` (what `make run` uses: own FLWR_HOME, offline env, SuperLink
stopped by PID). While it runs, a thread samples every 0.5 s the memory of every process the
launcher started: its descendants plus the processes in their sessions (Ray's daemons are reparented
to init but stay in the session), this script's own process excluded. Printed: wall time, peak
summed RSS (shared pages counted once per process, an upper bound) and PSS (shared pages split, the
honest total), the breakdown at the peak, and the per-round time from metrics.jsonl. Exits non-zero
unless the run's summary.json says "completed".

    make bench-scale  # = benchmarks/scale.py --clients 100 --fraction 0.1
    .venv/bin/python benchmarks/scale.py --clients 200 --fraction 0.05 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from fedprune_app.llm.assets import build_once, cache_root
from fedprune_cli import launch

ROOT = Path(__file__).resolve().parent.parent
SOURCES = "olmo:social_iqa,olmo:commonsense_qa,olmo:arc_easy,olmo:mmlu/miscellaneous"
GIB = 1024**3


def tiny_model_dir() -> Path:
    """The tests' tiny LLaMA, built once under the cache (a lock makes concurrent builds safe)."""
    from tests.tiny import save_tiny_llama

    def build(tmp: Path) -> None:
        save_tiny_llama(tmp)

    return build_once(cache_root() / "tiny-llama", build)


def role(argv: list[str]) -> str:
    """A short name for what a process is, from its command line."""
    line = " ".join(argv)
    for needle, name in (
        ("flower-superlink", "SuperLink"),
        ("flower-superexec", "SuperExec"),
        ("flwr-simulation", "ServerApp + Ray driver"),
        ("ClientAppActor", "ClientApp actors"),
        ("flwr run", "flwr CLI"),
    ):
        if needle in line:
            return name
    return "Ray daemons" if "ray" in line else "other"


@dataclass
class MemorySampler:
    """Polls the launcher's process tree; keeps the peak summed RSS / PSS and the breakdown at the
    RSS peak."""

    interval: float = 0.5
    peak_rss: int = 0
    peak_pss: int = 0
    peak_procs: int = 0
    breakdown: Counter = field(default_factory=Counter)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def tree(self) -> list[psutil.Process]:
        me = psutil.Process()
        kids = me.children(recursive=True)
        own_sid = os.getsid(0)
        sessions = set()
        for p in kids:
            try:
                sessions.add(os.getsid(p.pid))
            except OSError:
                pass
        sessions.discard(own_sid)
        seen = {p.pid for p in kids} | {me.pid}
        for p in psutil.process_iter():
            try:
                if p.pid not in seen and os.getsid(p.pid) in sessions:
                    kids.append(p)
                    seen.add(p.pid)
            except OSError:
                pass
        return kids

    def sample(self) -> None:
        rss = pss = 0
        parts: Counter = Counter()
        procs = self.tree()
        for p in procs:
            try:
                info = p.memory_full_info()
                argv = p.cmdline()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
            parts[role(argv)] += info.rss
        self.samples += 1
        self.peak_pss = max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, len(procs))
        if rss > self.peak_rss:
            self.peak_rss, self.breakdown = rss, parts

    def run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> MemorySampler:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def phases(run_dir: Path) -> dict[str, object]:
    """Where the run's time went, from metrics.jsonl (`time` = seconds since the ServerApp started):
    the initial state, round 0's federated evaluation, each training round (from the end of the
    previous round, its server evaluation included, to its last train reply) and the final
    federated + server evaluation."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    init = float(summary.get("initial-state-seconds", 0.0))
    end: dict[int, float] = {0: init}
    trained: dict[int, float] = {}
    for row in rows:
        r, t = row.get("round"), row.get("time")
        if not isinstance(r, int) or not isinstance(t, int | float):
            continue
        end[r] = max(end.get(r, 0.0), float(t))
        if row.get("phase") == "train" and r > 0:
            trained[r] = max(trained.get(r, 0.0), float(t))
    last = max(end)
    rounds = [trained[r] - end[r - 1] for r in sorted(trained)]
    return {
        "initial-state": init,
        "round-0 evaluation": end[0] - init,
        "rounds": rounds,
        "final evaluation": end[last] - trained.get(last, end[last]),
        "run seconds": float(summary["seconds"]),
        "started-at": float(summary["started-at"]),
    }


def overrides(args: argparse.Namespace, model_dir: Path) -> str:
    max_train = args.examples_per_client * math.ceil(args.clients / len(SOURCES.split(",")))
    values = {
        "method": "fedit",
        "model-name": str(model_dir),
        "client-data": SOURCES,
        "partitioner": "by-source",
        "num-server-rounds": args.rounds,
        "fraction-train": args.fraction,
        "fraction-evaluate": args.fraction,
        "local-steps": args.steps,
        "batch-size": 2,
        "seq-len": 64,
        "lora-rank": 4,
        "lora-alpha": 8.0,
        "max-train-examples": max_train,
        "val-examples": 4,
        "test-examples": 8,
        "eval-batch-size": 8,
        "eval-ppl-tokens": 128,
        "ppl-window": 64,
        "ppl-stride": 64,
        "torch-threads": 1,
        "run-tag": f"bench-scale-{args.clients}",
    }
    return " ".join(f"{k}={json.dumps(v)}" for k, v in values.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--clients", type=int, default=100, help="virtual SuperNodes (num-supernodes)"
    )
    parser.add_argument(
        "--fraction", type=float, default=0.1, help="fraction-train and fraction-evaluate"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="server rounds (default: %(default)s)"
    )
    parser.add_argument(
        "--steps", type=int, default=2, help="local LoRA steps (batch 2, 64 tokens)"
    )
    parser.add_argument(
        "--examples-per-client",
        type=int,
        default=8,
        help="training examples of each client (default: %(default)s)",
    )
    parser.add_argument("--cpus-per-client", type=int, default=1, help="client-resources-num-cpus")
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600,
        help="seconds before the run is stopped (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    model_dir = tiny_model_dir()
    federation = f"num-supernodes={args.clients} client-resources-num-cpus={args.cpus_per_client}"
    print(
        f"[bench-scale] {args.clients} SuperNodes, {args.fraction:g} sampled per round, "
        f"{args.rounds} rounds, tiny LLaMA at {model_dir}; federation: {federation}",
        flush=True,
    )
    start, start_epoch = time.perf_counter(), time.time()
    with MemorySampler() as mem:
        launched = launch.launch(
            [overrides(args, model_dir)], federation, timeout=args.timeout, quiet=True
        )
    wall = time.perf_counter() - start
    run_dir = launched.run_dir
    summary = (
        json.loads((run_dir / "summary.json").read_text())
        if run_dir and (run_dir / "summary.json").is_file()
        else {}
    )
    times = phases(run_dir) if summary.get("status") == "completed" else {}
    rounds = list(times.get("rounds", []))
    per_round = sum(rounds) / len(rounds) if rounds else float("nan")
    statuses = Counter()
    if run_dir and (run_dir / "metrics.jsonl").is_file():
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row.get("phase") == "train":
                statuses[row.get("status", "?")] += 1
    print("\n| clients | fraction | rounds | wall s | peak RSS GiB | peak PSS GiB | per-round s |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {args.clients} | {args.fraction:g} | {args.rounds} | {wall:.1f} | "
        f"{mem.peak_rss / GIB:.2f} | {mem.peak_pss / GIB:.2f} | {per_round:.1f} |"
    )
    print(
        f"\nrun status: {launched.status}; summary.json: {summary.get('status', 'missing')}; "
        f"train replies: {dict(statuses)}"
    )
    if times:
        startup = float(times["started-at"]) - start_epoch
        teardown = wall - startup - float(times["run seconds"])
        print(
            f"wall time: start-up (SuperLink, SuperExec, ServerApp process) {startup:.1f} s | "
            f"ServerApp: initial state {times['initial-state']:.1f} s, round-0 evaluation "
            f"{times['round-0 evaluation']:.1f} s, training rounds {[round(x, 1) for x in rounds]} "
            f"s, final evaluation {times['final evaluation']:.1f} s | stop and clean-up "
            f"{teardown:.1f} s"
        )
    print(
        f"memory: peak {mem.peak_procs} processes, {mem.samples} samples; RSS at the peak: "
        + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in mem.breakdown.most_common())
    )
    print(f"run directory: {run_dir}")
    return 0 if summary.get("status") == "completed" and launched.code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
