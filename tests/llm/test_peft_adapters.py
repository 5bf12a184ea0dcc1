"""The final adapters of FedIT, FedTPA, FlexLoRA and SFT-P are standard PEFT directories:
`PeftModel.from_pretrained` on the base model computes what the run's adapted model computes;
FlexLoRA's per-client adapters are the best rank-r_k approximations of the global ΔW (Eckart–Young);
`save-merged` also writes full models that plain `AutoModelForCausalLM.from_pretrained` loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.core.protocol import numpy_state
from fedprune_app.core.replies import to_record
from fedprune_app.llm.lora import LORA_A, LORA_B, adapter_layers
from fedprune_app.llm.models import load_base_model
from fedprune_app.methods.flexlora.svd import svd_factors
from strategies.fedit import FedITStrategy
from strategies.fedtpa import FedTPAStrategy
from strategies.flexlora import FlexLoRAStrategy
from strategies.sftp import SFTPStrategy
from tests.conftest import small_config

IDS = torch.tensor([[1, 20, 300, 4000, 5, 77, 901], [3, 3, 2500, 12, 8, 640, 41]])
ALPHA = 8.0


def _config(tiny_model_dir: Path, method: str, **overrides: object) -> RunConfig:
    extra: dict[str, object] = {
        "flexlora": {"flexlora_ranks": "2,4"},
        "fedtpa": {"fedtpa_warmup_steps": 1},
        "sftp": {"keep_ratios": "0.8,0.5", "eval_ppl_tokens": 0},
    }.get(method, {})
    return small_config(
        tiny_model_dir, method=method, lora_rank=4, lora_alpha=ALPHA, **extra, **overrides
    )


def _trained(arrays: ArrayRecord, seed: int) -> ArrayRecord:
    """The initial arrays with every LoRA tensor random (B ≠ 0: the adapter changes the output), the
    rest kept."""
    rng = np.random.default_rng(seed)
    return to_record(
        {
            k: (rng.normal(0.0, 0.3, v.shape).astype(np.float32) if ".lora_" in k else v)
            for k, v in numpy_state(arrays).items()
        }
    )


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _peft_loaded(tiny_model_dir: Path, adapter: Path) -> torch.nn.Module:
    from peft import PeftModel

    return PeftModel.from_pretrained(
        load_base_model(str(tiny_model_dir), device="cpu"), adapter
    ).eval()


STRATEGIES = {
    "fedit": FedITStrategy,
    "fedtpa": FedTPAStrategy,
    "flexlora": FlexLoRAStrategy,
    "sftp": SFTPStrategy,
}


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_final_adapter_loads_with_peft_and_equals_the_runs_model(
    method: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = _config(tiny_model_dir, method)
    strategy = STRATEGIES[method](cfg)
    arrays = _trained(strategy.initial_arrays(), seed=1)
    artefacts = strategy.report_class(strategy).save_final(arrays, tmp_path)
    assert artefacts["adapter"] == "adapter" and "merged" not in artefacts
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in (tmp_path / "adapter").iterdir()
    }
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (
        4,
        ALPHA,
        "LORA",
    )  # r_g, r_max: 4
    if method == "sftp":  # Φ on the dense backbone: the routed model with no masks
        model, _, _ = strategy.load(arrays)  # dense outside a `masked` block
    else:
        model, _ = strategy.global_model(arrays)
    expected = _logits(model)
    assert not torch.allclose(
        expected, _logits(load_base_model(str(tiny_model_dir), device="cpu")), atol=1e-3
    )
    torch.testing.assert_close(
        _logits(_peft_loaded(tiny_model_dir, tmp_path / "adapter")), expected, atol=1e-5, rtol=1e-5
    )


def test_flexlora_writes_each_clients_adapter_at_its_rank(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Client k's adapter: rank r_k in adapter_config.json, and W + ΔW equal to W plus the best
    rank-r_k approximation (numpy SVD) of the global ΔW."""
    strategy = FlexLoRAStrategy(_config(tiny_model_dir, "flexlora"))
    initial = numpy_state(strategy.initial_arrays())
    rng = np.random.default_rng(2)
    deltas, state = {}, {}
    for layer in adapter_layers(initial):
        out_dim, in_dim = initial[layer + LORA_B].shape[0], initial[layer + LORA_A].shape[1]
        deltas[layer] = rng.normal(0.0, 0.05, (out_dim, in_dim)).astype(np.float32)
        state[layer + LORA_B], state[layer + LORA_A], _ = svd_factors(deltas[layer], 4, ALPHA)
    global_delta = {
        layer: (ALPHA / 4) * state[layer + LORA_B] @ state[layer + LORA_A] for layer in deltas
    }
    strategy.partition_rank = {0: 2, 1: 4}
    artefacts = strategy.report_class(strategy).save_final(to_record(state), tmp_path)
    assert artefacts["adapter-client-0"] == "client-adapters/client-0"
    base = dict(load_base_model(str(tiny_model_dir), device="cpu").named_parameters())
    for pid, rank in strategy.partition_rank.items():
        folder = tmp_path / "client-adapters" / f"client-{pid}"
        assert json.loads((folder / "adapter_config.json").read_text())["r"] == rank
        merged = dict(_peft_loaded(tiny_model_dir, folder).merge_and_unload().named_parameters())
        for layer, delta in global_delta.items():
            u, s, vt = np.linalg.svd(delta.astype(np.float64), full_matrices=False)
            best = (u[:, :rank] * s[:rank]) @ vt[
                :rank
            ]  # Eckart–Young: the best rank-r approximation
            name = layer.removeprefix("base_model.model.") + ".weight"
            np.testing.assert_allclose(
                (merged[name] - base[name]).detach().numpy(), best, atol=2e-6
            )


def test_save_merged_writes_models_that_plain_auto_classes_load(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    strategy = FlexLoRAStrategy(_config(tiny_model_dir, "flexlora", save_merged=True))
    arrays = _trained(strategy.initial_arrays(), seed=3)
    strategy.partition_rank = {1: 2}
    artefacts = strategy.report_class(strategy).save_final(arrays, tmp_path)
    assert (
        artefacts["merged"] == "merged" and artefacts["merged-client-1"] == "client-merged/client-1"
    )
    for adapter, merged in (
        ("adapter", "merged"),
        ("client-adapters/client-1", "client-merged/client-1"),
    ):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / merged)
        assert json.loads((tmp_path / merged / "config.json").read_text())["model_type"] == "llama"
        assert not any("lora" in n for n, _ in model.named_parameters())
        torch.testing.assert_close(
            _logits(model),
            _logits(_peft_loaded(tiny_model_dir, tmp_path / adapter)),
            atol=1e-5,
            rtol=1e-5,
        )
        assert (
            AutoTokenizer.from_pretrained(tmp_path / merged)("abc")["input_ids"]
            == AutoTokenizer.from_pretrained(tiny_model_dir)("abc")["input_ids"]
        )
    model, _ = strategy.global_model(
        arrays
    )  # the cached model keeps its adapters (merged on a copy)
    assert any("lora_A" in n for n, _ in model.named_parameters())


def test_save_merged_rejects_quantized_models(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="'save-merged'.*model-quantization = 'none'.*'4bit'"):
        _config(tiny_model_dir, "fedit", save_merged=True, model_quantization="4bit")
