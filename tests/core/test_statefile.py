"""State files load without running code: the server checkpoint (safetensors + JSON) and a client's
state (Flower's protobuf RecordDict) round-trip exactly; pickles, foreign and corrupt files are
refused in one line, and a crafted pickle's payload never runs."""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedprune_app.core.checkpoint import load_client_state, save_checkpoint, save_client_state
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.core.statefile import (
    StateFileError,
    read_records,
    read_state,
    write_records,
    write_state,
)


def strategy_like_state() -> dict:
    """What strategies put in a checkpoint: RNG states of random, numpy and torch, int-keyed dicts,
    tuples, numpy scalars and arrays, a bfloat16 tensor, None and NaN."""
    rng = random.Random(3)
    rng.random()
    return {
        "rng": rng.getstate(),
        "numpy-rng": np.random.RandomState(5).get_state(),
        "torch-rng": torch.Generator().manual_seed(7).get_state(),
        "betas": {0: 0.5, 3: np.float32(0.25)},
        "history": [(1, 0.8), (2, 0.7)],
        "masks": {"layer.0": np.arange(6, dtype=np.int8).reshape(2, 3) > 2},
        "bf16": torch.randn(3, 2).to(torch.bfloat16),
        "none": None,
        "nan": float("nan"),
        "empty": {},
    }


def test_a_server_state_round_trips_exactly(tmp_path: Path) -> None:
    state = strategy_like_state()
    write_state(tmp_path / "s.safetensors", state)
    back = read_state(tmp_path / "s.safetensors")
    assert set(back) == set(state)
    again, original = random.Random(), random.Random()
    again.setstate(back["rng"])
    original.setstate(state["rng"])
    assert [again.random() for _ in range(3)] == [original.random() for _ in range(3)]
    numpy_back = np.random.RandomState()
    numpy_back.set_state(back["numpy-rng"])
    assert np.array_equal(numpy_back.rand(4), np.random.RandomState(5).rand(4))
    assert torch.equal(back["torch-rng"], state["torch-rng"])
    assert back["betas"] == {0: 0.5, 3: 0.25} and type(back["betas"][3]) is np.float32
    assert back["history"] == [(1, 0.8), (2, 0.7)]
    assert back["masks"]["layer.0"].dtype == bool and np.array_equal(
        back["masks"]["layer.0"], state["masks"]["layer.0"]
    )
    assert back["bf16"].dtype == torch.bfloat16 and torch.equal(back["bf16"], state["bf16"])
    assert back["none"] is None and np.isnan(back["nan"]) and back["empty"] == {}


def test_what_a_state_file_cannot_hold_is_refused_at_write_time(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match=r"state\['f'\]: a function cannot be stored"):
        write_state(tmp_path / "s.safetensors", {"f": lambda: 0})
    assert not (tmp_path / "s.safetensors").exists()


def test_a_client_state_round_trips_and_keeps_the_newest_rounds(tmp_path: Path) -> None:
    state = RecordDict(
        {
            "embedding": ArrayRecord({"e": Array(np.arange(4, dtype=np.float32))}),
            "client": ConfigRecord({"rounds": 3, "losses": [0.5, 0.25], "name": "k"}),
        }
    )
    for r in range(1, 6):
        save_client_state(tmp_path, r, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round-3.pb", "round-4.pb", "round-5.pb"]
    back = load_client_state(tmp_path, before_round=5)
    assert np.array_equal(back["embedding"]["e"].numpy(), np.arange(4, dtype=np.float32))
    assert dict(back["client"]) == {"rounds": 3, "losses": [0.5, 0.25], "name": "k"}
    assert load_client_state(tmp_path, before_round=3) is None


def crafted_pickle(path: Path, marker: Path) -> None:
    """A pickle whose loading runs a command that creates `marker`."""

    class Payload:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({"round": 1, "payload": Payload()}))


