"""SFT-P's grid: cells from the presets, Tables 1–2 and the four claims from synthetic run
directories built to hold or to break each claim, missing cells never invented, the figures and the
command (no Ray, no real run)."""

from __future__ import annotations

import json
import shutil
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from experiments.grids.__main__ import main, select
from experiments.grids.sftp import GRID
from experiments.grids.sftp.cells import (
    BASELINES,
    KEEP_KEYS,
    MIXED,
    preset_of,
    sftp_schedule,
    tag_of,
)
from experiments.grids.sftp.figures import FIG3, FIG4B, FIG5
from fedprune_app.core.config import RunConfig, per_client
from fedprune_app.methods.sftp.config import SFTPConfig
from fedprune_app.structural.routing import MASK_NAMES, mask_statistics
from fedprune_cli.launch import merged_config

ROOT = Path(__file__).resolve().parents[2]
TEST_EXAMPLES = 30  # the tolerance of the mixed-budget claim: 1/30 = 3.33 points
# examples behind each evaluate row: the binomial interval of a 4-client Δ is then ±1.55 points
EXAMPLES = 2000
# mean accuracy of each cell's clients (client c gets + 0.01·c): +C above NOC, +C/+A above every
# baseline
GOOD = {
    "noc-noa": 0.40,
    "noc-a": 0.42,
    "c-noa": 0.45,
    "c-a": 0.50,
    "fedflap": 0.35,
    "llmpruner": 0.33,
    "slicegpt": 0.31,
}


def args(only: str = "", seeds: str = "0") -> Namespace:
    return Namespace(only=only, seeds=seeds)


def cell_of(tag: str):
    return next(c for c in GRID.cells(args()) if c.tag == tag)


def keep_ratios(cell) -> str:
    return MIXED if cell.settings["budget"] == "mixed" else f"{cell.settings['budget']:g}"


def agreeing_masks(
    clients: int = 4, layers: int = 3, d: int = 8
) -> dict[int, dict[str, np.ndarray]]:
    """Coordinates 0–3 kept, 4–7 pruned, and client k flips coordinate k: agreement 4/8, client 0's
    density 3/8."""
    out = {}
    for k in range(clients):
        mask = np.zeros((layers, d), dtype=bool)
        mask[:, :4] = True
        mask[:, k] = ~mask[:, k]
        out[k] = {n: mask.copy() for n in MASK_NAMES}
    return out


