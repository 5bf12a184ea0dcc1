"""Device placement (run-config `device`) without a GPU: the key, the load-time errors, what
`load_base_model` asks transformers for, every input path following `model_device`, allocations
following their inputs' device (a `meta` tensor stands in for a GPU: mixing it with CPU tensors
raises), and the CPU paths with device=cpu."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import clients.fedtpa
import clients.sftp
import fedprune_app.llm.evaluation
import fedprune_app.llm.training
import fedprune_app.methods.fedspallm.pruners
import fedprune_app.methods.sftp.models
import fedprune_app.structural.held
import fedprune_app.structural.speed
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.llm import models
from fedprune_app.llm.data import Example, instruction_example, text_example
from fedprune_app.llm.models import load_base_model, model_device, peft_model_for, resolve_device
from tests.conftest import small_config

META = torch.device("meta")
CPU = torch.device("cpu")


def examples(n: int = 6) -> list[Example]:
    return [instruction_example("t", f"Add {i} and {i}.", str(2 * i)) for i in range(n)]


def fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


# --- the key and resolve_device -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_every_allowed_form_parses_without_a_gpu(value: str) -> None:
    """The server may have no GPU while its clients do: parsing never looks at CUDA."""
    assert RunConfig.from_flower({"device": value}).device == value


@pytest.mark.parametrize(
    "bad", ["gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cpu:0", " cpu", "mps"]
)
def test_a_bad_device_names_the_key_and_the_allowed_values(bad: str) -> None:
    for check in (lambda: RunConfig.from_flower({"device": bad}), lambda: resolve_device(bad)):
        with pytest.raises(ConfigError, match=r"'device'.*'auto', 'cpu', 'cuda' or 'cuda:<index>'"):
            check()


def test_default_is_auto() -> None:
    assert RunConfig.from_flower({}).device == "auto"


def test_resolve_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, 0)
    assert resolve_device("auto") == CPU and resolve_device("cpu") == CPU
    assert resolve_device(RunConfig.from_flower({"device": "cpu"})) == CPU
    for value in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError, match=r"'device' is 'cuda.*no CUDA device.*'auto'"):
            resolve_device(value)


def test_resolve_with_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == CPU
    with pytest.raises(ConfigError, match=r"'device' is 'cuda:2'.*2 CUDA device"):
        resolve_device("cuda:2")


def test_asking_for_cuda_without_cuda_fails_at_load(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clear error comes from the model loaders (CUDA's absence faked, so a GPU machine runs the
    same test), not from config parsing."""
    from fedprune_app.llm.layers import dense_model
    from fedprune_app.methods.sftp.models import routed_model

    fake_cuda(monkeypatch, 0)
    cfg = small_config(tiny_model_dir, device="cuda")  # parses
    for load in (
        lambda: load_base_model(str(tiny_model_dir), device="cuda"),
        lambda: peft_model_for(cfg),
        lambda: dense_model(cfg),
        lambda: routed_model(cfg.replace(method="sftp")),
    ):
        with pytest.raises(
            ConfigError, match="'device' is 'cuda' but this process sees no CUDA device"
        ):
            load()


@pytest.mark.parametrize(
    ("device", "quantization", "expected"),
    [
        ("cpu", "none", None),
        ("auto", "none", {"": "cuda"}),
        ("cuda:1", "none", {"": "cuda:1"}),
        ("auto", "4bit", "auto"),
        ("cuda", "8bit", "auto"),
        ("cuda:1", "4bit", {"": "cuda:1"}),
        ("cpu", "4bit", {"": "cpu"}),
    ],
)
def test_what_load_base_model_asks_transformers_for(
    monkeypatch: pytest.MonkeyPatch, device: str, quantization: str, expected: Any
) -> None:
    """With 2 (pretended) GPUs: a plain model is loaded straight onto its one device, a quantized
    one gets bitsandbytes' 'auto' map unless one device is named."""
    from transformers import AutoModelForCausalLM

    fake_cuda(monkeypatch, 2)
    seen: dict[str, Any] = {}

    def fake_from_pretrained(_path: str, **kwargs: Any) -> nn.Module:
        seen.update(kwargs)
        return nn.Linear(1, 1)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    load_base_model("some/model", "float32", quantization, device)
    assert seen.get("device_map") == expected
    assert ("quantization_config" in seen) == (quantization != "none")


def test_model_device_reads_the_input_embeddings_else_the_first_parameter(
    tiny_model_dir: Path,
) -> None:
    model, _ = peft_model_for(small_config(tiny_model_dir, device="cpu"))
    assert model_device(model) == CPU
    assert model_device(nn.Linear(2, 2, device="meta")) == META


# --- every input path follows model_device --------------------------------------------------------


