"""probes.sftp.deployed_gates: the gate statistics by brute force, and, on the tiny model, a run
written to disk (checkpoint + a client's saved private state) read back to the very model the client
deployed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from experiments.probes.sftp.deployed_gates import gate_stats, main, sequence_nll
from experiments.probes.sftp.trajectory import make_client, message
from fedprune_app.core.checkpoint import client_state_dir
from fedprune_app.core.protocol import flat_metrics, numpy_state
from fedprune_app.core.statefile import write_records, write_state
from fedprune_app.llm.data import encode, instruction_example
from strategies.sftp import SFTPStrategy
from tests.conftest import small_config


def test_gate_stats_by_brute_force() -> None:
    pi = np.array([[0.999, 0.95, 0.6], [0.4, 0.995, 0.01]])
    deployed = np.array([[True, False, True], [False, True, False]])
    stats = gate_stats(pi, deployed)
    assert stats["mean-pi"] == pytest.approx(pi.mean())
    assert (stats["above-0.5"], stats["above-0.9"], stats["above-0.99"]) == pytest.approx(
        (4 / 6, 3 / 6, 2 / 6)
    )
    assert stats["kept-share"] == pytest.approx(0.5)
    assert stats["lowest-kept-pi"] == pytest.approx(0.6) and stats[
        "highest-dropped-pi"
    ] == pytest.approx(0.95)


def test_sequence_nll_is_token_weighted_over_rows_of_any_length(tiny_model_dir: Path) -> None:
    """The whole-sequence CLM over padded batches equals, token-weighted, each row's loss alone
    (brute force)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [
        instruction_example("t", " ".join(["word"] * (3 * i + 1)), "yes " * (i % 3 + 1))
        for i in range(7)
    ]
    total = count = 0.0
    for row in rows:
        ids = torch.tensor([encode(tokenizer, row, 64, "sequence")[0]])
        with torch.no_grad():
            total += float(model(input_ids=ids, labels=ids).loss) * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    assert sequence_nll(model, tokenizer, rows, 64, None) == pytest.approx(total / count, rel=1e-5)


def _round_one_run(
    tiny_model_dir: Path, tmp_path: Path, rounds: int, clients: int = 1, **overrides: Any
) -> tuple[Path, list[Any], Any, list[Any]]:
    """(run directory, clients, global arrays, their round-1 replies) of an SFT-P run stopped after
    round 1 of `rounds`, as the app leaves it on disk: config.json, checkpoint/state.safetensors,
    each client's saved private state (and summary.json only when round 1 is the last)."""
    cfg = small_config(
        tiny_model_dir,
        method="sftp",
        num_server_rounds=rounds,
        local_steps=2,
        keep_ratios="0.5",
        test_examples=4,
        **overrides,
    )
    server = SFTPStrategy(cfg)
    trained = [make_client(cfg, k, clients) for k in range(clients)]
    replies = [c.train(message(server.initial_arrays(), 1)) for c in trained]
    arrays = server.aggregate(1, replies)
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    if rounds == 1:
        (run / "summary.json").write_text(
            json.dumps({"clients": [{"client": k} for k in range(clients)]})
        )
    write_state(
        run / "checkpoint" / "state.safetensors",
        {"round": 1, "run-key": "k", "arrays": numpy_state(arrays), "strategy": {}},
    )
    for client in trained:
        saved = client_state_dir(str(tmp_path / "state"), "k", client.partition_id)
        saved.mkdir(parents=True)
        write_records(saved / "round-1.pb", client.context.state)
    return run, trained, arrays, replies


