"""SFT-P's FLOP ceiling (`speed.forward_flops` / `workload_flops`) against a brute-force count:
torch's FlopCounterMode over real forwards and `generate` of tiny compiled models, and a count from
the compiled modules' weight shapes; the ceiling columns of `speed_table`; the speed-ups' paired
ratios and their distribution-free interval (`median_interval`) against exact enumeration."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedprune_app.llm.models import load_base_model
from fedprune_app.structural import speed
from fedprune_app.structural.routing import MASK_NAMES, LayerMasks, compile_model
from fedprune_app.structural.speed import (
    compiled_rows,
    flop_ceiling,
    forward_flops,
    lane_widths,
    median_interval,
    speed_table,
    workload_flops,
)

D = 64  # the tiny LLaMA's hidden size (tests/tiny.py)


def masks_with(density: dict[str, float], layers: int = 2, seed: int = 0) -> list[LayerMasks]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        masks = {}
        for name in MASK_NAMES:
            g = torch.zeros(D, dtype=torch.bool)
            g[torch.randperm(D, generator=gen)[: round(density[name] * D)]] = True
            masks[name] = g
        out.append(masks)
    return out


CASES = {
    "keep 0.5": dict.fromkeys(MASK_NAMES, 0.5),
    "keep 0.8": dict.fromkeys(MASK_NAMES, 0.8),
    "uneven": {"attn-in": 0.3, "attn-out": 0.9, "ffn-in": 0.7, "ffn-out": 0.2},
    "empty attention": {"attn-in": 0.0, "attn-out": 0.5, "ffn-in": 0.6, "ffn-out": 0.6},
    "empty ffn": {"attn-in": 0.6, "attn-out": 0.6, "ffn-in": 0.5, "ffn-out": 0.0},
}


@pytest.fixture()
def eager(tiny_model_dir: Path) -> nn.Module:
    """The tiny model with eager attention: its scores and values are plain matmuls that
    FlopCounterMode sees (the CPU SDPA kernel has no FLOP formula), each query against every cached
    and new key."""
    model = load_base_model(str(tiny_model_dir))
    model.set_attn_implementation("eager")
    return model


def counted(fn) -> int:
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("case", [None, *CASES])
def test_flops_equal_flop_counter_mode_on_the_timed_workloads(
    eager: nn.Module, case: str | None
) -> None:
    """Every matmul the model runs, counted by torch on the very tasks `speed_table` times (prefill
    with last-token logits, all logits, greedy generate with the KV cache), equals `workload_flops`
    (its default `full` attention: the eager kernel's product, every query against every key):
    tolerance 0, the counts are integers."""
    model = eager if case is None else compile_model(eager, masks_with(CASES[case], seed=len(case)))
    lanes = lane_widths(model)
    assert (lanes is None) == (case is None)
    prompt = torch.randint(0, 2000, (1, 24), generator=torch.Generator().manual_seed(0))
    short, new = prompt[:, :8], 6
    work = {"prefill": 24, "new_tokens": new, "prompt": 8}
    assert counted(lambda: model(prompt, use_cache=True, logits_to_keep=1)) == workload_flops(
        model.config, lanes, "prefill", **work
    )
    assert counted(lambda: model(prompt, use_cache=False)) == workload_flops(
        model.config, lanes, "full-logits", **work
    )
    assert counted(
        lambda: model.generate(
            short, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )
    ) == workload_flops(model.config, lanes, "generate", **work)


def test_one_token_steps_count_the_same_either_way_and_a_cached_step_sees_every_key(
    eager: nn.Module,
) -> None:
    """One new token attends to every cached key, so `causal` = `full` = torch's count with a
    cache."""
    compiled = compile_model(eager, masks_with(CASES["uneven"]))
    lanes = lane_widths(compiled)
    ids = torch.randint(0, 2000, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        past = compiled(ids[:, :-1], use_cache=True).past_key_values
    step = counted(
        lambda: compiled(ids[:, -1:], past_key_values=past, use_cache=True, logits_to_keep=1)
    )
    for attention in ("causal", "full"):
        assert forward_flops(compiled.config, lanes, 1, past=9, attention=attention) == step


def brute_force(model: nn.Module, tokens: int, past: int, logits: int) -> int:
    """The causal count from the compiled model's own modules: 2 FLOPs per weight of every nn.Linear
    in a decoder layer per token; per attention layer 2·(q·k + p·v) = 4·heads·head_dim per (query,
    key) pair, the i-th new token seeing past + i + 1 keys, by a loop; the LM head per logit
    token."""
    config = model.config
    heads, head_dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    total = 0
    for layer in model.model.layers:
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                total += 2 * tokens * module.weight.numel()
        if layer.self_attn is not None:
            total += sum(4 * heads * head_dim * (past + i + 1) for i in range(tokens))
    return total + 2 * logits * model.lm_head.weight.numel()


@pytest.mark.parametrize("case", list(CASES))
def test_causal_count_equals_a_count_from_the_weight_shapes(eager: nn.Module, case: str) -> None:
    compiled = compile_model(eager, masks_with(CASES[case], seed=3))
    lanes = lane_widths(compiled)
    for tokens, past, logits in ((24, 0, 1), (24, 0, 24), (5, 11, 1), (1, 30, 1)):
        assert forward_flops(
            compiled.config, lanes, tokens, past, logits, attention="causal"
        ) == brute_force(compiled, tokens, past, logits)


def test_lane_widths_of_masks_stacked_arrays_and_compiled_models_agree(eager: nn.Module) -> None:
    masks = masks_with(CASES["uneven"], seed=5)
    expected = [{n: int(g[n].sum()) for n in MASK_NAMES} for g in masks]
    stacked = {n: np.stack([g[n].numpy() for g in masks]) for n in MASK_NAMES}
    assert (
        lane_widths(masks)
        == lane_widths(stacked)
        == lane_widths(compile_model(eager, masks))
        == expected
    )
    assert lane_widths([{n: g[n].float() for n in MASK_NAMES} for g in masks]) == expected
    assert lane_widths(eager) is None
    config = eager.config
    full = [dict.fromkeys(MASK_NAMES, D)] * 2
    for task in ("prefill", "full-logits", "generate"):
        assert workload_flops(config, full, task) == workload_flops(config, None, task)
        assert flop_ceiling(config, None, task) == 1.0
        assert (
            1.0 < flop_ceiling(config, expected, task) < 1 / 0.2
        )  # below 1/keep: LM head and attention stay


def test_the_lm_head_bounds_the_ceiling_on_a_smollm2_shaped_config() -> None:
    """SmolLM2-135M's shape (config only): the unpruned LM head, 49,152 × 576 per logit token, holds
    one decoding step (here the 49th) at keep 0.8 to ≈1.18× and at keep 0.5 to ≈1.64×, whatever the
    kernel."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    )
    for keep, bound in ((0.8, 1.184), (0.5, 1.639)):
        lanes = [dict.fromkeys(MASK_NAMES, round(keep * 576))] * 30
        step = forward_flops(config, None, 1, past=48) / forward_flops(config, lanes, 1, past=48)
        assert step == pytest.approx(bound, abs=0.001)
        assert (
            flop_ceiling(config, lanes, "prefill") > step
        )  # prefill: one logit token for 512 prompt tokens


def test_speed_table_puts_each_speedup_beside_its_ceiling(eager: nn.Module) -> None:
    compiled = compile_model(eager, masks_with(CASES["keep 0.5"]))
    table = speed_table(
        {"dense": eager, "keep 0.5": compiled},
        2000,
        0,
        prefill=16,
        new_tokens=3,
        repeats=1,
        full_logits=True,
    )
    work = {"prefill": 16, "new_tokens": 3, "prompt": 16}
    for task in ("prefill", "full-logits", "generate"):
        assert table["dense"][f"{task}-ceiling"] == 1.0
        row = table["keep 0.5"]
        assert row[f"{task}-ceiling"] == pytest.approx(
            flop_ceiling(eager.config, lane_widths(compiled), task, **work)
        )
        assert row[f"{task}-of-ceiling"] == pytest.approx(
            row[f"{task}-speedup"] / row[f"{task}-ceiling"]
        )


def test_compiled_rows_use_a_given_ceiling_and_kept_ratio(tiny_model_dir: Path) -> None:
    """The shared 'Compiled models' rows: params ratio against the first model, kept ratio only
    where given, the lane-based ceiling unless `ceiling` gives one, and of-ceiling = speed-up / that
    ceiling."""
    from tests.conftest import small_config

    cfg = small_config(tiny_model_dir)
    dense = load_base_model(str(tiny_model_dir))
    pruned = compile_model(dense, masks_with({n: 0.5 for n in MASK_NAMES}))
    rows = {
        r["model"]: r
        for r in compiled_rows(
            cfg,
            {"dense": dense, "pruned": pruned, "other": pruned},
            None,
            {"pruned": 0.5},
            prefill=8,
            ceiling=lambda name, task: 3.0 if name == "other" else None,
        )
    }
    assert list(rows) == ["dense", "pruned", "other"] and all(
        r["phase"] == "compiled" for r in rows.values()
    )
    assert rows["dense"]["params-ratio"] == 1.0 and rows["pruned"]["params-ratio"] < 1.0
    assert (
        "kept-ratio-prunable" not in rows["dense"] and rows["pruned"]["kept-ratio-prunable"] == 0.5
    )
    lanes = flop_ceiling(dense.config, lane_widths(pruned), "prefill", None, prefill=8)
    assert rows["pruned"]["prefill-ceiling"] == pytest.approx(lanes) and lanes > 1.0
    for task in ("prefill", "generate"):
        assert rows["other"][f"{task}-ceiling"] == 3.0
        assert rows["other"][f"{task}-of-ceiling"] == pytest.approx(
            rows["other"][f"{task}-speedup"] / 3.0
        )
    assert not any(
        k.startswith("ppl/") for r in rows.values() for k in r
    )  # no tokenizer: no perplexity
    sizes = compiled_rows(cfg, {"dense": dense, "pruned": pruned}, None, {}, prefill=0)
    assert [
        set(r) >= {"params", "MB", "params-ratio"} and "prefill-ms" not in r for r in sizes
    ] == [True, True]


def _coverage(n: int, k: int) -> float:
    """P(x_(k) ≤ median ≤ x_(n+1−k)) by enumerating which of n continuous draws fall below the
    median (each with probability ½, independently): the interval covers it when at least k fall
    below and at least k above."""
    hits = sum(1 for below in itertools.product((0, 1), repeat=n) if k <= sum(below) <= n - k)
    return hits / 2**n


@pytest.mark.parametrize("n", range(1, 22))
def test_median_interval_is_the_narrowest_order_statistic_interval_with_95_percent_coverage(
    n: int,
) -> None:
    values = [
        float(v) for v in np.random.default_rng(n).permutation(n) * 10
    ]  # distinct, shuffled: x_(j) = 10(j−1)
    interval = median_interval(values)
    qualifying = [k for k in range(1, n // 2 + 1) if _coverage(n, k) >= 0.95]
    if not qualifying:
        assert interval is None and n < 6
        return
    k = max(qualifying)
    assert interval == (10.0 * (k - 1), 10.0 * (n - k))
    assert median_interval(values, level=0.5) is not None


def test_median_interval_covers_a_skewed_population_median_at_least_95_percent_of_the_time() -> (
    None
):
    rng = np.random.default_rng(0)
    samples = rng.lognormal(0.0, 1.0, size=(4000, 15))  # population median exp(0) = 1
    intervals = (median_interval(s) for s in samples)
    covered = [lo <= 1.0 <= hi for lo, hi in intervals]  # type: ignore[misc]
    # exact coverage at n = 15: 1 − 2·P(Binom(15, ½) ≤ 3) = 0.965
    assert 0.95 <= np.mean(covered) <= 0.985


def test_speed_table_takes_each_speedup_from_ratios_paired_within_a_repeat(
    eager: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine runs 3× slower in some repeats (for every model of that repeat alike): paired
    ratios stay 2 except in the one repeat where the compiled model alone was slow; the median and
    the interval (n = 7: min–max) are those of the paired ratios, and measured / ceiling carries the
    interval over."""
    compiled = compile_model(eager, masks_with(CASES["keep 0.5"]))
    slow = [1, 3, 1, 3, 1, 3, 3]  # per timed repeat; the warm-up repeat reads 1
    ratio = [2, 2, 2, 2, 2, 2, 4 / 3]
    calls = iter(range(10_000))

    def scripted(
        fn, clock, device
    ) -> float:  # order: repeat, task (prefill, generate), model (dense, compiled)
        i = next(calls)
        rep, model = i // 4, i % 2
        s = 1.0 if rep == 0 else float(slow[rep - 1])
        return 2.0 * s if model == 0 else 2.0 * s / ratio[max(rep - 1, 0)]

    monkeypatch.setattr(speed, "_seconds", scripted)
    row = speed_table(
        {"dense": eager, "keep 0.5": compiled}, 2000, 0, prefill=16, new_tokens=3, repeats=7
    )["keep 0.5"]
    for task in ("prefill", "generate"):
        assert row[f"{task}-speedup"] == pytest.approx(2.0)
        assert (row[f"{task}-speedup-lo"], row[f"{task}-speedup-hi"]) == pytest.approx((4 / 3, 2.0))
        ceiling = row[f"{task}-ceiling"]
        assert (row[f"{task}-of-ceiling-lo"], row[f"{task}-of-ceiling-hi"]) == pytest.approx(
            (4 / 3 / ceiling, 2 / ceiling)
        )
    calls = iter(range(10_000))  # scripted again from the warm-up
    short = speed_table(
        {"dense": eager, "keep 0.5": compiled}, 2000, 0, prefill=16, new_tokens=3, repeats=5
    )
    assert (
        "prefill-speedup-lo" not in short["keep 0.5"]
    )  # 5 repeats: no 95% order-statistic interval
