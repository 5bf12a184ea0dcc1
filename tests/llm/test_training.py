"""Packed training (`pack-sequences`): a step's examples in one row give the padded batch's loss and
gradients on every model variant that trains here; a model that ignores the restarting positions
trains padded; the local training loops (FedIT's `train_steps`, SFT-P's `local_round`) follow the
same trajectory either way."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from fedprune_app.llm.data import collate, encode, normalize_record, pack, training_batches
from fedprune_app.llm.models import load_base_model, load_tokenizer
from fedprune_app.llm.training import packs_exactly, train_steps
from tests.conftest import record_training_batches, small_config
from tests.model_variants import IgnoresPositions, llmpruner, peft, routed, slicegpt

QUESTIONS = [
    ("What comes after one?", ["two", "three"]),
    ("The sky is", ["blue", "a very long answer indeed"]),
    ("Pick a letter of the alphabet that comes early:", ["A", "B"]),
    ("Hi", ["there", "you"]),
    ("Count to four slowly and say each number out loud, please:", ["one two three four", "no"]),
]


def examples() -> list[dict]:
    return [
        normalize_record("t", {"question": q, "choices": c, "label": i % 2})
        for i, (q, c) in enumerate(QUESTIONS)
    ]


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path):
    return load_tokenizer(str(tiny_model_dir))


def test_pack_restarts_positions_and_never_scores_an_example_from_the_one_before(tok) -> None:
    encoded = [encode(tok, e, 64, "sequence") for e in examples()[:3]]
    batch = pack(encoded)
    lengths = [len(x) for x, _ in encoded]
    assert (
        batch["input_ids"].shape
        == batch["labels"].shape
        == batch["position_ids"].shape
        == (1, sum(lengths))
    )
    assert batch["input_ids"][0].tolist() == [t for x, _ in encoded for t in x]
    assert batch["position_ids"][0].tolist() == [p for n in lengths for p in range(n)]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    labels = batch["labels"][0].tolist()
    assert all(labels[s] == -100 for s in starts)
    assert [t for i, t in enumerate(labels) if i not in starts] == [
        t for _, y in encoded for t in y[1:]
    ]
    assert batch["use_cache"] is False and "attention_mask" not in batch


def _loss_and_grads(model: torch.nn.Module, batch: dict) -> tuple[float, list[torch.Tensor]]:
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return float(loss), [
        p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params
    ]


@pytest.mark.parametrize(
    "build",
    [lambda m: m, peft, routed, llmpruner, slicegpt],
    ids=["llama", "peft", "routed", "llmpruner", "slicegpt"],
)
@pytest.mark.parametrize("targets", ["sequence", "answer"])
def test_packed_batch_has_the_padded_loss_and_gradients(
    tiny_model_dir: Path, tok, build, targets: str
) -> None:
    """The models that train in this app (FedIT/FedTPA/FlexLoRA: llama + peft; SFT-P: routed with
    masks; the baselines' recovery: LLM-Pruner compiled, SliceGPT sliced): one packed row = the
    padded batch, to float rounding, for whole-sequence and answer-only targets (examples of 4 to 20
    tokens, so padding is real)."""
    model = build(load_base_model(str(tiny_model_dir))).eval()
    assert packs_exactly(model, tok.pad_token_id)
    encoded = [encode(tok, e, 64, targets) for e in examples()]
    padded_loss, padded_grads = _loss_and_grads(model, collate(encoded, tok.pad_token_id))
    packed_loss, packed_grads = _loss_and_grads(model, pack(encoded))
    assert packed_loss == pytest.approx(padded_loss, abs=1e-5)
    assert padded_grads and any(g.abs().sum() > 0 for g in padded_grads)
    for a, b in zip(padded_grads, packed_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_a_model_that_ignores_the_positions_trains_padded(
    tiny_model_dir: Path, tok, caplog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its attention would let packed examples see each other: the probe refuses, says why, and the
    loop pads."""
    import fedprune_app.llm.training as training

    model = peft(load_base_model(str(tiny_model_dir)))
    model.base_model.model.model.__class__ = IgnoresPositions
    with caplog.at_level(logging.WARNING, logger="fedprune_app.llm.training"):
        assert not packs_exactly(model, tok.pad_token_id)
    assert "training on padded rows" in caplog.text
    seen = record_training_batches(training, monkeypatch)
    train_steps(model, tok, examples(), small_config(tiny_model_dir, local_steps=2), seed=0)
    assert len(seen) == 2 and all(
        "attention_mask" in b and b["input_ids"].shape[0] == 2 for b in seen
    )


def test_train_steps_follow_the_same_trajectory_packed_or_padded(tiny_model_dir: Path, tok) -> None:
    """FedIT's local loop, 4 steps from the same adapters: the same losses and the same trained LoRA
    weights."""
    runs = {}
    for packed in (True, False):
        torch.manual_seed(0)
        model = peft(load_base_model(str(tiny_model_dir)))
        cfg = small_config(
            tiny_model_dir, local_steps=4, batch_size=3, pack_sequences=packed, lora_dropout=0.0
        )
        report = train_steps(model, tok, examples(), cfg, seed=1)
        runs[packed] = (
            report.losses,
            {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
        )
    assert runs[True][0] == pytest.approx(runs[False][0], abs=1e-4)
    for name, weight in runs[False][1].items():
        assert torch.allclose(runs[True][1][name], weight, rtol=1e-3, atol=1e-6), name


def test_training_batches_draw_the_same_examples_packed_or_padded(tok) -> None:
    padded = list(training_batches(examples(), tok, 2, 3, 64, seed=4, targets="sequence"))
    packed = list(
        training_batches(examples(), tok, 2, 3, 64, seed=4, targets="sequence", packed=True)
    )
    for a, b in zip(padded, packed, strict=True):
        assert b["input_ids"][0].tolist() == a["input_ids"][a["attention_mask"] == 1].tolist()


def _linear_output_dtypes(model: torch.nn.Module) -> tuple[set[torch.dtype], list]:
    """The dtypes of every Linear output in training mode (the packing probe runs in eval mode)."""
    seen: set[torch.dtype] = set()
    hooks = [
        m.register_forward_hook(lambda m, _i, out: seen.add(out.dtype) if m.training else None)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    return seen, hooks


@pytest.mark.parametrize("mode, dtype", [("no", torch.float32), ("bf16", torch.bfloat16)])
def test_mixed_precision_runs_the_training_forward_in_its_dtype_and_keeps_the_weights(
    tiny_model_dir: Path, tok, mode: str, dtype: torch.dtype
) -> None:
    """`mixed-precision`: the linear layers of a training step compute in bf16 under 'bf16' (float32
    under 'no'); the trained LoRA weights stay float32 and move; the loss stays near the float32
    one."""
    losses = {}
    for m in ("no", mode):
        torch.manual_seed(0)
        model = peft(load_base_model(str(tiny_model_dir)))
        before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        seen, hooks = _linear_output_dtypes(model)
        report = train_steps(
            model,
            tok,
            examples(),
            small_config(tiny_model_dir, local_steps=2, mixed_precision=m, lora_dropout=0.0),
            seed=1,
        )
        for h in hooks:
            h.remove()
        losses[m] = report.losses
        trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
        assert all(p.dtype == torch.float32 for p in trained.values())
        assert any(not torch.equal(before[n], p) for n, p in trained.items())
    assert seen == {dtype}
    assert losses[mode] == pytest.approx(losses["no"], rel=0.02)


def _trained(model_dir: Path, tok, variant, monkeypatch: pytest.MonkeyPatch | None):
    """Two bf16 steps of a LoRA model (`variant` wraps it); with `monkeypatch`, the frozen weights
    are left to autocast's per-call cast."""
    import contextlib

    from fedprune_app.llm import training

    torch.manual_seed(0)
    base = load_base_model(str(model_dir))
    base.lm_head.weight = base.model.embed_tokens.weight  # tied, as SmolLM2's
    model = variant(peft(base))
    if monkeypatch is not None:
        monkeypatch.setattr(training, "frozen_weights_as", lambda m, mode: contextlib.nullcontext())
    cfg = small_config(model_dir, local_steps=3, mixed_precision="bf16", lora_dropout=0.0)
    report = train_steps(model, tok, examples(), cfg, seed=1)
    return report.losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("variant", [lambda m: m, routed], ids=["peft", "routed"])
def test_frozen_weights_cast_once_give_autocasts_results_bit_for_bit(
    tiny_model_dir: Path, tok, variant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under bf16 the frozen linear weights are cast once per loop instead of per call: the same
    losses and the same trained (and untouched) weights, exactly, as autocast's own casts."""
    losses, params = _trained(tiny_model_dir, tok, variant, None)
    ref_losses, ref_params = _trained(tiny_model_dir, tok, variant, monkeypatch)
    assert losses == ref_losses
    assert params.keys() == ref_params.keys()
    assert all(p.dtype == ref_params[n].dtype for n, p in params.items())
    assert all(torch.equal(p, ref_params[n]) for n, p in params.items())


def test_frozen_weights_are_cast_in_the_block_and_restored_after(tiny_model_dir: Path) -> None:
    from fedprune_app.llm.training import frozen_weights_as

    base = load_base_model(str(tiny_model_dir))
    base.lm_head.weight = base.model.embed_tokens.weight
    model = peft(base)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with frozen_weights_as(model, "bf16"):
        dtypes = {n: p.dtype for n, p in model.named_parameters()}
    frozen_linear = [n for n in dtypes if "base_layer.weight" in n]
    assert frozen_linear and all(dtypes[n] == torch.bfloat16 for n in frozen_linear)
    assert all(dtypes[n] == torch.float32 for n in dtypes if "lora_" in n)  # trainable: autocast's
    assert dtypes["base_model.model.model.embed_tokens.weight"] == torch.float32  # tied: a lookup
    assert all(
        torch.equal(p, before[n]) and p.dtype == before[n].dtype
        for n, p in model.named_parameters()
    )
    with frozen_weights_as(model, "no"):
        assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_auto_mixed_precision_is_bf16_only_where_the_device_computes_it_natively(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedprune_app.llm import training

    cpu = torch.device("cpu")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    for avx512_bf16, amx, expected in [
        (True, True, torch.bfloat16),
        (False, True, torch.bfloat16),
        (True, False, None),  # AVX512_BF16 alone: slower than float32 (precision-avx512-bf16-cap)
        (False, False, None),  # emulated bf16: slower than float32, so none
    ]:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert training.autocast_dtype("auto", cpu) is expected
        assert training.autocast_dtype("bf16", cpu) is torch.bfloat16  # asked for: always
    # oneDNN capped below AMX (how `fedprune bench profile --isa` stands in for an older CPU):
    # 'auto' is float32 there even on an AMX CPU
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    for cap, expected in [
        ("AVX2", None),
        ("avx512_core", None),
        ("AVX512_CORE_BF16", None),
        ("AVX512_CORE_AMX", torch.bfloat16),
        ("AVX10_1_512_AMX", torch.bfloat16),
        ("ALL", torch.bfloat16),
        ("", torch.bfloat16),
    ]:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert training.autocast_dtype("auto", cpu) is expected, cap
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert training.autocast_dtype("no", cpu) is None
    assert training.autocast_dtype("fp16", cpu) is torch.float16
    assert training.autocast_dtype("auto", torch.device("meta")) is None
