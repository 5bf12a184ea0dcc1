"""The import rules of the layout (docs/architecture.md "Layout"), read from every import statement
(function-level ones too)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports_of(path: Path) -> set[str]:
    """Every module a file imports (absolute names; `from a import b` counts as `a` and `a.b`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def offenders(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p} imports {m}"
        for p in paths
        for m in sorted(imports_of(p))
        if any(m == f or m.startswith(f + ".") for f in forbidden)
    ]


RULES = {
    "clients never import strategies": (("clients",), ("strategies",)),
    "strategies never import clients": (("strategies",), ("clients",)),
    "the app never imports the command line, benchmarks, experiments or tests": (
        ("fedprune_app", "strategies", "clients"),
        ("fedprune_cli", "benchmarks", "experiments", "tests", "tools"),
    ),
    "the command line imports no benchmark or experiment (it hands over by name)": (
        ("fedprune_cli",),
        ("benchmarks", "experiments", "tests"),
    ),
    "standing benchmarks import no experiment": (("benchmarks",), ("experiments",)),
    "core and llm import no method, strategy or client": (
        ("fedprune_app/core", "fedprune_app/llm"),
        ("fedprune_app.methods", "strategies", "clients"),
    ),
    "the LLM library imports no flwr": (("fedprune_app/llm",), ("flwr",)),
    "the core renders nothing: it imports no report": (
        ("fedprune_app/core",),
        ("fedprune_app.report",),
    ),
    "the report imports no method, strategy or client": (
        ("fedprune_app/report",),
        ("fedprune_app.methods", "strategies", "clients"),
    ),
    "the structural library imports no method, strategy, client or flwr": (
        ("fedprune_app/structural",),
        ("fedprune_app.methods", "strategies", "clients", "flwr"),
    ),
    "the LLM library imports no core and no entry point: it stands alone": (
        ("fedprune_app/llm",),
        ("fedprune_app.core", "fedprune_app.server_app", "fedprune_app.client_app"),
    ),
    "method packages import no side": (
        ("fedprune_app/methods",),
        ("strategies", "clients", "fedprune_app.server_app", "fedprune_app.client_app"),
    ),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_import_rule(rule: str) -> None:
    folders, forbidden = RULES[rule]
    paths = files(*folders)
    assert paths, f"no files under {folders}"
    assert offenders(paths, forbidden) == []


def test_the_rule_checker_sees_function_level_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from strategies.sftp import SFTPStrategy\n    import flwr.app\n")
    assert offenders([bad], ("strategies",)) and offenders([bad], ("flwr",))
    assert not offenders([bad], ("clients",))
    bad.write_text("from fedprune_app.core.config import RunConfig\n")
    llm_rule = next(
        forbidden for name, (_, forbidden) in RULES.items() if "imports no core" in name
    )
    assert offenders([bad], llm_rule) == [
        f"{bad} imports fedprune_app.core.config",
        f"{bad} imports fedprune_app.core.config.RunConfig",
    ]


# --- the method rules: no method uses another's code; masks are a scoped value --------------------

PACKAGES = sorted(
    p.name
    for p in (ROOT / "fedprune_app" / "methods").iterdir()
    if p.is_dir() and (p / "__init__.py").is_file()
)
SIDES = sorted(
    p.stem
    for side in ("strategies", "clients")
    for p in (ROOT / side).glob("*.py")
    if p.stem != "__init__"
)
METHODS = sorted(set(PACKAGES) | set(SIDES))  # a side without a package of its own counts too


def method_files(method: str) -> list[Path]:
    """A method's own code: its package, its strategy and its client."""
    own = [ROOT / "strategies" / f"{method}.py", ROOT / "clients" / f"{method}.py"]
    package = [*files(f"fedprune_app/methods/{method}")] if method in PACKAGES else []
    return [*package, *(p for p in own if p.is_file())]


def cross_method_imports(method: str, paths: list[Path]) -> list[str]:
    """Imports of another method's code in `paths`: its package (`fedprune_app.methods.<other>`),
    its client (`clients.<other>`) or its strategy (`strategies.<other>`)."""
    others = tuple(
        f"{home}.{m}"
        for m in METHODS
        if m != method
        for home in ("fedprune_app.methods", "clients", "strategies")
    )
    return offenders(paths, others)


@pytest.mark.parametrize("method", METHODS)
def test_no_method_imports_another_methods_code(method: str) -> None:
    """What two methods share lives in a library (`fedprune_app.structural`, `llm`, `core`: the
    plain LoRA round is `core.lora`), not in one of them: neither its package nor its client or
    strategy imports another method's package, client or strategy."""
    assert method_files(method)
    assert cross_method_imports(method, method_files(method)) == []


def test_the_cross_method_check_fails_on_a_borrowed_module(tmp_path: Path) -> None:
    bad = tmp_path / "fedflap.py"
    bad.write_text("def f():\n    from fedprune_app.methods.sftp.generator import MaskGenerator\n")
    assert cross_method_imports("fedflap", [bad]) and not cross_method_imports("sftp", [bad])


def test_the_cross_method_check_fails_on_a_borrowed_client_or_strategy(tmp_path: Path) -> None:
    client, strategy = tmp_path / "client.py", tmp_path / "strategy.py"
    client.write_text(
        "from clients.fedit import FedITClient\n"
        "from fedprune_app.methods.flexlora.svd import fit_rank\n"
    )
    strategy.write_text("import strategies.fedit\n")
    assert cross_method_imports("flexlora", [client]) == [
        f"{client} imports clients.fedit",
        f"{client} imports clients.fedit.FedITClient",
    ]
    assert cross_method_imports("flexlora", [strategy]) == [f"{strategy} imports strategies.fedit"]
    assert cross_method_imports("fedit", [client, strategy]) == [
        f"{client} imports fedprune_app.methods.flexlora.svd",
        f"{client} imports fedprune_app.methods.flexlora.svd.fit_rank",
    ]


MUTABLE = ("dict", "list", "set", "defaultdict", "OrderedDict")
CACHES = {  # module-level mutable objects that are no model state, each with its reason
    "fedprune_app/structural/routing.py:_ROUTED_CLASSES": "one routed subclass per layer class",
    "fedprune_app/structural/speed.py:CLOCKS": "a constant table of clock functions",
    "fedprune_app/methods/slicegpt/models.py:_CACHE": "the sliced models a process loaded",
    "fedprune_app/methods/llmpruner/models.py:_pruned": "the pruned model a process loaded",
}


def module_state(path: Path) -> list[str]:
    """`path:name` of every module-level binding to a mutable container ({}, [], set(), dict(), ...)
    and every module-level function cached by `functools.lru_cache`/`cache` (`__all__` aside)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.FunctionDef):
            names = {
                ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1]
                for d in node.decorator_list
            }
            if names & {"lru_cache", "cache"}:
                found.append(node.name)
            continue
        literal = ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp
        mutable = isinstance(value, literal) or (
            isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in MUTABLE
        )
        found += [
            t.id for t in targets if mutable and isinstance(t, ast.Name) and t.id != "__all__"
        ]
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{rel}:{name}" for name in found]


def test_no_module_level_mask_or_model_state_in_the_methods() -> None:
    """Masks are scoped (`structural.routing.masked`) and the routed models live in one cache object
    (`structural.models.ROUTED_MODELS`): no other module-level state in the library, the methods and
    their sides but the listed caches."""
    paths = files("fedprune_app/structural", "fedprune_app/methods", "strategies", "clients")
    found = [s for p in paths for s in module_state(p)]
    assert sorted(set(found) - set(CACHES)) == []
    assert set(CACHES) <= set(found)  # a listed cache that is gone leaves the list


def test_the_state_check_sees_dicts_and_lru_caches(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from functools import lru_cache\n_HELD: dict[str, list[int]] = {}\n"
        "KEPT = dict()\n@lru_cache(maxsize=2)\ndef model_for(name): ...\n"
        "NAMES = ('a', 'b')\n"
    )
    assert [s.split(":")[-1] for s in module_state(bad)] == ["_HELD", "KEPT", "model_for"]


def set_masks_callers(paths: list[Path]) -> list[str]:
    """`path:line` of every call of a function named `set_masks`."""
    return [
        f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{node.lineno}"
        for p in paths
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "set_masks"
    ]


def test_masks_are_set_only_by_the_context_manager() -> None:
    """`routing.set_masks` has one caller, `routing.masked` (which restores the previous masks on
    leaving); everything else routes a model inside a `with masked(model, masks):` block."""
    paths = files(
        "fedprune_app", "strategies", "clients", "benchmarks", "experiments", "fedprune_cli"
    )
    callers = set_masks_callers(paths)
    home = "fedprune_app/structural/routing.py:"
    assert callers and all(c.startswith(home) for c in callers), callers


def test_the_set_masks_check_sees_a_hand_paired_call(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(model, masks):\n    routing.set_masks(model, masks)\n    set_masks(model, None)\n"
    )
    assert len(set_masks_callers([bad])) == 2


def test_the_wheel_installs_no_package_named_tools_and_the_command_line_is_in_it() -> None:
    """The wheel's top-level packages have names of their own (`tools` collides in a user's
    environment), and the `fedprune` script points into one of them."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert "tools" not in packages and not (ROOT / "tools").exists()
    assert "experiments" not in packages and "benchmarks" not in packages
    script = project["project"]["scripts"]["fedprune"]
    assert script.split(".")[0] in packages and (ROOT / "fedprune_cli" / "main.py").is_file()


@pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")
def test_the_app_bundle_holds_the_app_alone() -> None:
    """`flwr run` ships a bundle (FAB) built from pyproject's `fab-include`: the app's three
    packages, not the docs' run records, experiments or tests, so it stays far below Flower's 10 MB
    limit as records grow."""
    import io
    import zipfile

    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(ROOT)
    tops = {name.split("/")[0] for name in zipfile.ZipFile(io.BytesIO(fab)).namelist()}
    assert tops == {".info", "pyproject.toml", "fedprune_app", "strategies", "clients"}
    assert len(fab) < 2 * 1024 * 1024


def test_the_app_unpickles_nothing() -> None:
    """No code path of the app or its Flower sides imports pickle: every file it reads is parsed as
    data (core/statefile.py); converting an old trusted pickle is the user's explicit command
    line."""
    assert (
        offenders(files("fedprune_app", "strategies", "clients"), ("pickle", "dill", "cloudpickle"))
        == []
    )


# How the methods are written in prose as well as their registry names (SFT-P, LLM-Pruner).
METHOD_SPELLINGS = ("sft-p", "llm-pruner")


def method_names_in(paths: list[Path], names: tuple[str, ...]) -> list[str]:
    """`path:line: name` for every method name in the files' text (code, comments, docstrings, help
    texts), case-insensitive: `fedspallm` finds FedSpaLLM."""
    pattern = re.compile("|".join(map(re.escape, names)), re.IGNORECASE)
    return [
        f"{shown(p)}:{i}: {m.group(0)}"
        for p in paths
        for i, line in enumerate(p.read_text().splitlines(), 1)
        for m in pattern.finditer(line)
    ]


