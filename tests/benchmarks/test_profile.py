"""`fedprune bench profile`: a run's wall time split by phase from its summary.json and
metrics.jsonl rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.profile import PHASES, RUN_DIR_LINE, run_phases, table


def _write(run: Path, rows: list[dict], summary: dict) -> Path:
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_phases_add_up_to_the_rows_times(tmp_path: Path) -> None:
    """Two rounds by hand: set-up 5 s; round 0 ends at 30 s (server scoring 2 s of it); round 1's
    training ends at 70 s, its evaluation at 78 s, its server scoring takes 3 s (ends 81 s); round 2
    trains until 121 s and ends at 131 s with a 4 s server scoring; the stopwatch says 20 s of final
    artefacts."""
    rows = [
        {"time": 28, "round": 0, "phase": "evaluate", "seconds": 10},
        {"time": 30, "round": 0, "phase": "server-evaluate", "seconds": 2},
        {"time": 60, "round": 1, "phase": "train"},
        {"time": 70, "round": 1, "phase": "train"},
        {"time": 78, "round": 1, "phase": "evaluate"},
        {"time": 81, "round": 1, "phase": "server-evaluate", "seconds": 3},
        {"time": 121, "round": 2, "phase": "train"},
        {"time": 131, "round": 2, "phase": "server-evaluate", "seconds": 4},
        {"time": 150, "phase": "compiled"},
    ]
    run = _write(
        tmp_path / "run",
        rows,
        {
            "method": "m",
            "status": "completed",
            "seconds": 160,
            "phase-seconds": {"set-up": 5, "rounds": 126, "final-artefacts": 20, "references": 1},
        },
    )
    phases = run_phases(run)["phases"]
    assert set(phases) == set(PHASES)
    assert phases["set-up"] == 5
    assert phases["start-up + untouched evaluation"] == 30 - 5 - 2
    assert phases["training"] == (70 - 30) + (121 - 81)
    assert phases["client evaluation"] == (81 - 70 - 3) + (131 - 121 - 4)
    assert phases["server evaluation"] == 2 + 3 + 4
    assert (phases["final artefacts"], phases["references"]) == (20, 1)
    assert phases["set-up"] + phases["start-up + untouched evaluation"] + phases[
        "training"
    ] + phases["client evaluation"] + phases["server evaluation"] == pytest.approx(131)


def test_the_table_shows_the_launcher_and_the_wall_time(tmp_path: Path) -> None:
    run = _write(
        tmp_path / "run",
        [{"time": 9, "round": 0, "phase": "evaluate", "seconds": 1}],
        {"method": "fedit", "status": "completed", "seconds": 12, "initial-state-seconds": 2},
    )
    record = {"runs": [run_phases(run)], "wall-seconds": 40.0, "launcher-seconds": 28.0}
    text = table(record)
    assert "| launcher | 28 s |" in text and "**12 s**" in text and "wall time: **40 s**" in text


def test_the_launchers_last_line_names_the_run_directory() -> None:
    line = (
        "[fedprune] flwr run status: finished:completed; run directory: "
        "outputs/20261202-010101-sftp\n"
    )
    assert RUN_DIR_LINE.search(line)["path"] == "outputs/20261202-010101-sftp"


def test_isa_avx2_caps_the_kernels_a_run_would_use() -> None:
    """`--isa avx2`'s environment, in a fresh interpreter as each ClientApp is: ATen's kernels,
    MKL's float32 GEMM and 'auto' mixed precision act as on a CPU with AVX2 alone."""
    import os
    import subprocess
    import sys

    import torch

    from benchmarks.profile import ISA_CAPS

    if "mkl" not in torch.__config__.show().lower() or not torch.backends.cpu.get_cpu_capability():
        pytest.skip("no MKL in this torch build")
    code = (
        "import torch\n"
        "from fedprune_app.llm.training import autocast_dtype\n"
        "a = torch.ones(8, 8); a @ a\n"
        "print('capability', torch.backends.cpu.get_cpu_capability())\n"
        "print('auto', autocast_dtype('auto', torch.device('cpu')))\n"
    )
    env = {**os.environ, **ISA_CAPS["avx2"], "MKL_VERBOSE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "capability AVX2" in out
    assert "auto None" in out  # float32: bf16 would be emulated
    mkl = next(line for line in out.splitlines() if line.startswith("MKL_VERBOSE oneMKL"))
    assert "AVX2" in mkl and "AVX-512" not in mkl and "AVX512" not in mkl


def test_isa_runs_each_cap_in_turn_and_shows_ratios_to_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--isa native avx2`: one launch per cap, in order, with that cap's environment; each run
    keeps its own wall time and the table divides every phase by the first column's."""
    from benchmarks import profile

    launched: list[str] = []

    def fake_launch(args: list[str], isa: str = "native") -> tuple[float, list[Path], int]:
        launched.append(isa)
        scale = {"native": 1.0, "avx2": 1.5}[isa]
        run = _write(
            tmp_path / isa,
            [
                {"time": 20 * scale, "round": 0, "phase": "evaluate", "seconds": 1},
                {"time": 120 * scale, "round": 1, "phase": "train"},
            ],
            {"method": "sftp", "status": "completed", "seconds": 130 * scale},
        )
        return 150 * scale, [run], 0

    monkeypatch.setattr(profile, "launch", fake_launch)
    out = tmp_path / "record.json"
    code = profile.main(["--isa", "native", "avx2", "--out", str(out), "--", "--run-config", "x"])
    record = json.loads(out.read_text())
    assert code == 0 and launched == ["native", "avx2"]
    assert [r["isa"] for r in record["runs"]] == ["native", "avx2"]
    assert record["isa-caps"]["avx2"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert [r["wall-seconds"] for r in record["runs"]] == [150.0, 225.0]
    assert [r["launcher-seconds"] for r in record["runs"]] == [20.0, 30.0]
    text = table(record)
    assert "| training | 100 s (1.00×) | 150 s (1.50×) |" in text
    assert "| `fedprune run` wall time | **150 s** (1.00×) | **225 s** (1.50×) |" in text


def test_a_cap_is_refused_for_finished_runs() -> None:
    from benchmarks import profile

    with pytest.raises(SystemExit):
        profile.main(["--isa", "avx2", "--from", "outputs/x"])
