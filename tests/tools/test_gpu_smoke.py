"""GPU readiness: one FedIT round on the tiny model through the launcher, with run-config `device=cuda` and federation
`client-resources-num-gpus=1` (docs/scale.md, "GPUs").

Why a completed run proves the model ran on CUDA: `device=cuda` is strict, so any process that loads a model (the
ServerApp, each ClientApp) without a visible CUDA device raises ConfigError at load and the run fails
(tests/llm/test_device.py::test_asking_for_cuda_without_cuda_fails_at_load), and `client-resources-num-gpus=1` gives
Ray no actor to run a ClientApp unless it sees a GPU. The test also watches the GPU's used memory while the run goes
on: it must rise above what it was before by at least one CUDA context. Skipped where torch sees no GPU (the CPU
wheel `make setup` installs, or no GPU); the config it uses is checked on every machine.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest
import torch

from tools import launch

ROOT = Path(__file__).resolve().parents[2]
FEDERATION = "num-supernodes=2 client-resources-num-cpus=1 client-resources-num-gpus=1"
MIN_RISE = 200 * 2**20  # bytes: less than one CUDA context (~0.3-0.5 GiB) of one other process


def gpu_run_config(model_dir: Path, tmp_path: Path) -> list[str]:
    """conf/fedit.toml, 1 round, small splits, two JSONL clients, everything on `cuda`."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": f"Is {i} even?", "choices": ["yes", "no"], "label": i % 2}) + "\n"
                            for i in range(40)))
    return [str(ROOT / "conf" / "fedit.toml"),
            f"model-name='{model_dir}' client-data='{data},{data}' device='cuda' num-server-rounds=1 local-steps=2 "
            "batch-size=2 test-examples=6 val-examples=2 max-train-examples=16 eval-ppl-tokens=128 ppl-window=64 "
            f"ppl-stride=64 seq-len=64 lora-rank=4 eval-every=1 output-dir='{tmp_path / 'out'}'"]


def test_the_gpu_run_config_passes_the_launchers_checks(tiny_model_dir: Path, tmp_path: Path) -> None:
    """On any machine: the keys and values the GPU test uses are accepted before anything starts (a GPU is only
    needed when the model loads)."""
    values = launch.checked_config(launch.APP_DIR, gpu_run_config(tiny_model_dir, tmp_path), FEDERATION)
    assert values["device"] == "cuda" and values["num-server-rounds"] == 1 and values["method"] == "fedit"
    assert launch.parse_overrides(FEDERATION, "--federation-config")["client-resources-num-gpus"] == 1


class GpuMemoryWatch(threading.Thread):
    """The device-wide used memory of GPU 0 (`torch.cuda.mem_get_info`), its peak sampled every 0.2 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.baseline = self.used()
        self.peak = self.baseline

    @staticmethod
    def used() -> int:
        free, total = torch.cuda.mem_get_info(0)
        return total - free

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.peak = max(self.peak, self.used())


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device visible to torch (a CPU-only machine, or torch's CPU wheel)")
def test_one_fedit_round_on_the_gpu(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    watch = GpuMemoryWatch()
    watch.start()
    try:
        launched = launch.launch(gpu_run_config(tiny_model_dir, tmp_path), FEDERATION, timeout=900, quiet=True)
    finally:
        watch.done.set()
        watch.join()
    assert launched.code == 0 and launched.status == "finished:completed" and launched.run_dir is not None
    summary = json.loads((launched.run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and json.loads(
        (launched.run_dir / "config.json").read_text())["device"] == "cuda"
    rows = [json.loads(line) for line in (launched.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["status"] for r in rows if r["phase"] == "train"} == {"accepted"}
    assert len([r for r in rows if r["phase"] == "train"]) == 2
    assert watch.peak - watch.baseline >= MIN_RISE, (
        f"GPU 0's used memory rose by {(watch.peak - watch.baseline) / 2**20:.0f} MiB only during the run")
