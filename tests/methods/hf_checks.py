"""Checks shared by the tests of compiled-model directories that load through the Auto classes with
`trust_remote_code=True` (llmpruner, slicegpt): the saved code imports only torch / transformers,
and a fresh interpreter in which `fedprune_app` cannot be imported loads the directory and computes
the expected logits and greedy tokens."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

ALLOWED_IMPORTS = {
    "__future__",
    "collections",
    "typing",
    "torch",
    "transformers",
    "huggingface_hub",
}


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def greedy(model: nn.Module, prompt: torch.Tensor, new: int) -> torch.Tensor:
    return model.generate(
        prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
    )


def absolute_imports(path: Path) -> set[str]:
    """Top-level packages a code file imports absolutely (relative imports are the directory's own
    files)."""
    tree = ast.parse(path.read_text())
    found = {
        n.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for n in node.names
    }
    return found | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
    }


@pytest.fixture(scope="module")
def modules_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where transformers copies a directory's code (HF_MODULES_CACHE, read once at import, so
    patched; one folder per process: the `transformers_modules` package it creates stays
    imported)."""
    import transformers.dynamic_module_utils as dyn

    cache = (
        Path(sys.modules["transformers_modules"].__path__[0]).parent
        if "transformers_modules" in sys.modules
        else tmp_path_factory.mktemp("hf-modules")
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dyn, "HF_MODULES_CACHE", str(cache))
        patch.setenv("HF_MODULES_CACHE", str(cache))
        yield cache


def load_without_fedprune(
    model_dir: Path, model: nn.Module, ids: torch.Tensor, tmp_path: Path
) -> str:
    """Load `model_dir` with `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)` in
    a fresh interpreter where every fedprune import fails; assert (there) its logits on `ids` equal
    `model`'s (1e-5) and its greedy tokens are `model`'s. Returns the loaded class's module."""
    expected = {"logits": logits(model, ids), "ids": ids, "greedy": greedy(model, ids[:1, :5], 4)}
    torch.save(expected, tmp_path / "expected.pt")
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                blocked = ("fedprune_app", "strategies", "clients", "fedprune_cli", "tests")
                if name.split(".")[0] in blocked:
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        import torch
        from transformers import AutoModelForCausalLM
        want = torch.load({str(tmp_path / "expected.pt")!r})
        model = AutoModelForCausalLM.from_pretrained({str(model_dir)!r}, trust_remote_code=True)
        assert not any(m.startswith("fedprune_app") for m in sys.modules)
        with torch.no_grad():
            torch.testing.assert_close(
                model(input_ids=want["ids"]).logits, want["logits"], atol=1e-5, rtol=1e-5
            )
        out = model.generate(
            want["ids"][:1, :5], max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0
        )
        assert torch.equal(out, want["greedy"]), (out, want["greedy"])
        print("OK", type(model).__module__)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split("OK ", 1)[1].strip()


def check_auto_and_loader(
    model_dir: Path,
    built: nn.Module,
    loader: Callable[[Path], nn.Module],
    cls: type,
    ids: torch.Tensor,
    modules_cache: Path,
) -> nn.Module:
    """`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` runs the directory's copy
    of the code (under `modules_cache`), and it and fedprune's `loader` (an instance of `cls`, as
    `built` is) give `built`'s logits (1e-5) and greedy tokens, in eval mode. Returns the
    Auto-loaded model."""
    from transformers import AutoModelForCausalLM

    auto = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True)
    assert type(auto).__module__.startswith(
        "transformers_modules."
    )  # the directory's copy, not fedprune's class
    assert any(modules_cache.rglob(f"{type(auto).__module__.rsplit('.', 1)[-1]}.py"))
    ours = loader(model_dir)
    assert (
        isinstance(ours, cls) and isinstance(built, cls) and not ours.training and not auto.training
    )
    expected = logits(built, ids)
    torch.testing.assert_close(logits(ours, ids), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits(auto, ids), expected, atol=1e-5, rtol=1e-5)
    prompt = ids[:1, :5]
    tokens = greedy(built, prompt, 6)
    assert len(set(tokens[0, 5:].tolist())) > 1  # not a degenerate repetition
    assert torch.equal(greedy(auto, prompt, 6), tokens) and torch.equal(
        greedy(ours, prompt, 6), tokens
    )
    return auto
