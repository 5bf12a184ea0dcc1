"""Which method runs on which transformers architecture, each claim checked on a tiny random config
of that architecture (`tests.tiny.save_tiny`): the support table of docs/models-and-data.md is the
registry's `architectures`, a method refuses any other in one line before Flower starts, the
structural library's masked model equals its compiled model on every architecture it declares, and
(slow) one whole round of each method on each architecture it declares completes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fedprune_app.core import registry
from fedprune_app.core.registry import architecture_problem
from tests.tiny import ARCHITECTURES, perturb, save_tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {a: save_tiny(a, tmp_path_factory.mktemp(a)) for a in ARCHITECTURES}


def supports(method: str, arch: str) -> bool:
    declared = registry.get(method).architectures
    return declared is None or arch in declared


def test_the_support_table_is_the_registrys() -> None:
    """docs/models-and-data.md's table: a ✓ exactly where the method declares the architecture."""
    page = (ROOT / "docs" / "models-and-data.md").read_text()
    (table,) = re.findall(r"\| method \| llama .*?\n((?:\|.*\n)+)", page)
    rows = {
        cells[0].strip("` "): cells[1:]
        for cells in (
            [c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[1:]
        )
    }
    assert set(rows) == set(registry.names())
    for method, cells in rows.items():
        marks = [c.startswith("✓") for c in cells[: len(ARCHITECTURES)]]
        assert marks == [supports(method, a) for a in ARCHITECTURES], method


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("method", registry.names())
def test_an_architecture_a_method_does_not_declare_is_refused_in_one_line(
    method: str, arch: str, tiny_models: dict[str, Path]
) -> None:
    problem = architecture_problem(method, str(tiny_models[arch]))
    if supports(method, arch):
        assert problem is None
    else:
        assert problem is not None and "\n" not in problem
        assert f"method {method!r} rewrites the decoder layers of" in problem
        assert f"is a {arch!r} model" in problem


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_the_masked_model_equals_its_compiled_model_where_declared(
    arch: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """SFT-P's and fedflap's structure (the masked bus and its compiled form): the compiled model
    computes what the masked one does on each architecture they declare (Qwen2's q/k/v biases and
    Qwen3's q/k norms included), also once saved and loaded as a model directory."""
    from fedprune_app.structural.routing import (
        MASK_NAMES,
        compile_model,
        install_routing,
        load_compiled,
        masked,
        save_compiled,
    )

    model = _sharpened(tiny_models[arch])
    gen = torch.Generator().manual_seed(2)
    d = model.config.hidden_size
    masks = [
        {n: (torch.rand(d, generator=gen) < 0.6).float() for n in MASK_NAMES}
        for _ in range(model.config.num_hidden_layers)
    ]
    install_routing(model)
    with torch.no_grad(), masked(model, masks):
        routed = model(input_ids=_ids()).logits
        compiled = compile_model(model, masks)
        same = torch.allclose(compiled(input_ids=_ids()).logits, routed, atol=1e-4, rtol=1e-5)
        save_compiled(compiled, tmp_path / "compiled")
        loaded = load_compiled(tmp_path / "compiled").float()(input_ids=_ids()).logits
    assert same == supports("sftp", arch) == supports("fedflap", arch)
    assert torch.allclose(loaded, compiled(input_ids=_ids()).logits, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3", "opt"])
@pytest.mark.parametrize("method", registry.names())
def test_a_round_of_each_method_completes_on_each_architecture_it_declares(
    method: str, arch: str, tiny_models: dict[str, Path], tmp_path: Path, flower_ids: None
) -> None:
    if not supports(method, arch):
        pytest.skip(f"{method} does not declare {arch}")
    from tests.conformance.test_reliability import summary
    from tests.local_grid import LocalGrid, method_config, run_server

    cfg = method_config(tiny_models[arch], tmp_path, method, num_server_rounds=1)
    run, err = run_server(cfg, LocalGrid(cfg, 4, seed=0))
    assert err is None, err
    assert summary(run)["status"] == "completed"


def _sharpened(path: Path) -> torch.nn.Module:
    """The tiny model in float32 with weights large enough, norms uneven and biases nonzero that a
    dropped or misplaced parameter changes the logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    perturb(model, weights=10.0, biases=0.5)
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, 2000, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_slicegpts_rotated_unsliced_model_equals_the_dense_one_where_declared(
    arch: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """§3.2–3.3 on each architecture: folded and rotated by square bases, the same logits (also
    saved and loaded); an architecture where they differ (a bias or norm the sliced layer drops)
    must not be declared."""
    from fedprune_app.methods.slicegpt.pca import covariance_sums, one_shot_bases
    from fedprune_app.methods.slicegpt.sliced import load_sliced, save_sliced, slice_model

    dense = _sharpened(tiny_models[arch])
    ids = _ids()
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    covs, _ = covariance_sums(dense, [batch])
    rotated = slice_model(dense, one_shot_bases(covs, int(dense.config.hidden_size)))
    with torch.no_grad():
        same = torch.allclose(rotated(**batch).logits, dense(**batch).logits, atol=1e-3, rtol=1e-4)
        save_sliced(rotated, tmp_path / "sliced")
        loaded = load_sliced(tmp_path / "sliced").float()(**batch).logits
        assert torch.allclose(loaded, rotated(**batch).logits, atol=1e-5)
    assert same == supports("slicegpt", arch)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_llmpruners_compiled_model_computes_the_masked_one_where_declared(
    arch: str, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """§3.1's cut on each architecture: the compiled (smaller) model computes the masked one, also
    saved and loaded, where declared."""
    import copy

    import numpy as np

    from fedprune_app.methods.llmpruner.importance import dims
    from fedprune_app.methods.llmpruner.structure import (
        compile_pruned,
        load_pruned,
        save_pruned,
        zero_pruned_,
    )

    model = _sharpened(tiny_models[arch])
    s = dims(model.config)
    keep = {
        "heads": np.array([[True, False], [False, True]]),
        "channels": np.ones((2, s["inter"]), bool),
    }
    keep["channels"][0, ::3] = False
    try:
        compiled = compile_pruned(model, keep)
        masked_model = zero_pruned_(copy.deepcopy(model), keep)
        with torch.no_grad():
            same = torch.allclose(
                compiled(input_ids=_ids()).logits, masked_model(input_ids=_ids()).logits, atol=1e-4
            )
            save_pruned(compiled, tmp_path / "pruned")
            loaded = load_pruned(tmp_path / "pruned").float()(input_ids=_ids()).logits
            assert torch.allclose(loaded, compiled(input_ids=_ids()).logits, atol=1e-5)
    except RuntimeError:  # e.g. a state dict with keys the compiled layer lacks
        same = False
    assert same == supports("llmpruner", arch)
