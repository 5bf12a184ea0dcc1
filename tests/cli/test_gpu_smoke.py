"""GPU readiness: one short run of every method on the tiny model through the launcher, with
run-config `device=cuda` and federation `client-resources-num-gpus=1` (docs/scale.md, "Checking a
GPU machine").

Why a completed run proves the model ran on CUDA: `device=cuda` is strict, so any process that loads
a model (the ServerApp, each ClientApp) without a visible CUDA device raises ConfigError at load and
the run fails (tests/llm/test_device.py::test_asking_for_cuda_without_cuda_fails_at_load), and
`client-resources-num-gpus=1` gives Ray no actor to run a ClientApp unless it sees a GPU. A tensor
left on the CPU beside a CUDA one (a mask, a generator's input, a Hessian, a LoRA delta) raises in
that method's code, and the client's reply is then rejected: every train reply must be accepted. The
test also watches the GPU's used memory while the run goes on: it must rise above what it was before
by at least one CUDA context. Skipped where torch sees no GPU (the CPU wheel `make setup` installs,
or no GPU), unless FEDPRUNE_GPU_REHEARSAL=1: then the same runs go on the CPU (`device='cpu'`, no
GPU resources), to check the configs themselves on a machine without a GPU.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest
import torch

from fedprune_cli import launch

ROOT = Path(__file__).resolve().parents[2]
REHEARSAL = os.environ.get("FEDPRUNE_GPU_REHEARSAL") == "1"
DEVICE = "cpu" if REHEARSAL else "cuda"
FEDERATION = (
    "num-supernodes=2 client-resources-num-cpus=1 "
    f"client-resources-num-gpus={0 if REHEARSAL else 1}"
)
MIN_RISE = 200 * 2**20  # bytes: less than one CUDA context (~0.3-0.5 GiB) of one other process
# method: (the kind of records its clients train on, its own overrides on top of the tiny ones).
# Methods that collect statistics in round 1 (fedflap, LLM-Pruner, SliceGPT) run 2 rounds so that
# LoRA also trains on the GPU.
METHODS: dict[str, tuple[str, str]] = {
    "fedit": ("choice", ""),
    "flexlora": ("instruction", "flexlora-ranks='2,4' gen-max-new-tokens=4"),
    "fedtpa": ("instruction", "fedtpa-warmup-steps=1 gen-max-new-tokens=4"),
    "sftp": ("choice", "keep-ratios='0.5'"),
    "fedflap": ("choice", "num-server-rounds=2 keep-ratios='0.5' fedflap-batches=2"),
    "llmpruner": (
        "choice",
        "num-server-rounds=2 llmpruner-keep-ratio=0.5 llmpruner-batches=2 "
        "llmpruner-layer-start=0 llmpruner-layer-end=2",
    ),
    "slicegpt": ("choice", "num-server-rounds=2 slicegpt-keep-ratio=0.75 slicegpt-batches=2"),
    "fedspallm": ("text", "calib-segments=4 calib-seq-len=32 sparsegpt-blocksize=32 sparsity=0.5"),
}


def records(kind: str, n: int = 40) -> list[dict[str, object]]:
    if kind == "choice":
        return [
            {"question": f"Is {i} even?", "choices": ["yes", "no"], "label": i % 2}
            for i in range(n)
        ]
    if kind == "instruction":
        return [{"instruction": f"Add {i} and {i}.", "output": str(2 * i)} for i in range(n)]
    return [
        {"text": f"Paragraph {i}: the river runs past the old mill and the town of number {i}."}
        for i in range(n)
    ]


def gpu_run_config(model_dir: Path, tmp_path: Path, method: str = "fedit") -> list[str]:
    """conf/<method>.toml, 1 round (2 with a statistics round), small splits, two JSONL clients, on
    `DEVICE`; the method's own overrides last (later wins). Server-side evaluation: the embedded
    data where the preset scores it, else the clients' file."""
    kind, extra = METHODS[method]
    data = tmp_path / f"{kind}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records(kind)))
    server_eval = f"server-eval-data='{data}' " if kind != "choice" else ""
    return [
        str(ROOT / "conf" / f"{method}.toml"),
        f"model-name='{model_dir}' client-data='{data},{data}' partitioner='by-source' "
        f"device='{DEVICE}' num-server-rounds=1 local-steps=2 batch-size=2 test-examples=6 "
        "val-examples=2 max-train-examples=16 eval-ppl-tokens=128 ppl-window=64 ppl-stride=64 "
        "seq-len=64 lora-rank=4 eval-every=1 torch-threads=0 "
        f"{server_eval}output-dir='{tmp_path / 'out'}'",
        *([extra] if extra else []),
    ]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_gpu_run_config_passes_the_launchers_checks(
    method: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On any machine: the keys and values each GPU run uses are accepted before anything starts
    (the machine's GPU count, which the launcher compares with client-resources-num-gpus, is faked
    here)."""
    monkeypatch.setattr("fedprune_cli.preflight.visible_gpus", lambda: 1)
    values = launch.checked_config(
        launch.APP_DIR, gpu_run_config(tiny_model_dir, tmp_path, method), FEDERATION
    )
    assert values["device"] == DEVICE and values["method"] == method
    assert launch.parse_overrides(FEDERATION, "--federation-config")[
        "client-resources-num-gpus"
    ] == (not REHEARSAL)


class GpuMemoryWatch(threading.Thread):
    """The device-wide used memory of GPU 0 (`torch.cuda.mem_get_info`), its peak sampled every
    0.2 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.baseline = self.used()
        self.peak = self.baseline

    @staticmethod
    def used() -> int:
        if REHEARSAL:
            return 0
        free, total = torch.cuda.mem_get_info(0)
        return total - free

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.peak = max(self.peak, self.used())


@pytest.mark.slow
@pytest.mark.skipif(
    not torch.cuda.is_available() and not REHEARSAL,
    reason="no CUDA device visible to torch (a CPU-only machine, or torch's CPU wheel); "
    "FEDPRUNE_GPU_REHEARSAL=1 runs the same configs on the CPU",
)
@pytest.mark.parametrize("method", list(METHODS))
def test_each_method_runs_on_the_gpu(
    method: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    watch = GpuMemoryWatch()
    watch.start()
    try:
        launched = launch.launch(
            gpu_run_config(tiny_model_dir, tmp_path, method), FEDERATION, timeout=900, quiet=True
        )
    finally:
        watch.done.set()
        watch.join()
    assert (
        launched.code == 0
        and launched.status == "finished:completed"
        and launched.run_dir is not None
    )
    summary = json.loads((launched.run_dir / "summary.json").read_text())
    config = json.loads((launched.run_dir / "config.json").read_text())
    assert (
        summary["status"] == "completed"
        and config["device"] == DEVICE
        and config["method"] == method
    )
    rows = [
        json.loads(line) for line in (launched.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in rows if r["phase"] == "train"]
    assert train and {r["status"] for r in train} == {"accepted"}, [r.get("problem") for r in train]
    assert len(train) == 2 * config["num-server-rounds"]
    if not REHEARSAL:
        assert watch.peak - watch.baseline >= MIN_RISE, (
            f"GPU 0's used memory rose by {(watch.peak - watch.baseline) / 2**20:.0f} MiB only "
            "during the run"
        )