def test_a_crafted_pickle_is_refused_and_its_payload_never_runs(tmp_path: Path) -> None:
    """As a resume checkpoint, as a client state, and renamed to look like a state file: refused
    with one line that names the converter, and the command in it never ran."""
    marker = tmp_path / "ran"
    run = tmp_path / "20260101-000000-fedit"
    (run / "checkpoint").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(RunConfig.from_flower({}).to_dict()))
    crafted_pickle(run / "checkpoint" / "state.pkl", marker)
    from fedprune_app.core.checkpoint import load_checkpoint

    with pytest.raises(
        ConfigError, match="is a pickle written by an older fedprune.*convert_state"
    ):
        load_checkpoint(RunConfig.from_flower({"resume-from": str(run), "num-server-rounds": 3}))
    crafted_pickle(tmp_path / "client" / "round-1.pkl", marker)
    with pytest.raises(StateFileError, match="loading a pickle can run any code"):
        load_client_state(tmp_path / "client", before_round=2)
    crafted_pickle(run / "checkpoint" / "state.safetensors", marker)
    with pytest.raises(ConfigError, match="is not a readable fedprune state file"):
        load_checkpoint(RunConfig.from_flower({"resume-from": str(run), "num-server-rounds": 3}))
    crafted_pickle(tmp_path / "client" / "round-2.pb", marker)
    with pytest.raises(StateFileError, match="is not a readable client state file"):
        read_records(tmp_path / "client" / "round-2.pb")
    assert not marker.exists()


def test_a_safetensors_file_that_is_not_ours_or_of_another_version_is_refused(
    tmp_path: Path,
) -> None:
    from safetensors.numpy import save_file

    save_file({"w": np.zeros(2, np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(StateFileError, match="not a fedprune state file of format 1"):
        read_state(tmp_path / "model.safetensors")
    save_file(
        {}, str(tmp_path / "v9.safetensors"), metadata={"fedprune-state": "9", "skeleton": "null"}
    )
    with pytest.raises(StateFileError, match=r"\(format 9\)"):
        read_state(tmp_path / "v9.safetensors")


def test_a_checkpoint_resumes_from_the_new_file_and_the_converter_upgrades_a_trusted_pickle(
    tmp_path: Path,
) -> None:
    from fedprune_app.core.checkpoint import load_checkpoint
    from fedprune_cli.convert_state import convert

    run = tmp_path / "20260101-000000-fedit"
    run.mkdir()
    cfg = RunConfig.from_flower({"num-server-rounds": 3})
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    arrays = {"lora_A": np.arange(6, dtype=np.float32).reshape(2, 3)}
    save_checkpoint(run, 1, run.name, arrays, strategy_like_state())
    loaded = load_checkpoint(cfg.replace(resume_from=str(run)))
    assert loaded.round == 1 and np.array_equal(loaded.arrays["lora_A"], arrays["lora_A"])
    (run / "checkpoint" / "state.safetensors").rename(run / "checkpoint" / "moved")
    with open(run / "checkpoint" / "state.pkl", "wb") as f:  # what an older version wrote
        pickle.dump(
            {"round": 2, "run-key": run.name, "arrays": arrays, "strategy": {"rng": (1, 2)}}, f
        )
    assert convert(run / "checkpoint" / "state.pkl") == run / "checkpoint" / "state.safetensors"
    assert load_checkpoint(cfg.replace(resume_from=str(run))).round == 2
    state = RecordDict({"embedding": ArrayRecord({"e": Array(np.ones(3, np.float32))})})
    with open(tmp_path / "round-4.pkl", "wb") as f:
        pickle.dump(state, f)
    assert convert(tmp_path / "round-4.pkl") == tmp_path / "round-4.pb"
    assert np.array_equal(
        read_records(tmp_path / "round-4.pb")["embedding"]["e"].numpy(), np.ones(3)
    )
    write_records(tmp_path / "round-5.pb", state)  # and the writer's own output reads back
    assert read_records(tmp_path / "round-5.pb")["embedding"]["e"].numpy().tolist() == [
        1.0,
        1.0,
        1.0,
    ]
