"""A whole run (server_app.main on a LocalGrid, tiny model, FedIT) with one misbehaving client: its
identity reply is malformed, its train replies carry an array whose bytes are not the shape they
declare and a metric named `phase`, its evaluate replies another client's partition id. The run
completes, marks that client, and everything else (the global adapter, the other clients' scores)
is exactly what the run gives when that client's replies are plain errors."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, MessageType, MetricRecord, RecordDict

from tests.conformance.test_reliability import rows, summary
from tests.conftest import small_config
from tests.local_grid import LocalGrid, run_server

BAD = 1  # the misbehaving partition


def misbehave(msg: object, content: RecordDict) -> RecordDict:
    """What partition BAD sends instead of its honest reply."""
    kind = msg.metadata.message_type  # type: ignore[attr-defined]
    out = RecordDict(dict(content.items()))
    metrics = dict(content.metric_records.get("metrics", MetricRecord()))
    if kind == MessageType.QUERY:
        out["metrics"] = MetricRecord({**metrics, "resources": [0.5]})
    elif kind == MessageType.TRAIN:
        record = content.array_records["arrays"]
        first = next(iter(record.keys()))
        buffer = io.BytesIO()
        np.save(buffer, np.full(1, 1e3, np.float32))  # one value, declared as the whole tensor
        lying = Array(
            dtype="float32",
            shape=tuple(record[first].shape),
            stype=record[first].stype,
            data=buffer.getvalue(),
        )
        out["arrays"] = ArrayRecord({k: lying if k == first else v for k, v in record.items()})
        out["metrics"] = MetricRecord({**metrics, "phase": 1.0})
    elif kind == MessageType.EVALUATE:
        out["metrics"] = MetricRecord({**metrics, "partition-id": 0})
    return out


def _final_adapter(run: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(run / "adapter" / "adapter_model.safetensors"))


def test_one_misbehaving_client_is_marked_and_changes_nothing_else(
    tiny_model_dir: Path, tmp_path: Path, flower_ids: None
) -> None:
    settings = {"num_server_rounds": 2, "fraction_train": 1.0, "fraction_evaluate": 1.0}
    cfg = small_config(tiny_model_dir, output_dir=str(tmp_path / "bad"), **settings)
    bad_run, err = run_server(cfg, LocalGrid(cfg, 3, seed=0, tamper={BAD: misbehave}))
    assert err is None, err
    ref_cfg = cfg.replace(output_dir=str(tmp_path / "ref"))
    grid = LocalGrid(ref_cfg, 3, seed=0)
    grid.failing = {n for n, c in grid.contexts.items() if c.node_config["partition-id"] == BAD}
    ref_run, err = run_server(ref_cfg, grid)
    assert err is None, err

    out, ref = summary(bad_run), summary(ref_run)
    assert out["status"] == "completed"
    dropped = out["dropped-replies"]  # train rounds 1-2, evaluate rounds 0 and 2
    assert [(d["phase"], d["round"]) for d in dropped] == [
        (d["phase"], d["round"]) for d in ref["dropped-replies"]
    ]
    assert len(dropped) == 4 and {d["node"] for d in dropped} == {d["node"] for d in dropped[:1]}
    assert any("declares" in d["problem"] and "but holds (1,)" in d["problem"] for d in dropped)
    assert any("partition-id 0, which connected node" in d["problem"] for d in dropped)
    # the one marked row is that node's (its identity was refused), as when it simply failed
    marked = [c["client"] for c in out["clients"] if c["status"] != "ok"]
    assert (
        marked == [c["client"] for c in ref["clients"] if c["status"] != "ok"] and len(marked) == 1
    )
    assert {r["phase"] for r in rows(bad_run)} == {r["phase"] for r in rows(ref_run)}

    a, b = _final_adapter(bad_run), _final_adapter(ref_run)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    def scores(run: Path) -> list[tuple]:
        return sorted(
            (r["round"], r["client"], r.get("acc"), r.get("ppl"))
            for r in rows(run)
            if r["phase"] == "evaluate" and r.get("status") == "ok"
        )

    assert scores(bad_run) == scores(ref_run) and scores(bad_run)
