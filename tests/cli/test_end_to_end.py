"""One real `flwr run` (Ray simulation) on the tiny model, through the launcher that `make run` uses.

Client 1's data file is broken, so its ClientApp raises every time: the run must still complete, on
client 0's updates alone, and leave the run directory behind. The SuperLink and everything it started
must be gone afterwards. (The launcher's preflight refuses such a file before Flower starts, see
test_preflight.py; this test turns that check off to see a real ClientApp fail inside the run.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fedprune_cli import launch
from fedprune_cli.processes import superlink_family


@pytest.fixture()
def flwr_env(monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = str(Path(os.sys.executable).parent)
    monkeypatch.setenv("PATH", venv_bin + os.pathsep + os.environ["PATH"])


def test_flwr_run_completes_despite_a_failing_client(tiny_model_dir: Path, tmp_path: Path, flwr_env: None) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"question": f"Is {i} even?", "choices": ["yes", "no"], "label": i % 2}) + "\n"
                            for i in range(40)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"unexpected": i}) + "\n" for i in range(40)))
    overrides = (f"model-name='{tiny_model_dir}' client-data='{good},{bad}' num-server-rounds=2 local-steps=2 "
                 "batch-size=2 test-examples=6 val-examples=2 max-train-examples=16 eval-ppl-tokens=128 "
                 f"ppl-window=64 ppl-stride=64 seq-len=64 lora-rank=4 eval-every=1 output-dir='{tmp_path / 'out'}'")
    launched = launch.launch([str(Path(__file__).resolve().parents[2] / "conf" / "fedit.toml"), overrides],
                             "num-supernodes=2 client-resources-num-cpus=1", timeout=600, quiet=True, check_data=False)
    run_dir = launched.run_dir
    assert launched.code == 0 and launched.status == "finished:completed" and run_dir is not None
    for name in ("config.json", "metrics.jsonl", "summary.json", "results.md", "adapter/adapter_config.json",
                 "adapter/adapter_model.safetensors"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "plots").glob("*.png"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["artefacts"] == {"adapter": "adapter"}
    assert json.loads((run_dir / "config.json").read_text())["lora-rank"] == 4
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert {r["round"] for r in train} == {1, 2}
    assert {r["status"] for r in train if r["client"] == 0} == {"accepted"}
    assert {r["status"] for r in train if r["client"] is None} == {"rejected"}  # the broken client
    assert all("matches no known schema" in r["problem"] for r in train if r["status"] == "rejected")
    evaluated = {(r["round"], r["client"]) for r in rows if r["phase"] == "evaluate" and r["status"] == "ok"}
    assert evaluated == {(0, 0), (1, 0), (2, 0)}
    assert [r["round"] for r in rows if r["phase"] == "server-evaluate"] == [0, 1, 2]
    assert "| 0 | `" in (run_dir / "results.md").read_text()
    assert not superlink_family(launched.port), "the SuperLink and what it started must be stopped"