def fake_run(
    out: Path,
    cell,
    acc: float | dict[int, float],
    model_dir: Path,
    kept: dict[int, float] | None = None,
    final_eval: bool = True,
    masks: bool = False,
    examples: int = EXAMPLES,
    settings: dict | None = None,
) -> Path:
    """A run directory as an SFT-P or baseline run leaves it (only the files the grid reads). Round
    0 = dense (40% + 1 point per client); SFT-P's train rows move each client's kept ratio linearly
    from 1 to its target by the last round; a baseline's round 1 = statistics (fedflap's also post
    hoc, 30%), rounds 2..5 recovery. Every evaluate row stands for `examples` examples; `settings`
    adds run-config keys to config.json."""
    method = cell.settings["method"]
    rounds = 4 if method == "sftp" else 5
    run = out / f"20260101-000000-{method}-{cell.tag}"
    run.mkdir(parents=True)
    config = {
        "method": method,
        "num-server-rounds": rounds,
        "keep-ratios": keep_ratios(cell),
        "test-examples": TEST_EXAMPLES,
        "model-name": str(model_dir),
    }
    if (
        method == "sftp"
    ):  # the preset's local steps: the mixed run trains the 50% schedule (schedules.confounds)
        config["local-steps"] = sftp_schedule(cell.settings["budget"])[1]
    (run / "config.json").write_text(json.dumps(config | (settings or {})))
    (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    target = dict(enumerate(per_client(keep_ratios(cell), 4, float, "k")))
    accs = acc if isinstance(acc, dict) else {c: acc + 0.01 * c for c in range(4)}
    kept = {c: target[c] for c in range(4)} | (kept or {})
    data = {c: f"bigbench:task{c}" for c in range(4)}
    rows = [
        {
            "round": 0,
            "phase": "evaluate",
            "client": c,
            "status": "ok",
            "acc": 0.40 + 0.01 * c,
            "ppl": 100.0 + c,
            "kept-ratio-prunable": 1.0,
            "data": data[c],
            "num-examples": examples,
        }
        for c in range(4)
    ]
    for t in range(1, rounds + 1):
        for c in range(4):
            row = {"round": t, "phase": "train", "client": c, "status": "accepted", "data": data[c]}
            if method == "sftp":
                row |= {
                    "bytes-up": 1e5 * (c + 1),
                    "bytes-down": 4e5,
                    "keep-target": target[c],
                    "kept-ratio-prunable": 1 - (1 - target[c]) * t / rounds,
                }
            elif t == 1:
                row |= {"bytes-up": 2e5, "bytes-down": 0}
            else:
                row |= {"bytes-up": 3e5, "bytes-down": 3.5e5, "kept-ratio-prunable": target[c]}
            rows.append(row)
        if method == "fedflap" and t == 1:
            rows += [
                {
                    "round": 1,
                    "phase": "evaluate",
                    "client": c,
                    "status": "ok",
                    "acc": 0.30 + 0.01 * c,
                    "kept-ratio-prunable": target[c],
                    "data": data[c],
                    "num-examples": examples,
                }
                for c in range(4)
            ]
    rows.append({"round": 2, "phase": "train", "client": 0, "status": "rejected", "bytes-up": 9e12})
    if final_eval:
        rows += [
            {
                "round": rounds,
                "phase": "evaluate",
                "client": c,
                "status": "ok",
                "acc": accs[c],
                "ppl": 20 / accs[c],
                "kept-ratio-prunable": kept[c],
                "data": data[c],
                "num-examples": examples,
            }
            for c in range(4)
        ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if masks:
        m = agreeing_masks()
        np.savez_compressed(
            run / "masks.npz", **{f"client-{k}/{n}": v[n] for k, v in m.items() for n in MASK_NAMES}
        )
        (run / "masks.json").write_text(json.dumps(mask_statistics(m)) + "\n")
    return run


def score(cell, table: dict[str, float]) -> float | dict[int, float]:
    """The cell's accuracy; the mixed run scores each client as the uniform run of its budget
    does."""
    if cell.settings["budget"] == "mixed":
        return {c: table["c-a"] + 0.01 * c for c in range(4)}
    return table[cell.settings["variant"] or cell.settings["method"]]


def runs_for(
    tmp: Path,
    model_dir: Path,
    table: dict[str, float] = GOOD,
    skip: tuple[str, ...] = (),
    examples: int = EXAMPLES,
    **special,
) -> dict[str, Path]:
    """A finished run per cell (except `skip`); `special[tag]` = keyword arguments of fake_run for
    that cell."""
    runs = {}
    for c in GRID.cells(args()):
        if c.tag not in skip:
            kwargs = {
                "acc": score(c, table),
                "masks": c.tag == "p50-c-a",
                "examples": examples,
            } | special.get(c.tag.replace("-", "_"), {})
            runs[c.tag] = fake_run(tmp, c, model_dir=model_dir, **kwargs)
    return runs


def claims_of(text: str) -> list[str]:
    return [
        line
        for line in text.split("## Claims")[1].split("\n## ")[0].splitlines()
        if line.startswith("- ")
    ]


def test_cells_use_valid_presets_once_each() -> None:
    cells = GRID.cells(args())
    tags = [c.tag for c in cells]
    assert (
        len(tags) == len(set(tags)) == 15
    )  # 8 SFT-P + 2 × 3 baselines (Table 1) + the mixed run; shared once
    assert tags == [
        "p80-noc-noa",
        "p80-noc-a",
        "p80-c-noa",
        "p80-c-a",
        "p80-fedflap",
        "p80-llmpruner",
        "p80-slicegpt",
        "p50-noc-noa",
        "p50-noc-a",
        "p50-c-noa",
        "p50-c-a",
        "p50-fedflap",
        "p50-llmpruner",
        "p50-slicegpt",
        "mixed-c-a",
    ]
    assert cell_of("p50-c-a").settings["groups"] == ("table1", "table2", "figs", "comm")
    assert cell_of("mixed-c-a").settings["groups"] == ("table2", "figs")
    for cell in (
        cells
    ):  # every cell's merged config validates, on its method's preset, all 4 clients waited for
        cfg = RunConfig.from_flower(merged_config(ROOT, list(cell.run_config)))
        s = cell.settings
        assert (
            cell.run_config[0] == preset_of(s["method"], s["budget"]) and cfg.method == s["method"]
        )
        assert cell.supernodes == cfg.min_nodes == 4
        rounds, steps, lora_lr = sftp_schedule(s["budget"])
        if s["method"] == "sftp":
            assert cfg["keep-ratios"] == keep_ratios(cell)
            assert (
                cfg.section(SFTPConfig).sftp_conditioning,
                cfg.section(SFTPConfig).sftp_adapters,
            ) == (s["variant"].startswith("c-"), s["variant"].endswith("-a"))
            assert (cfg.num_server_rounds, cfg.local_steps) == (rounds, steps)
            assert (
                cfg.section(SFTPConfig).sftp_deploy_state == "global"
            )  # NOC = one shared mask, as archived
        else:  # the same LoRA steps and rate as SFT-P at this budget, after one statistics round
            assert str(cfg[KEEP_KEYS[s["method"]]]) in (keep_ratios(cell), f"{s['budget']}")
            assert (cfg.num_server_rounds, cfg.local_steps, cfg.learning_rate) == (
                rounds + 1,
                steps,
                lora_lr,
            )
    assert sftp_schedule(0.8)[:2] == (6, 25) and sftp_schedule(0.5)[:2] == (12, 50)
    assert (
        str(
            RunConfig.from_flower(merged_config(ROOT, list(cell_of("mixed-c-a").run_config)))[
                "keep-ratios"
            ]
        )
        == "0.8,0.8,0.5,0.5"
    )
    (local,) = select(
        GRID.cells(args()), "mixed-c-a", "sftp-deploy-state='local'"
    )  # a --run-config extra wins
    assert (
        RunConfig.from_flower(merged_config(ROOT, list(local.run_config)))
        .section(SFTPConfig)
        .sftp_deploy_state
        == "local"
    )


def test_only_selects_groups_with_the_cells_they_read() -> None:
    assert [c.tag for c in GRID.cells(args("table2"))] == ["p80-c-a", "p50-c-a", "mixed-c-a"]
    assert [c.tag for c in GRID.cells(args("figs"))] == ["p80-c-a", "p50-c-a", "mixed-c-a"]
    assert [c.tag for c in GRID.cells(args("comm"))] == [
        "p50-noc-noa",
        "p50-noc-a",
        "p50-c-noa",
        "p50-c-a",
        "p50-fedflap",
    ]
    assert len(GRID.cells(args("table1"))) == 14
    with pytest.raises(SystemExit, match="unknown group"):
        GRID.cells(args("table4"))


def test_tables_and_claims_held(tmp_path: Path, tiny_model_dir: Path) -> None:
    # client 3 of p50-c-a ends exactly 0.02 above its budget (held: the tolerance is inclusive); the
    # mixed run's 0.8 group scores 1 point below the uniform run: held, its interval [-4.1, 2.1]
    # lies above -3.33 (one of 30 test examples)
    mixed = {c: GOOD["c-a"] + 0.01 * c - (0.01 if c < 2 else 0.0) for c in range(4)}
    runs = runs_for(tmp_path, tiny_model_dir, p50_c_a={"kept": {3: 0.52}}, mixed_c_a={"acc": mixed})
    cells = GRID.cells(args())
    text = GRID.render(cells, runs)
    assert (
        "| model | client 0 `task0` | client 1 `task1` | client 2 `task2` | client 3 `task3` "
        "| avg | kept" in text
    )
    block50 = text.split("### 50% pruned (keep 0.5)")[1].split("###")[0]
    assert (
        "| dense (round 0 of `p50-fedflap`) | 40.00 | 41.00 | 42.00 | 43.00 | 41.50 | 1.000 |"
        in block50
    )
    assert (
        "| post hoc (fedflap round 1) | 30.00 | 31.00 | 32.00 | 33.00 | 31.50 | 0.500 |" in block50
    )
    assert "| fedflap (round 5) | 35.00 | 36.00 | 37.00 | 38.00 | 36.50 | 0.500 |" in block50
    assert (
        "| LLM-Pruner (FL) (round 5) | 33.00 | 34.00 | 35.00 | 36.00 | 34.50 | 0.500 |" in block50
    )
    assert "| SliceGPT (FL) (round 5) | 31.00 | 32.00 | 33.00 | 34.00 | 32.50 | 0.500 |" in block50
    assert "| SFT-P NOC/NOA | 40.00 | 41.00 | 42.00 | 43.00 | 41.50 | 0.500 |" in block50
    assert "| SFT-P +C/+A | 50.00 | 51.00 | 52.00 | 53.00 | 51.50 | 0.505 |" in block50
    assert (
        "| SFT-P +C/NOA | 45.00 | 46.00 | 47.00 | 48.00 | 46.50 | 0.800 |"
        in text.split("### 50%")[0]
    )
    # the same Table 1 in answer perplexity: the untouched model at round 0, each model after its
    # last round
    ppl = text.split("the federated baselines and the SFT-P variants (answer perplexity)")[1]
    ppl50 = ppl.split("### 50% pruned (keep 0.5)")[1].split("###")[0]
    assert (
        "| dense (round 0 of `p50-fedflap`) | 100.00 | 101.00 | 102.00 | 103.00 | 101.50 | 1.000 |"
        in ppl50
    )
    assert f"| SFT-P +C/+A | 40.00 | {20 / 0.51:.2f} | {20 / 0.52:.2f} | {20 / 0.53:.2f} |" in ppl50
    # Table 2: the 0.8 group (clients 0, 1) and the 0.5 group (2, 3), mixed vs uniform, kept vs
    # target
    assert "| +C/+A (20% all) | 50.00 | 51.00 | 50.50 |" in text
    assert "| +C/+A (mixed) | 49.00 | 50.00 | 49.50 |" in text
    assert (
        "| +C/+A (50% all) | 52.00 | 53.00 | 52.50 |" in text
        and "| +C/+A (mixed) | 52.00 | 53.00 | 52.50 |" in text
    )
    assert "| kept / target (mixed) | 0.800 / 0.80 | 0.800 / 0.80 | |" in text
    assert "| kept / target (50% all) | 0.500 / 0.50 | 0.520 / 0.50 | |" in text
    lines = claims_of(text)
    assert len(lines) == 5 and all("**held**" in line for line in lines), lines
    assert (
        "`p50-c-a` 0.500/0.50, 0.500/0.50, 0.500/0.50, 0.520/0.50;" in lines[0]
        and "✗" not in lines[0]
    )
    pairs = [(0.50 + 0.01 * c, 0.42 + 0.01 * c) for c in range(4)]  # +C/+A and NOC/+A per client
    half = (
        1.96
        * 100
        * (sum(a * (1 - a) / EXAMPLES + b * (1 - b) / EXAMPLES for a, b in pairs) / 16) ** 0.5
    )
    assert (
        f"+C/+A vs NOC/+A: 51.50 vs 43.50 (Δ +8.00 [{8 - half:.2f}, {8 + half:.2f}], n = "
        f"{4 * EXAMPLES}); +C/NOA vs NOC/NOA: 46.50 vs 41.50 (Δ +5.00 ["
    ) in lines[1]
    assert "at 20% pruned" in lines[2] and "at 50% pruned" in lines[3]
    for line in lines[2:4]:
        assert (
            all(f"+C/+A vs {label}: 51.50 vs" in line for label in BASELINES.values())
            and "?" not in line
        )
    assert (
        "= 3.33 points" in lines[4]
        and "keep 0.8 (clients 0,1) mixed vs uniform: 49.50 vs 50.50 (Δ -1.00 [" in lines[4]
    )
    # communication: accepted train rows only (the rejected 9 TB row is not counted), per client, vs
    # fp32 model
    from transformers import AutoModelForCausalLM

    fp32 = (
        4
        * sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
        / 1e6
    )
    assert (
        f"| SFT-P +C/+A (p50-c-a) | 0.250 | 0.100 · 0.200 · 0.300 · 0.400 | 0.400 | {fp32:.1f} |"
        in text
    )
    assert (
        "| fedflap (p50-fedflap), recovery rounds 2…R | 0.300 | 0.300 · 0.300 · 0.300 · "
        "0.300 | 0.350 |" in text
    )
    assert (
        "| fedflap (p50-fedflap), importance round 1 | 0.200 | 0.200 · 0.200 · 0.200 · "
        "0.200 | 0.000 |" in text
    )
    assert f"{100 * 0.25 / fp32:.2f}% / {100 * 0.4 / fp32:.2f}%" in text


def test_each_claim_not_held(tmp_path: Path, tiny_model_dir: Path) -> None:
    bad = GOOD | {"c-noa": 0.38, "fedflap": 0.55}  # +C/NOA below NOC/NOA; fedflap above +C/+A
    # the mixed run's 0.5 group two test examples below its uniform run; its client 3 ends 0.021
    # under budget
    mixed = {c: GOOD["c-a"] + 0.01 * c - (2 / TEST_EXAMPLES if c >= 2 else 0.0) for c in range(4)}
    runs = runs_for(tmp_path, tiny_model_dir, bad, mixed_c_a={"acc": mixed, "kept": {3: 0.479}})
    lines = claims_of(GRID.render(GRID.cells(args()), runs))
    assert len(lines) == 5 and all("**not held**" in line for line in lines), lines
    assert "`mixed-c-a` 0.800/0.80, 0.800/0.80, 0.500/0.50, 0.479/0.50 ✗" in lines[0]
    assert "+C/NOA vs NOC/NOA: 39.50 vs 41.50 (Δ -2.00 [" in lines[1] and lines[1].endswith("✗).")
    assert "+C/+A vs NOC/+A: 51.50 vs 43.50 (Δ +8.00 [" in lines[1]
    assert (
        "+C/+A vs fedflap: 51.50 vs 56.50 (Δ -5.00 [" in lines[3]
        and "+C/+A vs SliceGPT (FL): 51.50 vs 32.50" in lines[3]
    )
    assert "keep 0.5 (clients 2,3) mixed vs uniform: 45.83 vs 52.50 (Δ -6.67 [" in lines[4]
    assert "keep 0.8 (clients 0,1) mixed vs uniform: 50.50 vs 50.50 (Δ +0.00 [" in lines[4]


def test_a_difference_inside_its_interval_is_unresolved(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The same scores as the held test on 30 examples per client: +C/+A's 8-point lead over NOC/+A
    has a binomial interval of ±12 points, so the claim reads unresolved, never held."""
    runs = runs_for(tmp_path, tiny_model_dir, examples=30)
    lines = claims_of(GRID.render(GRID.cells(args()), runs))
    assert "**unresolved**" in lines[1] and "+C/+A vs NOC/+A: 51.50 vs 43.50 (Δ +8.00 [" in lines[1]
    assert "n = 120) ?" in lines[1]
    assert "**held**" in lines[3]  # a 15-point lead over every baseline is resolved even at n = 30


def rescore(run: Path, correct: dict[str, dict[int, int]], sizes: dict[int, int]) -> None:
    """A rescore.json as fedprune_cli/rescore_accuracy.py writes it: per model and client, the first
    `correct[model][k]` of `sizes[k]` examples right."""
    models = {
        m: {
            str(k): {"acc": [1.0] * n + [0.0] * (sizes[k] - n), "acc_norm": [0.0] * sizes[k]}
            for k, n in per.items()
        }
        for m, per in correct.items()
    }
    (run / "rescore.json").write_text(
        json.dumps(
            {
                "per-source": 100,
                "models": models,
                "seconds": 1.0,
                "clients": {
                    str(k): {"source": f"bigbench:task{k}", "examples": n, "test-split": 30}
                    for k, n in sizes.items()
                },
            }
        )
    )


def test_rescored_tables_and_claims_use_the_per_example_scores(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """In-run +C/+A beats fedflap (51.5 vs 36.5); re-scored on 130/130/130/30 examples fedflap is
    ahead: the re-scored table shows the re-scored means, the claim flips to not held, and its
    paired interval is the client-stratified bootstrap of the same per-example differences."""
    from fedprune_app.llm.evaluation import bootstrap_ci

    runs = runs_for(tmp_path, tiny_model_dir)
    sizes = {0: 130, 1: 130, 2: 130, 3: 30}
    rescore(runs["p50-c-a"], {"final": {0: 52, 1: 65, 2: 26, 3: 9}}, sizes)
    rescore(
        runs["p50-fedflap"],
        {
            "final": {0: 65, 1: 65, 2: 39, 3: 12},
            "post-hoc": {0: 13, 1: 13, 2: 13, 3: 3},
            "dense": {0: 78, 1: 78, 2: 78, 3: 15},
        },
        sizes,
    )
    text = GRID.render(GRID.cells(args()), runs)
    in_run, rescored = text.split("# Re-scored on more examples per client")
    assert (
        "+C/+A vs fedflap: 51.50 vs 36.50" in claims_of(in_run)[3]
        and "**held**" in claims_of(in_run)[3]
    )
    assert "examples per client: 0: 130, 1: 130, 2: 130, 3: 30" in rescored
    block50 = rescored.split("### 50% pruned (keep 0.5)")[1].split("###")[0]
    assert (
        "| dense (round 0 of `p50-fedflap`) | 60.00 | 60.00 | 60.00 | 50.00 | 57.50 | 1.000 |"
        in block50
    )
    assert (
        "| post hoc (fedflap round 1) | 10.00 | 10.00 | 10.00 | 10.00 | 10.00 | 0.500 |" in block50
    )
    assert "| fedflap (round 5) | 50.00 | 50.00 | 30.00 | 40.00 | 42.50 | 0.500 |" in block50
    assert "| SFT-P +C/+A | 40.00 | 50.00 | 20.00 | 30.00 | 35.00 | 0.500 |" in block50
    assert (
        "| SFT-P NOC/NOA | – | – | – | – | – |" in block50
    )  # not re-scored: never the in-run numbers
    lines = [
        line
        for line in rescored.split("## Claims (re-scored)")[1].splitlines()
        if line.startswith("- ")
    ]
    assert not any("±2%" in line for line in lines)  # the masks' claim is the in-run one
    flap = next(line for line in lines if "at 50% pruned" in line)
    a = (
        [1.0] * 52
        + [0.0] * 78
        + [1.0] * 65
        + [0.0] * 65
        + [1.0] * 26
        + [0.0] * 104
        + [1.0] * 9
        + [0.0] * 21
    )
    b = (
        [1.0] * 65
        + [0.0] * 65
        + [1.0] * 65
        + [0.0] * 65
        + [1.0] * 39
        + [0.0] * 91
        + [1.0] * 12
        + [0.0] * 18
    )
    _, lo, hi = bootstrap_ci(a, b, strata=[0] * 130 + [1] * 130 + [2] * 130 + [3] * 30)
    assert (
        f"+C/+A vs fedflap: 35.00 vs 42.50 (Δ -7.50 [{100 * lo:.2f}, {100 * hi:.2f}], n = 420) ✗"
        in flap
    )
    assert "**not held**" in flap and hi < 0  # −7.5 points, resolved
    assert "+C beats NOC" in lines[0] and "**not checked**" in lines[0]  # NOC cells not re-scored


def test_missing_cells_are_not_checked_never_invented(tmp_path: Path, tiny_model_dir: Path) -> None:
    # p50-noc-a and the mixed run never ran; fedflap at 50% ran but its last round has no evaluation
    runs = runs_for(
        tmp_path,
        tiny_model_dir,
        skip=("p50-noc-a", "mixed-c-a"),
        p50_fedflap={"acc": 0.99, "final_eval": False},
    )
    text = GRID.render(GRID.cells(args()), runs)
    assert "| SFT-P NOC/+A | *not run* |" in text and "| +C/+A (mixed) | *not run* |" in text
    assert (
        "| fedflap (round 5) | – | – | – | – | – | – |" in text
    )  # never round 1's or round 0's numbers
    assert "99.00" not in text and "- `mixed-c-a`: not run" in text
    assert "| SFT-P NOC/+A (p50-noc-a) | *not run* | | | | |" in text
    lines = claims_of(text)
    assert len(lines) == 5 and all("**not checked**" in lines[i] for i in (0, 1, 3, 4)), lines
    assert "missing: `p50-noc-a`, `mixed-c-a`" in lines[0]
    assert (
        "missing: +C/+A vs NOC/+A" in lines[1] and "+C/NOA vs NOC/NOA: 46.50 vs 41.50" in lines[1]
    )
    assert "missing: +C/+A vs fedflap" in lines[3] and "missing: keep 0.8" in lines[4]
    # one client's final evaluation missing: that run's average is not a four-client average
    runs["p50-c-a"] = fake_run(tmp_path / "b", cell_of("p50-c-a"), 0.5, tiny_model_dir)
    rows = (runs["p50-c-a"] / "metrics.jsonl").read_text().splitlines()
    (runs["p50-c-a"] / "metrics.jsonl").write_text("\n".join(rows[:-1]) + "\n")
    text = GRID.render(GRID.cells(args("table1")), runs)
    assert "| SFT-P +C/+A | 50.00 | 51.00 | 52.00 | – | – | 0.500 |" in text
    assert "`p50-c-a` client 3" in claims_of(text)[0]


def test_figures_are_drawn_next_to_the_tables(tmp_path: Path, tiny_model_dir: Path) -> None:
    cells = GRID.cells(args())
    runs = runs_for(tmp_path / "runs", tiny_model_dir)
    section = GRID.figures(cells, runs, tmp_path / "out")
    for name in (FIG3, FIG4B, FIG5):
        assert (tmp_path / "out" / name).stat().st_size > 5000 and f"`{name}`" in section
    assert "mean over layers and masks 0.500" in section and "heatmap layer 1 attn-in" in section
    assert "per-layer mask density of client 0" in section and "attn-in 0.375–0.375" in section
    assert (
        "Kept ratio per client and round, mixed:" in section
        and "| 2 (0.50) | 0.875 | 0.750 | 0.625 | 0.500 |" in section
    )
    assert "Kept ratio per client and round, 20% pruned (keep 0.8):" in section
    # each client drops coordinates 4–7 plus its own flipped one: 4 of its 5 drops are every
    # client's
    assert "| `p50-c-a` | 0.500 | 0.800 / 0.800 / 0.800 / 0.800 |" in section
    assert "| run | other run |" not in section  # one run with masks.npz: no pair to compare
    shutil.copy(
        runs["p50-c-a"] / "masks.npz", runs["p50-noc-a"] / "masks.npz"
    )  # the same masks in a second run
    assert "| `p50-noc-a` | `p50-c-a` | 1.000 | 1.000 |" in GRID.figures(
        cells, runs, tmp_path / "pair"
    )
    (runs["p50-noc-a"] / "masks.npz").unlink()
    (runs["p50-c-a"] / "masks.npz").unlink()  # masks.json alone: the agreement curves, no heatmap
    section = GRID.figures(cells, runs, tmp_path / "json-only")
    assert "no masks.npz: no heatmap" in section and (tmp_path / "json-only" / FIG3).is_file()
    empty = GRID.figures(cells, {}, tmp_path / "none")
    assert "Figs. 3 and 5 not drawn" in empty and "Fig. 4b not drawn" in empty
    assert not (tmp_path / "none" / FIG3).exists()


def test_cross_run_overlap_against_counting() -> None:
    """Two runs' masks: agreement and the share of run a's cut that run b also cuts, counted by
    hand; clients only one run has are left out."""
    from experiments.grids.sftp.figures import cut_overlap

    a = {
        0: {"attn-in": np.array([[1, 1, 0, 0], [1, 0, 0, 1]]), "ffn-in": np.array([[0, 1, 1, 1]])},
        1: {"attn-in": np.ones((2, 4)), "ffn-in": np.ones((1, 4))},
        5: {"attn-in": np.zeros((2, 4)), "ffn-in": np.zeros((1, 4))},
    }
    b = {
        0: {"attn-in": np.array([[1, 0, 0, 1], [1, 0, 1, 1]]), "ffn-in": np.array([[0, 0, 1, 1]])},
        1: {"attn-in": np.ones((2, 4)), "ffn-in": np.array([[1, 1, 1, 0]])},
    }
    # client 0: a = 11001001 0111 (5 cut), b = 10011011 0011 (5 cut); same gate on 8 of 12; cut by
    # both: 3 of a's 5
    # client 1: a keeps everything (no cut: shared 0), 11 of 12 agree
    agree, shared = cut_overlap(a, b)
    assert agree == pytest.approx((8 / 12 + 11 / 12) / 2) and shared == pytest.approx(
        (3 / 5 + 0) / 2
    )


def test_command_renders_finished_runs_of_both_methods(
    tmp_path: Path, tiny_model_dir: Path, capsys
) -> None:
    """`--render-only` finds the fedflap cells under their own run-directory names; the archive
    re-renders the tables; the other grids are unchanged."""
    runs_for(tmp_path, tiny_model_dir)
    archive = tmp_path / "archive"
    assert main(["sftp", "--out", str(tmp_path), "--render-only", "--archive", str(archive)]) == 0
    text = (tmp_path / "tables.md").read_text()
    assert "| fedflap (round 5) | 35.00 | 36.00 | 37.00 | 38.00 | 36.50 | 0.500 |" in text
    assert all((tmp_path / name).is_file() for name in (FIG3, FIG4B, FIG5)) and f"`{FIG4B}`" in text
    assert len(list(archive.iterdir())) == 15
    assert (
        main(
            [
                "sftp",
                "--only",
                "table1",
                "--out",
                str(archive),
                "--render-only",
                "--archive",
                "none",
            ]
        )
        == 0
    )
    assert (
        "| SFT-P +C/+A | 50.00 | 51.00 | 52.00 | 53.00 | 51.50 | 0.500 |"
        in (archive / "tables.md").read_text()
    )
    code = main(
        [
            "sftp",
            "--tags",
            "p50-c-a",
            "--out",
            str(tmp_path / "one"),
            "--render-only",
            "--archive",
            "none",
        ]
    )
    assert code == 1 and "- `p50-c-a`: not run" in (tmp_path / "one" / "tables.md").read_text()
    assert (
        main(
            [
                "fedtpa",
                "--only",
                "table2",
                "--alphas",
                "0.5",
                "--out",
                str(tmp_path / "t"),
                "--render-only",
                "--archive",
                "none",
            ]
        )
        == 1
    )  # the FedTPA grid is unchanged (nothing to render here)
    capsys.readouterr()


def test_tag_of_names_run_directories_apart() -> None:
    """finished_run globs `*-<method>-<tag>*`: no tag may be another's prefix within one method."""
    tags = [c.tag for c in GRID.cells(args())]
    assert not [(a, b) for a in tags for b in tags if a != b and b.startswith(a + "-")]
    assert tag_of("fedflap", 0.5) == "p50-fedflap" and tag_of("sftp", "mixed", "c-a") == "mixed-c-a"


def test_rescored_answer_perplexity_is_compared_paired_per_client(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """With per-example answer NLLs in rescore.json the grid adds Table 1 in answer perplexity and,
    per client, SFT-P against each baseline and the untouched model: Δ = ppl(SFT-P) − ppl(other)
    with the paired bootstrap interval of `paired_perplexity_interval` on that client's answers; a
    clearly lower SFT-P holds, a higher one does not."""
    import math

    from fedprune_app.llm.intervals import TokenScores, paired_perplexity_interval

    runs = runs_for(tmp_path, tiny_model_dir)
    sizes = {0: 40, 1: 40, 2: 40, 3: 30}
    difficulty = {k: np.random.default_rng(k).normal(0.0, 0.4, size=n) for k, n in sizes.items()}

    def with_nll(tag: str, model: str, log_ppl: dict[int, float]) -> None:
        record = json.loads((runs[tag] / "rescore.json").read_text())
        for k, v in record["models"][model].items():
            nll = 5 * (log_ppl[int(k)] + difficulty[int(k)])
            v |= {"nll": [float(x) for x in nll], "tokens": [5] * len(nll)}
        (runs[tag] / "rescore.json").write_text(json.dumps(record))

    rescore(runs["p80-c-a"], {"final": {0: 20, 1: 20, 2: 20, 3: 15}}, sizes)
    rescore(runs["p80-llmpruner"], {"final": {0: 20, 1: 20, 2: 20, 3: 15}}, sizes)
    rescore(
        runs["p80-fedflap"],
        {
            "final": dict.fromkeys(range(4), 10),
            "dense": dict.fromkeys(range(4), 25),
            "post-hoc": dict.fromkeys(range(4), 5),
        },
        sizes,
    )
    with_nll("p80-c-a", "final", {k: math.log(50) for k in range(4)})
    with_nll(
        "p80-llmpruner",
        "final",
        {0: math.log(40), 1: math.log(80), 2: math.log(80), 3: math.log(80)},
    )
    with_nll("p80-fedflap", "final", {k: math.log(500) for k in range(4)})
    with_nll("p80-fedflap", "dense", {k: math.log(100) for k in range(4)})
    for tag, logs in (
        ("p50-c-a", {0: 9, 1: 9, 2: math.log(100), 3: math.log(100)}),
        ("p50-noc-a", dict.fromkeys(range(4), math.log(50))),
        ("mixed-c-a", {0: math.log(30), 1: math.log(30), 2: math.log(400), 3: math.log(400)}),
    ):
        rescore(runs[tag], {"final": {0: 20, 1: 20, 2: 20, 3: 15}}, sizes)
        with_nll(tag, "final", logs)
    rescored = GRID.render(GRID.cells(args()), runs).split(
        "# Re-scored on more examples per client"
    )[1]
    block = rescored.split("(re-scored answer perplexity)")[1].split("### 50%")[0]
    ppl = {
        k: math.exp(math.log(50) + float(np.mean(difficulty[k]))) for k in range(4)
    }  # 5 tokens each
    assert f"| SFT-P +C/+A | {ppl[0]:.2f} | {ppl[1]:.2f} |" in block
    lines = [
        line
        for line in rescored.split("## Answer perplexity, paired (re-scored)")[1].splitlines()
        if line.startswith("- ")
    ]
    untouched, flap, llm = (
        next(line for line in lines if f"at or below {name}" in line)
        for name in ("the untouched model", "fedflap", "LLM-Pruner (FL)")
    )
    assert "**held**" in untouched and "**held**" in flap
    assert "**not held**" in llm and "client 0:" in llm and " ✗" in llm.split("client 1:")[0]
    # the mixed run against the uniform run of each client's budget: clients 0, 1 (keep 0.8) lower,
    # but trained on the 50% schedule (flagged), clients 2, 3 (keep 0.5) 4x higher than the uniform
    # 50% run
    # the ablations whose two cells were re-scored: +C/+A against NOC/+A at 50% (worse on every
    # client); no line for a pair with a cell missing
    ablations = [line for line in lines if "at or below NOC/" in line or "at or below +C/" in line]
    assert len(ablations) == 1 and ablations[0].startswith(
        "- 50% pruned (keep 0.5): SFT-P +C/+A at or below NOC/+A"
    )
    assert "**not held**" in ablations[0] and ablations[0].count(" ✗") == 4
    mixed_80, mixed_50 = (
        next(line for line in lines if line.startswith("- mixed") and f"(keep {p})" in line)
        for p in ("0.8", "0.5")
    )
    assert "clients 0, 1" in mixed_80 and "**held**" in mixed_80
    assert (
        "Confounded: `mixed-c-a` and `p80-c-a` also differ in `local-steps` (50 vs 25)." in mixed_80
    )
    assert (
        "clients 2, 3" in mixed_50 and "**not held**" in mixed_50 and "Confounded" not in mixed_50
    )
    a = TokenScores.of(5 * (math.log(50) + difficulty[2]), [5] * 40)
    b = TokenScores.of(5 * (math.log(80) + difficulty[2]), [5] * 40)
    ci = paired_perplexity_interval(a, b, "difference", iters=2000, seed=2)
    assert (
        f"client 2: {a.perplexity:.2f} vs {b.perplexity:.2f} (Δ {ci.estimate:+.2f} [{ci.lo:.2f}, "
        f"{ci.hi:.2f}], n = 40)" in llm
    )


def test_seeds_replicate_the_sftp_variants_and_stay_out_of_the_tables(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`--seeds 0,2` adds a replicate of each SFT-P variant at 20% and 50% (tag `<cell>-seed2`,
    `seed=2` appended to its overrides), none of the baselines or the mixed run; the tables still
    show each cell's own run, whatever a replicate scored, and the runs section lists the
    replicates."""
    cells = GRID.cells(args(seeds="0,2"))
    base = {c.tag: c for c in GRID.cells(args())}
    replicas = [c for c in cells if "replicate-of" in c.settings]
    assert [c.tag for c in cells[:15]] == list(base)
    assert [c.tag for c in replicas] == [
        f"{t}-seed2"
        for t in base
        if t.split("-", 1)[1] in ("noc-noa", "noc-a", "c-noa", "c-a") and not t.startswith("mixed")
    ]
    for c in replicas:
        original = base[c.settings["replicate-of"]]
        assert (
            c.run_config == (original.run_config[0], f"{original.run_config[1]} seed=2")
            and c.settings["seed"] == 2
        )
        assert RunConfig.from_flower(merged_config(ROOT, list(c.run_config))).seed == 2
    runs = runs_for(tmp_path, tiny_model_dir)
    own = GRID.render(list(base.values()), runs)
    runs["p50-c-a-seed2"] = fake_run(
        tmp_path / "replica",
        next(c for c in replicas if c.tag == "p50-c-a-seed2"),
        0.10,
        tiny_model_dir,
    )
    with_replica = GRID.render(cells, runs)
    assert with_replica.split("## Runs")[0] == own.split("## Runs")[0]
    assert f"- `p50-c-a-seed2`: [`{runs['p50-c-a-seed2'].name}`]" in with_replica
    assert "- `p80-c-a-seed2`: not run" in with_replica


def test_ablations_pool_the_seed_replicates(tmp_path: Path) -> None:
    """+C/+A vs NOC/+A at 50% with two seeds: seed 0 has +C clearly worse on every client, seed 1
    clearly better. Alone, seed 0's pair reads not held; pooled (two-stage bootstrap over seeds,
    then answers), the effect is the mean of the two seeds' differences and its interval straddles
    0: unresolved. A seed only one cell has run (seed 3 of +C/+A) is left out."""
    import math

    from experiments.grids.sftp.rescored import ablation_line
    from fedprune_app.llm.intervals import TokenScores

    difficulty = np.random.default_rng(0).normal(0.0, 0.3, size=60)

    def rescored(tag: str, log_ppl: float) -> None:
        run = tmp_path / tag
        run.mkdir()
        nll = [float(x) for x in 4 * (log_ppl + difficulty)]
        model = {
            str(k): {"acc": [1.0] * 60, "acc_norm": [1.0] * 60, "nll": nll, "tokens": [4] * 60}
            for k in range(4)
        }
        (run / "rescore.json").write_text(
            json.dumps(
                {"per-source": 100, "models": {"final": model}, "seconds": 1.0, "clients": {}}
            )
        )
        runs[tag] = run

    runs: dict[str, Path] = {}
    for tag, ppl in (
        ("p50-c-a", 100),
        ("p50-noc-a", 50),
        ("p50-c-a-seed1", 50),
        ("p50-noc-a-seed1", 100),
        ("p50-c-a-seed3", 10),
    ):
        rescored(tag, math.log(ppl))
    pooled = ablation_line(runs, 0.5, "c-a", "noc-a")
    alone = ablation_line({t: runs[t] for t in ("p50-c-a", "p50-noc-a")}, 0.5, "c-a", "noc-a")
    assert alone is not None and "**not held**" in alone and "pooled" not in alone
    assert pooled is not None and "pooled over 2 seeds" in pooled and "**unresolved**" in pooled
    big = TokenScores.of([float(x) for x in 4 * (math.log(100) + difficulty)], [4] * 60).perplexity
    small = TokenScores.of([float(x) for x in 4 * (math.log(50) + difficulty)], [4] * 60).perplexity
    mean = (big + small) / 2
    assert f"client 0: {mean:.2f} vs {mean:.2f} (Δ +0.00 [" in pooled and "n = 120)" in pooled
    lo, hi = (
        float(x) for x in pooled.split("client 0:")[1].split("[")[1].split("]")[0].split(", ")
    )
    assert (
        lo < -(big - small) / 4 and hi > (big - small) / 4
    )  # the seeds' spread is in the interval
    assert ablation_line({"p50-c-a": runs["p50-c-a"]}, 0.5, "c-a", "noc-a") is None


def test_size_and_speed_table_reads_the_compiled_rows(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Table 1's size columns: parameters in M, ratio to dense, speed-ups and ceilings from each
    run's `compiled` rows; SFT-P's four per-client models as min–max; a run without compiled rows
    (fedflap) has no row, a cell not run reads 'not run', a budget with nothing timed and nothing
    missing has no block."""
    from experiments.grids.sftp.size import size_and_speed

    runs = runs_for(tmp_path, tiny_model_dir, skip=("p50-noc-noa",))

    def add(
        tag: str, models: dict[str, tuple[float, float, float]]
    ) -> None:  # name: (params, prefill, generate)
        rows = [
            {
                "phase": "compiled",
                "model": "dense",
                "prefill-tokens": 512,
                "params": 100e6,
                "params-ratio": 1.0,
                "prefill-speedup": 1.0,
                "prefill-ceiling": 1.0,
                "generate-speedup": 1.0,
                "generate-ceiling": 1.0,
            }
        ]
        rows += [
            {
                "phase": "compiled",
                "model": name,
                "prefill-tokens": 512,
                "params": p,
                "params-ratio": p / 100e6,
                "prefill-speedup": s,
                "prefill-ceiling": 1.75,
                "generate-speedup": g,
                "generate-ceiling": 1.8,
            }
            for name, (p, s, g) in models.items()
        ]
        with (runs[tag] / "metrics.jsonl").open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))

    add("p50-c-a", {f"client {k}": (60e6, 1.5 + 0.1 * k, 1.6) for k in range(4)})
    add("p50-llmpruner", {"llmpruner": (61e6, 1.4, 1.3)})
    cells = GRID.cells(args())
    text = "\n".join(size_and_speed(cells, {t: r for t, r in runs.items() if t != "p50-noc-noa"}))
    block = text.split("### 50% pruned")[1]
    assert "| SFT-P +C/+A | 4 | 60.0 | 0.600 | 512 | 1.50–1.80× | 1.75× | 1.60× | 1.80× |" in block
    assert "| LLM-Pruner (FL) | 1 | 61.0 | 0.610 | 512 | 1.40× | 1.75× | 1.30× | 1.80× |" in block
    assert "| SFT-P NOC/NOA | *not run* |" in block
    assert "fedflap |" not in block and "| SFT-P +C/NOA |" not in block  # ran, but timed nothing
    assert "### 20% pruned" not in text  # every 20% cell ran, none timed: no empty block


def test_schedules_show_each_recipe_and_flag_cells_that_differ_besides_their_variant(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The 50% block re-run in part with the budget warm-up: the section gives that budget two
    recipe rows and names the key; `confounds` puts it on a pair across the two recipes, not on a
    pair within one; a key the run predates reads as what the run did (padded rows before
    `pack-sequences`, the default for any other key)."""
    from experiments.grids.sftp.schedules import confounds, differing_keys, schedules

    warm = {"sftp-budget-warmup-steps": 300, "pack-sequences": False}
    runs = runs_for(
        tmp_path, tiny_model_dir, p50_c_a={"settings": warm}, p50_noc_a={"settings": warm}
    )
    text = GRID.render(GRID.cells(args()), runs)
    section = text.split("## SFT-P schedules")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| 50% pruned")]
    assert len(rows) == 2
    assert (
        rows[0].startswith("| 50% pruned (keep 0.5) | `p50-noc-noa`, `p50-c-noa` | 4 × 50 |")
        and "| 0 |" in rows[0]
    )
    assert (
        rows[1].startswith("| 50% pruned (keep 0.5) | `p50-noc-a`, `p50-c-a` | 4 × 50 |")
        and "| 300 |" in rows[1]
    )
    assert (
        "**Confounded, 50% pruned (keep 0.5)**: its SFT-P cells differ in "
        "`sftp-budget-warmup-steps`" in section
    )
    assert "Confounded, 20%" not in section and "Confounded, mixed" not in section
    assert confounds(runs, "p50-c-a", "p50-noc-a") == ""
    assert (
        confounds(runs, "p50-c-a", "p50-c-noa")
        == " Confounded: `p50-c-a` and `p50-c-noa` also differ in "
        "`sftp-budget-warmup-steps` (300 vs 0)."
    )
    assert confounds(runs, "p50-c-a", "p50-missing") == ""
    assert differing_keys([{}, {"pack-sequences": False}]) == []  # predates the key: padded rows
    assert differing_keys([{}, {"pack-sequences": True}]) == ["pack-sequences"]
    assert differing_keys([{}, {"sftp-lambda": 16.0}]) == []  # the default
    assert differing_keys([{"keep-ratios": "0.5", "run-tag": "a"}, {"keep-ratios": "0.8"}]) == []
    assert schedules(GRID.cells(args()), {}) == []
