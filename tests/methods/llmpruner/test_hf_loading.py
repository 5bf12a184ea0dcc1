"""A compiled llmpruner directory (`save_pruned`) is a standard Hugging Face model directory
(LLM-Pruner §3.1: whole kv groups and MLP channels removed): it loads with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` (also where fedprune cannot be
imported), computes what `compile_pruned` / `load_pruned` and the masked dense model compute, and
`load_pruned` still reads the directories written before the HF model class."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedprune_app.llm.models import load_base_model
from fedprune_app.methods.llmpruner.hf import FedprunePrunedLlamaForCausalLM
from fedprune_app.methods.llmpruner.importance import dims
from fedprune_app.methods.llmpruner.structure import (
    compile_pruned,
    load_pruned,
    save_pruned,
    shrink_,
    structure_json,
    zero_pruned_,
)
from tests.methods.hf_checks import (
    ALLOWED_IMPORTS,
    absolute_imports,
    check_auto_and_loader,
    load_without_fedprune,
    logits,
    modules_cache,  # noqa: F401 (fixture)
)


@pytest.fixture(scope="module")
def saved(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny LLaMA (weights scaled so greedy decoding depends on the context), a structure with
    uneven layers, the masked dense model's logits, and the compiled model saved with the tokenizer
    by `save_pruned`."""
    from transformers import AutoTokenizer

    base = load_base_model(str(tiny_model_dir), device="cpu")
    with torch.no_grad():
        for p in base.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    s = dims(base.config)
    keep = {
        "heads": np.array([[True, False], [True, True]]),
        "channels": np.ones((2, s["inter"]), bool),
    }
    keep["channels"][0, ::3] = False
    keep["channels"][1, 7:50] = False
    ids = torch.randint(0, 2000, (2, 9), generator=torch.Generator().manual_seed(1))
    masked = logits(zero_pruned_(copy.deepcopy(base), keep), ids)
    compiled = compile_pruned(base, keep)
    out = tmp_path_factory.mktemp("llmpruner") / "compiled"
    save_pruned(compiled, out, AutoTokenizer.from_pretrained(tiny_model_dir))
    return {
        "dir": out,
        "ids": ids,
        "base": base,
        "keep": keep,
        "compiled": compiled,
        "masked": masked,
    }


def test_the_directory_is_a_standard_hf_model_directory(saved: dict[str, Any]) -> None:
    out = saved["dir"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "fedprune_pruned_llama" and config["base_model_type"] == "llama"
    assert config["architectures"] == ["FedprunePrunedLlamaForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_fedprune_pruned_llama.FedprunePrunedLlamaConfig",
        "AutoModelForCausalLM": "modeling_fedprune_pruned_llama.FedprunePrunedLlamaForCausalLM",
    }
    assert config["llmpruner_structure"] == structure_json(saved["keep"])
    for code in ("configuration_fedprune_pruned_llama.py", "modeling_fedprune_pruned_llama.py"):
        assert absolute_imports(out / code) <= ALLOWED_IMPORTS, code
    assert {"model.safetensors", "generation_config.json", "tokenizer.json", "structure.json"} <= {
        p.name for p in out.iterdir()
    }


def test_auto_model_with_trust_remote_code_equals_load_pruned_and_the_masked_model(
    saved: dict[str, Any],
    modules_cache: Path,  # noqa: F811 (fixture)
) -> None:
    ids, compiled = saved["ids"], saved["compiled"]
    auto = check_auto_and_loader(
        saved["dir"], compiled, load_pruned, FedprunePrunedLlamaForCausalLM, ids, modules_cache
    )
    # = the dense model with the pruned structures zeroed in place
    torch.testing.assert_close(logits(compiled, ids), saved["masked"], atol=1e-5, rtol=1e-5)
    attn = auto.model.layers[0].self_attn
    assert attn.k_proj.out_features == attn.head_dim and auto.model.layers[
        1
    ].mlp.gate_proj.out_features == int(saved["keep"]["channels"][1].sum())
    assert auto.lm_head.weight is auto.model.embed_tokens.weight  # SmolLM2's tied head stays tied


def test_loads_where_fedprune_cannot_be_imported(saved: dict[str, Any], tmp_path: Path) -> None:
    assert load_without_fedprune(
        saved["dir"], saved["compiled"], saved["ids"], tmp_path
    ).startswith("transformers_modules.")


def test_load_pruned_reads_directories_written_before_the_hf_class(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    """The old writer: the base LLaMA config.json + `llmpruner_structure`, safetensors' `save_model`
    of the shrunk LlamaForCausalLM, generation_config.json. Anything else fails with a message
    naming what is missing."""
    from safetensors.torch import save_model

    old = tmp_path / "old"
    model = shrink_(copy.deepcopy(saved["base"]), saved["keep"]).eval()
    model.config.save_pretrained(old)
    model.generation_config.save_pretrained(old)
    save_model(model, str(old / "model.safetensors"))
    assert json.loads((old / "config.json").read_text())["model_type"] == "llama"
    loaded = load_pruned(old)
    assert isinstance(loaded, FedprunePrunedLlamaForCausalLM)
    torch.testing.assert_close(
        logits(loaded, saved["ids"]), logits(saved["compiled"], saved["ids"]), atol=1e-6, rtol=0
    )
    config = json.loads((old / "config.json").read_text())
    del config["llmpruner_structure"]
    (old / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not a compiled llmpruner model.*llmpruner_structure"):
        load_pruned(old)


def test_a_structure_that_does_not_fit_the_config_is_refused(saved: dict[str, Any]) -> None:
    config = FedprunePrunedLlamaForCausalLM.config_class.from_pretrained(saved["dir"])
    config.llmpruner_structure = config.llmpruner_structure[:1]
    with pytest.raises(ValueError, match="one entry per decoder layer"):
        FedprunePrunedLlamaForCausalLM(config)
    config.llmpruner_structure = [{"kv-groups": [], "channels": [0]}] * 2
    with pytest.raises(ValueError, match="0 kv groups"):
        FedprunePrunedLlamaForCausalLM(config)
