"""A compiled slicegpt directory (`save_sliced`) is a standard Hugging Face model directory
(SliceGPT §3.2–3.4: the residual stream rotated and sliced): it loads with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` (also where fedprune cannot be
imported), computes what `slice_model` / `load_sliced` compute, and `load_sliced` still reads the
directories written before the HF model class (format "fedprune-slicegpt/1")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedprune_app.llm.models import load_base_model
from fedprune_app.methods.slicegpt.hf import (
    FedpruneSlicedLlamaConfig,
    FedpruneSlicedLlamaForCausalLM,
)
from fedprune_app.methods.slicegpt.pca import covariance_sums, one_shot_bases
from fedprune_app.methods.slicegpt.sliced import (
    FORMAT,
    load_sliced,
    num_points,
    save_sliced,
    slice_model,
)
from tests.methods.hf_checks import (
    ALLOWED_IMPORTS,
    absolute_imports,
    check_auto_and_loader,
    load_without_fedprune,
    logits,
    modules_cache,  # noqa: F401 (fixture)
)

WIDTH = 40  # of the tiny LLaMA's 64


@pytest.fixture(scope="module")
def saved(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny LLaMA (weights scaled so greedy decoding depends on the context) sliced to WIDTH by
    the principal components of its own residual stream, and saved with the tokenizer by
    `save_sliced`."""
    from transformers import AutoTokenizer

    dense = load_base_model(str(tiny_model_dir), device="cpu")
    with torch.no_grad():
        for p in dense.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    gen = torch.Generator().manual_seed(0)
    batches = [
        {
            "input_ids": torch.randint(0, 2000, (2, 16), generator=gen),
            "attention_mask": torch.ones(2, 16, dtype=torch.long),
        }
        for _ in range(2)
    ]
    covs, _ = covariance_sums(dense, batches)
    model = slice_model(dense, one_shot_bases(covs, WIDTH))
    out = tmp_path_factory.mktemp("slicegpt") / "compiled"
    save_sliced(model, out, AutoTokenizer.from_pretrained(tiny_model_dir))
    ids = torch.randint(0, 2000, (2, 9), generator=torch.Generator().manual_seed(1))
    return {"dir": out, "ids": ids, "model": model, "dense": dense}


def test_the_directory_is_a_standard_hf_model_directory(saved: dict[str, Any]) -> None:
    out = saved["dir"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "fedprune_sliced_llama" and config["base_model_type"] == "llama"
    assert (
        config["architectures"] == ["FedpruneSlicedLlamaForCausalLM"]
        and config["tie_word_embeddings"] is False
    )
    assert config["auto_map"] == {
        "AutoConfig": "configuration_fedprune_sliced_llama.FedpruneSlicedLlamaConfig",
        "AutoModelForCausalLM": "modeling_fedprune_sliced_llama.FedpruneSlicedLlamaForCausalLM",
    }
    assert config["slicegpt_dims"] == [WIDTH] * num_points(saved["dense"].config)
    for code in ("configuration_fedprune_sliced_llama.py", "modeling_fedprune_sliced_llama.py"):
        assert absolute_imports(out / code) <= ALLOWED_IMPORTS, code
    assert {"model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }


def test_auto_model_with_trust_remote_code_equals_load_sliced_and_slice_model(
    saved: dict[str, Any],
    modules_cache: Path,  # noqa: F811 (fixture)
) -> None:
    ids, model = saved["ids"], saved["model"]
    auto = check_auto_and_loader(
        saved["dir"], model, load_sliced, FedpruneSlicedLlamaForCausalLM, ids, modules_cache
    )
    assert not torch.allclose(
        logits(model, ids), logits(saved["dense"], ids), atol=1e-3
    )  # slicing changed something
    assert auto.model.embed_tokens.weight.shape[1] == WIDTH and auto.lm_head.in_features == WIDTH
    assert sum(p.numel() for p in auto.parameters()) == sum(p.numel() for p in model.parameters())


def test_loads_where_fedprune_cannot_be_imported(saved: dict[str, Any], tmp_path: Path) -> None:
    assert load_without_fedprune(saved["dir"], saved["model"], saved["ids"], tmp_path).startswith(
        "transformers_modules."
    )


def test_load_sliced_reads_directories_written_before_the_hf_class(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    """The old writer: config.json of the base LLaMA config (untied, `slicegpt_dims`), safetensors
    of the state dict, slicegpt.json {"format": "fedprune-slicegpt/1", "dims"}. Anything else fails
    naming both formats."""
    from safetensors.torch import save_file

    model, old = saved["model"], tmp_path / "old"
    old.mkdir()
    config = {
        k: v for k, v in model.config.to_dict().items() if k not in ("auto_map", "base_model_type")
    }
    config |= {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    (old / "config.json").write_text(json.dumps(config))
    save_file(
        {k: v.detach().contiguous() for k, v in model.state_dict().items()},
        str(old / "model.safetensors"),
    )
    (old / "slicegpt.json").write_text(
        json.dumps({"format": FORMAT, "dims": model.config.slicegpt_dims})
    )
    loaded = load_sliced(old)
    assert isinstance(loaded, FedpruneSlicedLlamaForCausalLM)
    torch.testing.assert_close(
        logits(loaded, saved["ids"]), logits(model, saved["ids"]), atol=1e-6, rtol=0
    )
    (old / "slicegpt.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not a sliced fedprune model"):
        load_sliced(old)


def test_bad_widths_and_unsliced_models_are_refused(saved: dict[str, Any], tmp_path: Path) -> None:
    config = FedpruneSlicedLlamaConfig.from_pretrained(saved["dir"])
    config.slicegpt_dims = config.slicegpt_dims[:-1]
    with pytest.raises(ValueError, match="'slicegpt_dims' must hold 5 widths"):
        FedpruneSlicedLlamaForCausalLM(config)
    with pytest.raises(TypeError, match="output of slice_model"):
        save_sliced(saved["dense"], tmp_path / "x")