def shown(path: Path) -> str:
    """A path as the failures name it: relative to the repository where it is in it."""
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def test_the_core_and_the_entry_points_name_no_method() -> None:
    """`core/` and the two entry points know no method: no method's name in their code, comments or
    docstrings (a method's example belongs in its own package); every registered method counts."""
    from fedprune_app.core import registry

    names = tuple(sorted(set(registry.names()) | set(METHOD_SPELLINGS)))
    assert {"sftp", "fedspallm", "fedtpa", "fedit"} <= set(names)
    entry_points = [ROOT / "fedprune_app" / f"{side}_app.py" for side in ("server", "client")]
    paths = files("fedprune_app/core") + entry_points
    assert method_names_in(paths, names) == []


def test_the_name_checker_finds_a_method_named_in_prose(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('x = 1  # like FedSpaLLM\'s r_i\n"""SFT-P\'s masks."""\n')
    found = method_names_in([bad], ("fedspallm", "sft-p", "fedit"))
    assert found == [f"{bad}:1: FedSpaLLM", f"{bad}:2: SFT-P"]


def undocumented(paths: list[Path]) -> list[str]:
    """`path:line: name` of every public function, method and class without a docstring."""
    out: list[str] = []

    def walk(path: Path, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if child.name.startswith("_"):
                    continue
                if ast.get_docstring(child) is None:
                    out.append(f"{shown(path)}:{child.lineno}: {prefix}{child.name}")
                if isinstance(child, ast.ClassDef):
                    walk(path, child, f"{child.name}.")

    for path in paths:
        walk(path, ast.parse(path.read_text()), "")
    return out


def test_every_public_function_of_the_core_and_every_hook_has_a_docstring(tmp_path: Path) -> None:
    assert undocumented(files("fedprune_app/core")) == []
    bad = tmp_path / "bad.py"
    bad.write_text(
        'class A:\n    """A."""\n\n    def hook(self):\n        pass\n\n'
        "    def _own(self):\n        pass\n"
    )
    assert undocumented([bad]) == [f"{bad}:4: A.hook"]


# --- no import cycles; fedprune's own modules imported at the top ---------------------------------

OWN = ("fedprune_app", "fedprune_cli", "strategies", "clients", "benchmarks")
PRODUCT = ("fedprune_app", "strategies", "clients")
# modules the command line imports before Flower starts (a refusal answers in about a second): they
# must import without torch (`test_the_command_lines_modules_import_without_torch`)
TORCH_FREE = (
    "fedprune_app.core.config",
    "fedprune_app.core.registry",
    "fedprune_app.core.checkpoint",
    "fedprune_app.core.privacy",
    "fedprune_app.core.untouched",
    "fedprune_cli.preflight",
    "fedprune_cli.run",
    "fedprune_cli.keys",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """{module: the own modules it imports}, every import statement counted (function-level ones
    too), `from a import b` as module `a.b` where that is a module, else `a`."""
    names = {module_name(p): p for p in paths}

    def resolve(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in names.items():
        found = {resolve(m) for m in imports_of(path) if m.startswith(OWN)}
        graph[name] = {m for m in found if m and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def late_own_imports(paths: list[Path]) -> list[str]:
    """'file:line module' for each import of fedprune's own code inside a function."""
    late = []
    for path in paths:
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and node.level == 0
                    else []
                )
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                late += [f"{shown}:{node.lineno} {n}" for n in names if n.startswith(OWN)]
    return late


def test_no_import_cycles() -> None:
    """The own modules form no cycle, counting imports inside functions (which would only hide
    one)."""
    assert cycles(import_graph(files(*OWN))) == []


def test_the_cycle_check_finds_one(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_app_imports_its_own_modules_at_the_top() -> None:
    """No import of fedprune's own code inside a function of the app (lazy imports are for heavy
    third-party packages: torch, transformers, peft, lm-eval, matplotlib)."""
    assert late_own_imports(files(*PRODUCT)) == []


def test_the_late_import_check_sees_one(tmp_path: Path) -> None:
    bad = tmp_path / "mod.py"
    bad.write_text(
        "import torch\n\ndef f():\n    import json\n    from fedprune_app.core import x\n"
    )
    assert late_own_imports([bad]) == [f"{bad}:5 fedprune_app.core"]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_the_command_lines_modules_import_without_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False", module


# --- the strategy base: few hooks, and the methods override nothing else --------------------------

DECLARED = (
    "report_class",
    "federated_evaluation",
    "evaluate_round_1",
    "folds_replies",
    "dp_release",
    "dp_unsupported",
)


def overrides_beyond_the_hooks(cls: type, base: type, allowed: set[str]) -> list[str]:
    """Names `cls` (or a class between it and `base`) defines that `base` defines too, other than
    `allowed`."""
    found = []
    for klass in cls.__mro__:
        if klass is base or not issubclass(klass, base):
            continue
        found += [
            f"{klass.__name__}.{name}"
            for name in vars(klass)
            if hasattr(base, name) and not name.startswith("_") and name not in allowed
        ]
    return sorted(set(found))


def test_the_strategy_base_is_small_with_few_hooks() -> None:
    """Flower's base declares five abstract hooks in ~280 lines; ours: at most eight names
    (state_dict / load_state_dict a pair) in under 400 lines, the loop apart (core/rounds.py)."""
    from fedprune_app.core.strategy import HOOKS

    assert len(HOOKS) <= 8
    assert len((ROOT / "fedprune_app" / "core" / "strategy.py").read_text().splitlines()) < 400


def test_every_strategy_overrides_only_the_hooks_and_declarations() -> None:
    from fedprune_app.core import registry
    from fedprune_app.core.privacy import DP_HOOKS
    from fedprune_app.core.strategy import HOOKS, FederatedStrategy

    registry.load("strategies")
    allowed = {*HOOKS, *DECLARED, *DP_HOOKS, "__init__"}
    found = [
        f
        for name in registry.names()
        for f in overrides_beyond_the_hooks(
            registry.strategy_class(name), FederatedStrategy, allowed
        )
    ]
    assert found == []


def test_the_override_check_sees_one() -> None:
    from fedprune_app.core.strategy import HOOKS, FederatedStrategy

    class Sneaky(FederatedStrategy):
        def configure_train(self, *args: object) -> list:  # Flower's, the runner's
            return []

        def aggregate(self, *args: object) -> None:  # a hook
            return None

    assert overrides_beyond_the_hooks(Sneaky, FederatedStrategy, set(HOOKS)) == [
        "Sneaky.configure_train"
    ]
