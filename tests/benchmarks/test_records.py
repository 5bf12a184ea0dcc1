"""Every published benchmark table has its record: the docs' tables between
`<!-- bench:<kind> <record> -->` and `<!-- /bench:<kind> -->` are re-rendered from the committed
records (docs/bench/*.json, benchmarks/render.py) and must equal the markdown in docs/; each record
names the command that wrote it and the machine's load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from benchmarks import render as render_bench
from benchmarks.records import ISA_CAP_VARIABLES
from experiments.probes.sftp.mask_rounding import saved_kept

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = {  # (doc, kind): the tables that must come from records
    ("docs/methods/fedspallm.md", "pruning"),
    ("docs/methods/fedspallm.md", "aggregation-memory"),
    ("docs/scale.md", "overhead"),
    ("docs/notes/2026-11-sftp-investigations.md", "budget-trajectory"),
    ("docs/notes/2026-11-sftp-investigations.md", "mask-rounding"),
}


def test_docs_tables_equal_their_records_rendered() -> None:
    assert render_bench.check() == []


@pytest.mark.parametrize(("doc", "kind"), sorted(PUBLISHED))
def test_each_published_table_is_marked(doc: str, kind: str) -> None:
    kinds = {k for k, *_ in render_bench.blocks((ROOT / doc).read_text())}
    assert kind in kinds, f"{doc} has no <!-- bench:{kind} ... --> block"


def marked_records() -> list[str]:
    names = {
        n
        for path in render_bench.doc_files()
        for _, ns, *_ in render_bench.blocks(path.read_text())
        for n in ns
    }
    return sorted(names)


@pytest.mark.parametrize("name", marked_records())
def test_every_record_names_its_command_date_and_load(name: str) -> None:
    record = json.loads((render_bench.BENCH_DIR / name).read_text())
    words = record["command"].split()
    caps = [w for w in words if w.split("=")[0] in ISA_CAP_VARIABLES]
    assert words[: len(caps)] == caps  # a cap it ran under leads the command (isa-environment)
    assert dict(w.split("=", 1) for w in caps) == record.get("isa-environment", {})
    words = words[len(caps) :]
    if words[:2] == ["fedprune", "bench"]:  # a standing benchmark, by the command that runs it
        assert (ROOT / "benchmarks" / f"{words[2]}.py").is_file()
    else:  # an experiment of experiments/, by its module
        assert words[:2] == ["python", "-m"] and words[2].startswith("experiments.")
        assert (ROOT / (words[2].replace(".", "/") + ".py")).is_file()
    if "--out" in words:  # the command writes this record again, not a scratch copy
        assert words[words.index("--out") + 1] == f"docs/bench/{name}"
    start = record["load-average"][
        "start"
    ]  # None only where the header was written after the run, and said so
    assert len(start) == 3 if start is not None else "not sampled" in record["note"]
    assert len(record["load-average"]["end"]) == 3
    assert record["cpus"] >= 1 and record["date"][:2] == "20" and record["seconds"] >= 0


def test_the_cpu_features_are_read_from_cpuinfo_and_shown_in_the_load_line() -> None:
    cpuinfo = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
    assert render_bench.cpu_features(cpuinfo) == ["AVX2", "AVX-512", "AVX512_BF16", "AMX"]
    assert render_bench.cpu_features("flags\t: fpu sse2 avx2\n") == ["AVX2"]
    assert render_bench.cpu_features("") == []
    record = {
        "cpus": 2,
        "date": "2026-12-02 11:33:08",
        "cpu-features": ["AVX2", "AVX-512"],
        "load-average": {"start": [1.0, 1.0, 1.0], "end": [2.0, 1.5, 1.2]},
    }
    assert render_bench.load_line(record) == (
        "load average 1.0 → 2.0 on 2 cores (AVX2, AVX-512), 2026-12-02"
    )
    del record["cpu-features"]  # records from before the field: as they were rendered
    assert render_bench.load_line(record).endswith("on 2 cores, 2026-12-02")


def test_a_changed_figure_is_caught_and_rewritten(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    body = render_bench.dated_links(
        render_bench.render("pruning", ["pruning.json"]), ["pruning.json"], doc
    )
    assert "](" in body.split("\n")[-1]  # the record's date is a link to it
    doc.write_text(
        f"intro\n\n<!-- bench:pruning pruning.json -->\n{body}\n<!-- /bench:pruning -->\n\nafter\n"
    )
    assert render_bench.check([doc]) == []
    first_figure = body.split("\n")[2].split("|")[2]  # sparsegpt's total seconds
    doc.write_text(doc.read_text().replace(first_figure, " 0.5 ", 1))
    assert len(render_bench.check([doc])) == 1
    render_bench.check([doc], write=True)
    assert render_bench.check([doc]) == [] and doc.read_text().endswith(
        "<!-- /bench:pruning -->\n\nafter\n"
    )


def test_a_block_without_its_closing_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="closing"):
        render_bench.blocks("<!-- bench:pruning pruning.json -->\n| a |\n")


def _record(**fields: object) -> dict[str, object]:
    return {
        "command": "python -m experiments.x",
        "date": "2026-11-25 06:00:00",
        "cpus": 2,
        "load-average": {"start": [1.0, 1.0, 1.0], "end": [3.0, 2.0, 1.0]},
        **fields,
    }


def test_overhead_rendering_computes_ratios_and_overhead() -> None:
    rec = _record(
        clients=4,
        steps=5,
        flwr="1.42.0",
        flower={"total": 200.0, "startup": 20.0, "rounds": [50, 33, 33]},
        plain={"total": 100.0, "rounds": [40, 30, 30]},
        **{"steady-round": {"flower": 33.0, "plain": 30.0}},
    )
    text = render_bench.overhead([rec])
    assert "| wall time, whole job | 200.0 s | 100.0 s | 2.00 |" in text
    assert "| round 1 (actors load the model) | 50.0 s | 40.0 s | 1.25 |" in text
    assert "| steady round (mean of rounds 2..3) | 33.0 s | 30.0 s | 1.10 |" in text
    assert "**+10.0%**" in text and "load average 1.0 → 3.0 on 2 cores" in text


def test_saved_masks_kept_ratio_counts_the_kept_weights(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """An archived NOC run's deterministic kept ratio equals counting, in the real model, the
    weights each mask keeps: q/k/v/gate/up columns of the input lane, o/down rows of the output
    lane."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    layers, d = model.config.num_hidden_layers, model.config.hidden_size
    rng = np.random.default_rng(0)
    masks = {n: rng.random((layers, d)) < 0.6 for n in ("attn-in", "attn-out", "ffn-in", "ffn-out")}
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "masks.npz", **{f"client-{k}/{n}": m for k in (0, 1) for n, m in masks.items()})
    (run / "config.json").write_text(json.dumps({"model-name": str(tiny_model_dir)}))
    kept = total = 0
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        for lin, mask, dim in (
            (attn.q_proj, "attn-in", 1),
            (attn.k_proj, "attn-in", 1),
            (attn.v_proj, "attn-in", 1),
            (attn.o_proj, "attn-out", 0),
            (mlp.gate_proj, "ffn-in", 1),
            (mlp.up_proj, "ffn-in", 1),
            (mlp.down_proj, "ffn-out", 0),
        ):
            lane = torch.from_numpy(masks[mask][i])
            kept += lin.weight.index_select(dim, lane.nonzero().flatten()).numel()
            total += lin.weight.numel()
    assert saved_kept(run) == pytest.approx(kept / total, rel=1e-9)
    masks_other = dict(masks, **{"attn-in": ~masks["attn-in"]})
    np.savez(
        run / "masks.npz",
        **{f"client-{k}/{n}": m for k, ms in ((0, masks), (1, masks_other)) for n, m in ms.items()},
    )
    with pytest.raises(SystemExit, match="not a NOC run"):
        saved_kept(run)