def test_reads_back_the_model_the_client_deployed(tiny_model_dir: Path, tmp_path: Path) -> None:
    run, (client,), arrays, (reply,) = _round_one_run(tiny_model_dir, tmp_path, rounds=1)
    evaluated = flat_metrics(
        client.evaluate(message(arrays, 1))
    )  # what the run recorded for this client
    final = client.evaluate(message(arrays, 1))[
        "masks"
    ]  # the mask the run saved for this client: swapped back in,
    np.savez(
        run / "masks.npz", **{f"client-0/{n}": np.asarray(a.numpy()) for n, a in final.items()}
    )  # it is the same
    out = tmp_path / "gates.json"
    n = max(4, len(client.data.val))
    main(
        [
            str(run),
            "--state-dir",
            str(tmp_path / "state"),
            "--score",
            "0",
            "--examples",
            str(n),
            "--masks-from",
            str(run),
            "--fit",
            "--out",
            str(out),
        ]
    )
    record = json.loads(out.read_text())["clients"]["0"]
    assert record["keep-target"] == 0.5
    saved = client.client_state().embedding  # the saved e_k
    assert record["embedding-norm"] == pytest.approx(float(saved.norm()), rel=1e-6)
    # coordinates vs parameters: close, not equal;
    assert record["kept-share"] == pytest.approx(float(evaluated["kept-ratio-prunable"]), abs=0.15)
    # the scored deployed model is the evaluated one, to float precision:
    deployed = record["scored"]["deployed (its mask, global Φ)"]
    assert math.exp(deployed["answer-nll"]) == pytest.approx(float(evaluated["ppl"]), rel=1e-4)
    assert deployed["minus-deployed"] == [0.0, 0.0, 0.0]
    assert record["scored"]["run's mask, global Φ"]["minus-deployed"] == pytest.approx(
        [0.0, 0.0, 0.0], abs=1e-9
    )
    off = record["scored"]["its mask, adapters off"]
    assert off["answer-nll"] != pytest.approx(
        deployed["answer-nll"], rel=1e-6
    )  # Φ trained: switching it off moves it
    # --fit: the deployed mask's validation answer NLL is the val-loss the client reported after
    # training,
    fit = record["fit"]
    assert fit["val"]["deployed mask"]["answer-nll"] == pytest.approx(
        float(flat_metrics(reply)["val-loss"]), rel=1e-5
    )
    # and the masks sampled from π (σ(3) ≈ 0.95 open after 2 steps) are not the deployed 50% mask.
    assert fit["train"]["sampled masks"]["sequence-clm"] != pytest.approx(
        fit["train"]["deployed mask"]["sequence-clm"]
    )


def test_under_local_deploy_it_reads_the_clients_own_pair(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two clients, `sftp-deploy-state = "local"`: each deploys its own (Θ_k, Φ_k), not the average.
    The scored deployed model is the one the client evaluated (its own pair), and differs from the
    averaged pair's."""
    run, clients, arrays, _ = _round_one_run(
        tiny_model_dir, tmp_path, rounds=1, clients=2, sftp_deploy_state="local"
    )
    client = clients[1]
    evaluated = float(
        flat_metrics(client.evaluate(message(arrays, 1)))["ppl"]
    )  # its own pair, as in the run
    client.cfg = client.cfg.replace(sftp_deploy_state="global")
    averaged = float(flat_metrics(client.evaluate(message(arrays, 1)))["ppl"])
    assert averaged != pytest.approx(
        evaluated, rel=1e-4
    )  # the two pairs differ, so the check below can fail
    out = tmp_path / "gates.json"
    main(
        [
            str(run),
            "--state-dir",
            str(tmp_path / "state"),
            "--score",
            "1",
            "--examples",
            "4",
            "--out",
            str(out),
        ]
    )
    deployed = json.loads(out.read_text())["clients"]["1"]["scored"]["deployed (its mask, own Φ)"]
    assert math.exp(deployed["answer-nll"]) == pytest.approx(evaluated, rel=1e-4)


def test_partial_reads_a_stopped_run_at_its_checkpoint_round(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A run stopped after round 1 of 2 (no summary.json) is refused by default; `--partial` reads
    round 1, counts the clients from their saved state, and records e_k's norm and the pairwise
    distances (one client: [[0]])."""
    run, (client,), _, _ = _round_one_run(tiny_model_dir, tmp_path, rounds=2)
    with pytest.raises(SystemExit, match="not the last"):
        main([str(run), "--state-dir", str(tmp_path / "state")])
    out = tmp_path / "gates.json"
    main([str(run), "--state-dir", str(tmp_path / "state"), "--partial", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["round"] == 1 and list(record["clients"]) == ["0"]
    saved = client.client_state().embedding
    assert record["clients"]["0"]["embedding-norm"] == pytest.approx(float(saved.norm()), rel=1e-6)
    assert record["embedding-distances"] == [[0.0]]


def test_a_run_without_its_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"method": "sftp"}))
    with pytest.raises(SystemExit, match="checkpoint"):
        main([str(tmp_path)])


def test_fit_without_a_scored_client_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--fit"])  # no run there: refused on the arguments first
    assert "--fit needs --score" in capsys.readouterr().err
