"""A compiled SFT-P / fedflap model directory is a standard Hugging Face model directory (§3.1,
Appx. A.1): it loads with `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` (also
where fedprune is not installed), computes what `load_compiled` and the masked training form
compute, and `load_compiled` still reads the directories written before the HF model class (format
"fedprune-compiled/1")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from fedprune_app.llm.models import load_base_model
from fedprune_app.structural.hf.configuration_fedprune_routed_llama import decode_lane, encode_lane
from fedprune_app.structural.routing import (
    MASK_NAMES,
    FedpruneRoutedLlamaForCausalLM,
    LayerMasks,
    compile_model,
    install_routing,
    load_compiled,
    masked,
    save_compiled,
)
from tests.methods.hf_checks import (  # noqa: F401 (modules_cache: a fixture)
    ALLOWED_IMPORTS,
    absolute_imports,
    load_without_fedprune,
    modules_cache,
)

D = 64  # tiny LLaMA hidden size


def _masks(seed: int) -> list[LayerMasks]:
    gen = torch.Generator().manual_seed(seed)
    masks = [{n: torch.rand(D, generator=gen) < 0.6 for n in MASK_NAMES} for _ in range(2)]
    masks[1]["ffn-in"].zero_()  # a skipped MLP
    masks[0]["attn-out"][:] = True  # a full lane (no index ops)
    return masks


@pytest.fixture(scope="module")
def saved(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny LLaMA (weights scaled so greedy decoding depends on the context), its masked-form
    logits, and its compiled form saved with the tokenizer by `save_compiled`."""
    from transformers import AutoTokenizer

    model = load_base_model(str(tiny_model_dir), device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    masks = _masks(seed=3)
    ids = torch.randint(0, 2000, (2, 9), generator=torch.Generator().manual_seed(1))
    install_routing(model)
    with masked(model, masks), torch.no_grad():
        routed = model(input_ids=ids).logits
    compiled = compile_model(model, masks)
    out = tmp_path_factory.mktemp("compiled") / "client-0"
    save_compiled(compiled, out, AutoTokenizer.from_pretrained(tiny_model_dir))
    return {
        "dir": out,
        "ids": ids,
        "masked": routed,
        "compiled": compiled,
        "base": model,
        "masks": masks,
    }


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_lane_bitmasks_round_trip_and_reject_coordinates_beyond_the_bus() -> None:
    assert encode_lane([]) == "0" and decode_lane("0", D) == []
    assert encode_lane([0, 3, 63]) == format((1 << 63) | 8 | 1, "x")
    lane = sorted(torch.randperm(D)[:37].tolist())
    assert decode_lane(encode_lane(lane), D) == lane
    with pytest.raises(ValueError, match="hidden_size 64"):
        decode_lane(encode_lane([64]), D)


def test_the_directory_is_a_standard_hf_model_directory(saved: dict) -> None:
    out = saved["dir"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "fedprune_routed_llama" and config["base_model_type"] == "llama"
    assert config["architectures"] == ["FedpruneRoutedLlamaForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_fedprune_routed_llama.FedpruneRoutedLlamaConfig",
        "AutoModelForCausalLM": "modeling_fedprune_routed_llama.FedpruneRoutedLlamaForCausalLM",
    }
    for layer, g in zip(config["lanes"], saved["masks"], strict=True):
        for name in MASK_NAMES:
            assert decode_lane(layer[name], D) == torch.nonzero(g[name]).flatten().tolist()
    for code in ("configuration_fedprune_routed_llama.py", "modeling_fedprune_routed_llama.py"):
        assert absolute_imports(out / code) <= ALLOWED_IMPORTS, code
    assert {"model.safetensors", "generation_config.json", "tokenizer.json", "routing.json"} <= {
        p.name for p in out.iterdir()
    }


def test_auto_model_with_trust_remote_code_equals_load_compiled_and_the_masked_form(
    saved: dict,
    modules_cache: Path,  # noqa: F811 (fixture)
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = saved["ids"]
    auto = AutoModelForCausalLM.from_pretrained(saved["dir"], trust_remote_code=True)
    assert type(auto).__module__.startswith(
        "transformers_modules."
    )  # the directory's copy, not fedprune's class
    assert any(modules_cache.rglob("modeling_fedprune_routed_llama.py"))
    ours = load_compiled(saved["dir"])
    assert (
        isinstance(ours, FedpruneRoutedLlamaForCausalLM) and not ours.training and not auto.training
    )
    expected = _logits(ours, ids)
    torch.testing.assert_close(expected, _logits(saved["compiled"], ids), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_logits(auto, ids), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_logits(auto, ids), saved["masked"], atol=1e-4, rtol=1e-5)
    assert auto.model.layers[1].mlp is None  # the skipped MLP stays skipped
    wide = auto.model.layers[0].self_attn.qkv_proj.weight
    assert wide.stride() == (1, wide.shape[0])  # the input-major layout is restored after loading
    prompt = ids[:1, :5]
    greedy = saved["compiled"].generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert len(set(greedy[0, 5:].tolist())) > 1  # not a degenerate repetition
    assert torch.equal(
        auto.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False), greedy
    )
    tokenizer = AutoTokenizer.from_pretrained(saved["dir"], trust_remote_code=True)
    assert (
        tokenizer("the same text")["input_ids"]
        == AutoTokenizer.from_pretrained(saved["base"].config.name_or_path)("the same text")[
            "input_ids"
        ]
    )


def test_without_trust_remote_code_the_error_names_the_option(
    saved: dict,
    modules_cache: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers 5.23 asks y/N on a terminal (15 s) and, where it cannot ask, raises this
    ValueError."""
    import builtins

    from transformers import AutoModelForCausalLM, AutoTokenizer

    def no_terminal(prompt: str = "") -> str:
        raise EOFError

    monkeypatch.setattr(builtins, "input", no_terminal)
    with pytest.raises(
        ValueError, match=r"custom code[\s\S]*Please pass the argument `trust_remote_code=True`"
    ):
        AutoModelForCausalLM.from_pretrained(saved["dir"])
    # the tokenizer still loads without the option (transformers falls back to the plain config)
    assert (
        AutoTokenizer.from_pretrained(saved["dir"])("abc")["input_ids"]
        == AutoTokenizer.from_pretrained(saved["dir"], trust_remote_code=True)("abc")["input_ids"]
    )


def test_loads_where_fedprune_cannot_be_imported(saved: dict, tmp_path: Path) -> None:
    """A fresh interpreter in which every `fedprune_app` import fails loads the directory through
    the Auto classes (only torch + transformers), and computes the logits and greedy tokens of the
    compiled model."""
    module = load_without_fedprune(saved["dir"], saved["compiled"], saved["ids"], tmp_path)
    assert module.startswith("transformers_modules.")


def test_load_compiled_reads_directories_written_before_the_hf_class(
    saved: dict, tmp_path: Path
) -> None:
    """The old writer: the base model's config.json, routing.json ("fedprune-compiled/1": lanes as
    index lists + bias flags), safetensors' `save_model` of the compiled model,
    generation_config.json."""
    from safetensors.torch import save_model

    compiled, old = saved["compiled"], tmp_path / "old"
    old.mkdir()
    saved["base"].config.save_pretrained(old)
    compiled.generation_config.save_pretrained(old)
    meta = {
        "format": "fedprune-compiled/1",
        "layers": [
            {"routing": layer.routing, "bias": layer.bias_flags} for layer in compiled.model.layers
        ],
    }
    (old / "routing.json").write_text(json.dumps(meta))
    save_model(compiled, str(old / "model.safetensors"))
    assert json.loads((old / "config.json").read_text())["model_type"] == "llama"
    loaded = load_compiled(old)
    assert isinstance(loaded, FedpruneRoutedLlamaForCausalLM) and loaded.model.layers[1].mlp is None
    torch.testing.assert_close(
        _logits(loaded, saved["ids"]), _logits(compiled, saved["ids"]), atol=1e-6, rtol=0
    )
    (old / "routing.json").write_text(json.dumps({**meta, "format": "something-else"}))
    with pytest.raises(ValueError, match="not a compiled fedprune model"):
        load_compiled(old)


def test_bfloat16_compiled_models_keep_their_dtype(
    tiny_model_dir: Path,
    saved: dict,
    tmp_path: Path,
    modules_cache: Path,  # noqa: F811 (fixture)
) -> None:
    from transformers import AutoModelForCausalLM

    base = load_base_model(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    compiled = compile_model(base, saved["masks"])
    save_compiled(compiled, tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    for model in (
        load_compiled(tmp_path / "bf16"),
        AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", trust_remote_code=True),
    ):
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        assert torch.equal(_logits(model, saved["ids"]), _logits(compiled, saved["ids"]))


def test_save_compiled_takes_only_compiled_models(saved: dict, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="output of compile_model"):
        save_compiled(saved["base"], tmp_path / "x")
