"""Embedded assets: the once-only build under concurrency, and the converted SmolLM2 on disk."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest

from fedprune_app.llm.assets import build_once, embedded_model_dir


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
def test_embedded_smollm2_perplexity_on_wikipedia_matches_the_reference() -> None:
    """REFERENCES.md measured 17-26 on Wikipedia paragraphs."""
    from fedprune_app.core.config import RunConfig
    from fedprune_app.llm.evaluation import held_out_text, perplexity
    from fedprune_app.llm.models import load_base_model, load_tokenizer

    cfg = RunConfig.from_flower({})
    ppl = perplexity(
        load_base_model("embedded"),
        load_tokenizer("embedded"),
        held_out_text("squad_shifts:squaddev", cfg),
        256,
        256,
        2048,
    )
    assert 12 < ppl < 35


def test_download_from_an_html_simple_index_checks_the_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functools
    import hashlib
    import http.server
    import threading

    from fedprune_app.llm.assets import AssetError, _download_from_index

    payload = b"sdist bytes"
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "pkg-1.0.tar.gz").write_bytes(payload)
    (tmp_path / "simple" / "pkg").mkdir(parents=True)
    good = hashlib.sha256(payload).hexdigest()
    (tmp_path / "simple" / "pkg" / "index.html").write_text(
        f'<html><body><a href="../../files/pkg-1.0.tar.gz#sha256={good}">pkg-1.0.tar.gz</a><br/>'
        f'<a href="../../files/pkg-1.0.tar.gz#sha256={"0" * 64}" '
        'data-x="y">pkg-bad.tar.gz</a></body></html>'
    )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{server.server_address[1]}/simple")
        _download_from_index("pkg", "pkg-1.0.tar.gz", tmp_path / "out")
        assert (tmp_path / "out").read_bytes() == payload
        with pytest.raises(AssetError, match="sha256"):
            _download_from_index("pkg", "pkg-bad.tar.gz", tmp_path / "out2")
        with pytest.raises(AssetError, match="not listed"):
            _download_from_index("pkg", "pkg-2.0.tar.gz", tmp_path / "out3")
    finally:
        server.shutdown()
