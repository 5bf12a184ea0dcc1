"""A benchmark record (docs/bench/*.json): started with the command that writes it again, the date,
the machine (cores, CPU features, torch) and the load average, finished with its figures. Every
benchmark and experiment writes its record through `start_record` / `finish_record`;
`benchmarks.render` turns records into the markdown the docs carry."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "docs" / "bench"

Record = dict[str, Any]


def command_of(module: str, args: Sequence[str]) -> str:
    """The command that writes a record again: `fedprune bench <name> <args>` for a standing
    benchmark (benchmarks/<name>.py), `python -m <module> <args>` for an experiment."""
    head = (
        ["fedprune", "bench", module.split(".", 1)[1]]
        if module.startswith("benchmarks.")
        else ["python", "-m", module]
    )
    return shlex.join([*head, *args])


def start_record(
    kind: str, module: str, argv: Sequence[str] | None = None, note: str = ""
) -> Record:
    """A record's header: its kind (a renderer's name), the command (`command_of`), date, machine
    facts and the load average now."""
    import torch

    args = list(sys.argv[1:] if argv is None else argv)
    _sample_load()
    caps = {k: os.environ[k] for k in ISA_CAP_VARIABLES if os.environ.get(k)}
    command = command_of(module, args)
    return {
        "kind": kind,
        # run under an instruction-set cap (`ISA_CAP_VARIABLES`): the command carries it
        "command": " ".join([*(f"{k}={shlex.quote(v)}" for k, v in caps.items()), command]),
        **({"isa-environment": caps} if caps else {}),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "note": note,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "cpu-features": cpu_features(),
        "torch": torch.__version__,
        "load-average": {"start": list(os.getloadavg())},
        "_t0": time.perf_counter(),
    }


# the instruction sets that decide how fast a CPU trains and runs a model here, as /proc/cpuinfo
# spells them, with the names the docs use
CPU_FEATURES = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_bf16": "AVX512_BF16",
    "amx_bf16": "AMX",
}


# the environment variables that cap the instruction sets oneDNN, MKL and ATen use
# (`fedprune bench profile --isa`); a record started under one says so
ISA_CAP_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY")


def cpu_features(cpuinfo: str | None = None) -> list[str]:
    """The CPU's matmul instruction sets (`CPU_FEATURES`) from /proc/cpuinfo's first `flags` line;
    [] where there is none (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    lines = cpuinfo.splitlines()
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return [name for flag, name in CPU_FEATURES.items() if flag in flags]


_LOAD_SAMPLES: list[float] = []


def _sample_load(every: float = 30.0) -> None:
    """The 1-minute load average every `every` s in a daemon thread, for the record's min / max over
    the run."""

    def loop() -> None:
        while True:
            _LOAD_SAMPLES.append(os.getloadavg()[0])
            time.sleep(every)

    threading.Thread(target=loop, daemon=True).start()


def finish_record(record: Record, out: str | Path | None) -> Record:
    """Adds the load average at the end (and the min / max of the 1-minute load sampled every 30 s
    during the run) and the tool's wall seconds; writes the record to `out` ('' = not)."""
    record["load-average"]["end"] = list(os.getloadavg())
    if _LOAD_SAMPLES:
        record["load-average"]["1min-range"] = [min(_LOAD_SAMPLES), max(_LOAD_SAMPLES)]
    record["seconds"] = round(time.perf_counter() - record.pop("_t0"), 1)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {out}", flush=True)
    return record


def shown_command(record: Record) -> str:
    """The record's command without its `--note` (free text, kept in the record's "note")."""
    args = shlex.split(record["command"])
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--note":
            skip = True
        elif not arg.startswith("--note="):
            out.append(arg)
    return shlex.join(out)


def load_line(record: Record) -> str:
    """'load average 3.1 → 4.2 on 2 cores (AVX-512, AMX), 2026-11-25': the 1-minute load at start
    and end; the CPU's features where the record has them (`cpu_features`)."""
    load = record["load-average"]
    cores = f"{record['cpus']} cores" + (
        f" ({', '.join(record['cpu-features'])})" if record.get("cpu-features") else ""
    )
    if record.get("isa-caps"):  # `fedprune bench profile --isa`
        cores += ", instruction sets capped per column (`--isa`)"
    if record.get("isa-environment"):
        caps = ", ".join(f"{k}={v}" for k, v in record["isa-environment"].items())
        cores += f", capped by {caps}"
    if (
        load.get("start") is None
    ):  # a record whose header was written after its run (its note says why)
        return (
            f"load average not sampled at the start, {load['end'][0]:.1f} at the end on "
            f"{cores}, {record['date'][:10]}"
        )
    during = (
        f" (1-minute load {load['1min-range'][0]:.1f}–{load['1min-range'][1]:.1f} during the run)"
        if "1min-range" in load
        else ""
    )
    return (
        f"load average {load['start'][0]:.1f} → {load['end'][0]:.1f}{during} on {cores}, "
        f"{record['date'][:10]}"
    )