class _Seen(Exception):
    pass


@contextmanager
def inputs_recorded(
    model: nn.Module, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[list, list]]:
    """`model_device` (in every module that feeds a model) answers META and records its argument;
    the model's input embedding records the device of the token ids it receives and stops the call
    there (a meta tensor cannot go further through a CPU model). Yields (models asked about, devices
    of the ids received)."""
    asked: list[nn.Module] = []
    received: list[torch.device] = []

    def spy(m: nn.Module) -> torch.device:
        asked.append(m)
        return META

    for module in (
        fedprune_app.llm.training,
        fedprune_app.llm.evaluation,
        fedprune_app.methods.fedspallm.pruners,
        fedprune_app.methods.sftp.models,
        fedprune_app.structural.held,
        fedprune_app.structural.speed,
        clients.fedtpa,
        clients.sftp,
    ):
        monkeypatch.setattr(module, "model_device", spy)

    def hook(_module: nn.Module, args: tuple) -> None:
        received.append(args[0].device)
        raise _Seen

    handle = model.get_input_embeddings().register_forward_pre_hook(hook)
    try:
        yield asked, received
    finally:
        handle.remove()
        model.eval()


def test_training_and_evaluation_inputs_go_to_the_models_device(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clients.fedtpa import mean_feature
    from fedprune_app.llm.evaluation import generate, mean_loss, perplexity
    from fedprune_app.llm.training import train_steps

    cfg = small_config(tiny_model_dir, device="cpu")
    model, tok = peft_model_for(cfg)
    calls = {
        "train_steps": lambda: train_steps(model, tok, examples(), cfg, seed=0, steps=1),
        "perplexity": lambda: perplexity(model, tok, "one two three four five six seven", 4, 4),
        "mean_loss": lambda: mean_loss(model, tok, examples(), 32),
        "mean_feature": lambda: mean_feature(model, tok, examples(), 32),
        "generate": lambda: generate(model, tok, ["Add 1 and 1."], max_new_tokens=2),
    }
    for name, call in calls.items():
        with inputs_recorded(model, monkeypatch) as (asked, received), pytest.raises(_Seen):
            if (
                name == "generate"
            ):  # HF's generate inspects its ids (.item()) before the first forward

                def fake_generate(**kwargs: Any) -> None:
                    received.extend(
                        {t.device for t in kwargs.values() if isinstance(t, torch.Tensor)}
                    )
                    raise _Seen

                monkeypatch.setattr(model, "generate", fake_generate)
            call()
        assert asked and all(m is model for m in asked), name
        # train_steps also feeds the packing probe (`packs_exactly`), on the same device
        assert received and set(received) == {META}, (
            f"{name} fed the model on {received}, not on the device model_device named"
        )
    monkeypatch.delattr(model, "generate")


def test_pruning_and_sftp_inputs_go_to_the_models_device(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedprune_app.llm.layers import calibration_batches, dense_model
    from fedprune_app.methods.fedspallm.pruners import prune_sequentially, pruner_for
    from fedprune_app.methods.sftp.generator import generator_for
    from fedprune_app.methods.sftp.local import ClientState, RoundPlan, local_round
    from fedprune_app.methods.sftp.models import routed_model

    cfg = small_config(tiny_model_dir, device="cpu")
    model, tok = dense_model(cfg)
    batches = calibration_batches(examples(), tok, 2, 16, seed=0)
    with inputs_recorded(model, monkeypatch) as (asked, received), pytest.raises(_Seen):
        prune_sequentially(model, batches, [0], pruner_for(cfg))
    assert asked == [model] and received == [META]

    cfg = small_config(tiny_model_dir, device="cpu", method="sftp", sftp_conditioning=False)
    model, tok = routed_model(cfg)
    generator = generator_for(cfg, model.config, seed=0)
    with inputs_recorded(model, monkeypatch) as (asked, received), pytest.raises(_Seen):
        local_round(cfg, model, tok, generator, ClientState(None), examples(), RoundPlan(1, 0, 0.5))
    assert (
        asked and all(m is model for m in asked) and received and set(received) == {META}
    )  # probe included


def test_speed_table_times_each_model_on_its_device(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled-models table (SFT-P, LLM-Pruner, SliceGPT) builds its prompt on the CPU: it must
    move it to each model's device (found on an H200: a CPU prompt into a CUDA model raised in the
    embedding's index_select)."""
    from fedprune_app.llm.layers import dense_model
    from fedprune_app.structural.speed import speed_table

    model, _ = dense_model(small_config(tiny_model_dir, device="cpu"))
    with inputs_recorded(model, monkeypatch) as (asked, received), pytest.raises(_Seen):
        speed_table(
            {"dense": model},
            int(model.config.vocab_size),
            model.config.eos_token_id,
            prefill=8,
            new_tokens=1,
            repeats=1,
        )
    assert asked == [model] and received == [META]


# --- allocations follow their inputs' device (meta raises when mixed with the CPU) ----------------


def test_input_stats_and_hessians_live_on_the_inputs_device_in_float32() -> None:
    from fedprune_app.methods.fedspallm.pruners import collect_input_stats

    layer = nn.Sequential(nn.Linear(8, 8, device="meta", dtype=torch.bfloat16))
    x = torch.zeros(2, 3, 8, device="meta", dtype=torch.bfloat16)
    for needs in ("hessian", "norms"):
        stats = collect_input_stats(layer, {"0": layer[0]}, [x, x], [{}, {}], needs)["0"]
        assert stats.sq_norms.device == META and stats.sq_norms.dtype == torch.float32
        assert stats.hessian.device == META and stats.hessian.dtype == torch.float32
        assert stats.hessian.shape == ((8, 8) if needs == "hessian" else (0, 0))


def test_contribution_ema_lives_on_the_adapters_device() -> None:
    from fedprune_app.methods.fedtpa.rank_pruning import ContributionTracker

    lora = nn.Module()
    lora.lora_A = nn.ModuleDict({"default": nn.Linear(6, 2, bias=False, device="meta")})
    lora.lora_B = nn.ModuleDict({"default": nn.Linear(2, 5, bias=False, device="meta")})
    initial = {
        "l.lora_A": torch.ones(2, 6)
    }  # last round's EMA comes back from context.state on the CPU
    tracker = ContributionTracker({"l": lora}, 0.85, initial)
    assert {t.device for t in tracker.ema.values()} == {META}
    assert tracker.scores().shape == (1, 2)


def test_sftp_masks_budget_and_routing_follow_the_hidden_states() -> None:
    from fedprune_app.methods.sftp.generator import generator_for
    from fedprune_app.methods.sftp.objective import budget_penalty
    from fedprune_app.structural.routing import MASK_NAMES, kept_parameters, merge, route

    config = type(
        "Config",
        (),
        {
            "hidden_size": 4,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "intermediate_size": 8,
            "num_hidden_layers": 1,
        },
    )()
    masks = [{n: torch.ones(4, device="meta") for n in MASK_NAMES}]
    kept = kept_parameters(config, masks)
    assert kept.device == META and budget_penalty(kept, 10.0).device == META
    x, g_cpu = (
        torch.zeros(2, 3, 4, device="meta"),
        torch.ones(4),
    )  # masks from a generator left on the CPU
    norm = nn.RMSNorm(4, eps=1e-6, device="meta")
    assert route(x, g_cpu, norm).device == META and merge(x, x, g_cpu).device == META
    cfg = RunConfig.from_flower({"method": "sftp"})
    assert {p.device for p in generator_for(cfg, config, seed=0, device="meta").parameters()} == {
        META
    }


# --- the CPU paths, device=cpu explicitly ---------------------------------------------------------


def test_cpu_paths_run_with_device_cpu(tiny_model_dir: Path) -> None:
    import numpy as np

    from fedprune_app.llm.evaluation import generate, mean_loss, perplexity
    from fedprune_app.llm.layers import calibration_batches, dense_model, prunable_weights
    from fedprune_app.llm.training import train_steps
    from fedprune_app.methods.fedspallm.pruners import prune_sequentially, pruner_for, sparsity_of

    cfg = small_config(tiny_model_dir, device="cpu")
    model, tok = peft_model_for(cfg)
    assert {p.device for p in model.parameters()} == {CPU}
    assert all(np.isfinite(train_steps(model, tok, examples(), cfg, seed=0, steps=2).losses))
    assert np.isfinite(perplexity(model, tok, "one two three four five six seven eight", 4, 4))
    assert np.isfinite(mean_loss(model, tok, examples(), 32))
    assert len(generate(model, tok, ["Add 1 and 1."], max_new_tokens=2)) == 1
    assert {v.device for v in models.get_adapter_state(model).values()} == {CPU}

    pruned, tok = dense_model(cfg)
    batches = calibration_batches(
        [text_example("t", " ".join(map(str, range(200))))], tok, 4, 16, seed=0
    )
    masks = prune_sequentially(pruned, batches, [0, 1], pruner_for(cfg))
    assert (
        masks
        and {m.device for m in masks.values()} == {CPU}
        and {m.dtype for m in masks.values()} == {torch.bool}
    )
    assert all(abs(sparsity_of(m) - 0.5) < 0.02 for m in masks.values())
    weights, _, _ = prunable_weights(cfg)  # restores the dense copy, kept on the CPU
    assert {w.dtype for w in weights.values()} == {np.dtype(np.float32)}