def test_unknown_kind_or_missing_record_is_reported(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- bench:nosuch pruning.json -->\n<!-- /bench:nosuch -->\n"
        "<!-- bench:pruning no-such-record.json -->\n<!-- /bench:pruning -->\n"
    )
    problems = render_bench.check([doc])
    assert (
        len(problems) == 2
        and "unknown bench kind" in problems[1]
        and "record missing" in problems[0]
    )


def test_the_speed_goal_is_decided_by_the_whole_interval() -> None:
    def row(point: float, lo: float, hi: float) -> dict[str, float]:
        return {
            "prefill-of-ceiling": point,
            "prefill-of-ceiling-lo": lo,
            "prefill-of-ceiling-hi": hi,
        }

    assert render_bench.goal_verdict(row(0.97, 0.951, 0.99), "prefill") == "held"
    assert (
        render_bench.goal_verdict(row(0.96, 0.93, 0.99), "prefill") == "unresolved"
    )  # straddles 0.95
    assert render_bench.goal_verdict(row(0.90, 0.86, 0.949), "prefill") == "not held"
    assert (
        render_bench.goal_verdict({"prefill-of-ceiling": 0.99}, "prefill") == ""
    )  # no interval: no verdict


def test_the_attainable_share_removes_index_ops_and_slow_products_only() -> None:
    """By hand: dense 100 ms (products 60 at 100 GF/s); the model's products 40 ms at 80 GF/s (32 ms
    at the dense rate), 5 ms of gathers, 20 other: bound 32 + 20 = 52 ms, 100 / 52 = 1.923×, of a 2×
    ceiling 0.962."""
    breakdown = {
        "dense": {
            "projections": 60.0,
            "projections GF/s": 100.0,
            "gather/scatter": 0.0,
            "total": 100.0,
        },
        "keep 0.5": {
            "projections": 40.0,
            "projections GF/s": 80.0,
            "gather/scatter": 5.0,
            "total": 65.0,
        },
    }
    assert render_bench.attainable_share(breakdown, "keep 0.5", 2.0) == pytest.approx(100 / 52 / 2)
    assert render_bench.attainable_share(breakdown, "dense", 1.0) == pytest.approx(1.0)


def test_a_record_started_under_an_isa_cap_carries_it_in_its_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A benchmark run with ONEDNN_MAX_CPU_ISA & co. set measured a capped CPU: its command writes
    the record again only with the cap, and its load line says so."""
    from benchmarks.records import finish_record, load_line, shown_command, start_record

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    record = finish_record(start_record("precision", "benchmarks.precision", ["--steps", "2"]), "")
    assert record["isa-environment"] == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    assert shown_command(record) == (
        "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 fedprune bench precision --steps 2"
    )
    assert "capped by ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16" in load_line(record)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    plain = finish_record(start_record("precision", "benchmarks.precision", []), "")
    assert "isa-environment" not in plain and plain["command"] == "fedprune bench precision"
