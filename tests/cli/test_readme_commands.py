"""The README's commands as a newcomer types them after `source .venv/bin/activate`: every
`fedprune <command>` answers its `--help` from PATH, every `make` target exists, and every preset
fits the federation its `# federation:` line names (what `fedprune run --run-config conf/<p>.toml`
simulates with no `--federation-config`). With the embedded packages (`pytest -m embedded`): every
preset and the README's own `fedprune run` lines pass `--check` exactly as printed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.core.privacy import check_private
from fedprune_cli import launch, preflight

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "conf").glob("*.toml"))


def readme_commands() -> list[str]:
    """Each command line of the README's bash blocks, continuation lines joined, comments cut."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            command = shlex.split(line, comments=True)
            if command:
                out.append(" ".join(shlex.quote(a) for a in command))
    return out


def activated_env() -> dict[str, str]:
    """The shell after `source .venv/bin/activate`: the venv's bin first on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}


def typed(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """`args` run from the repository root in the activated shell, output captured."""
    return subprocess.run(
        args, env=activated_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_the_readme_says_how_fedprune_gets_on_path_and_which_python() -> None:
    text = (ROOT / "README.md").read_text()
    assert "source .venv/bin/activate" in text and "Python 3.11" in text


@pytest.mark.parametrize(
    "command",
    sorted({shlex.split(c)[1] for c in readme_commands() if c.startswith("fedprune ")}),
)
def test_every_readme_fedprune_command_answers_help_from_path(command: str) -> None:
    done = typed(["fedprune", command, "--help"], timeout=120)
    assert done.returncode == 0, done.stderr[-1000:]
    assert "usage: fedprune" in done.stdout


@pytest.mark.parametrize(
    "target", sorted({shlex.split(c)[1] for c in readme_commands() if c.startswith("make ")})
)
def test_every_readme_make_target_exists(target: str) -> None:
    done = subprocess.run(
        ["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_every_preset_fits_the_federation_it_names(preset: Path) -> None:
    federation = launch.preset_federation([str(preset)])
    assert federation, f"{preset.name} has no '# federation:' line"
    cfg = RunConfig.from_flower(launch.merged_config(ROOT, [str(preset)]))
    check_private(cfg)
    fields = launch.parse_overrides(federation, "--federation-config")
    preflight.check_federation_config(fields, cluster=False)
    preflight.check_federation(cfg, preflight.federation_size(fields))


def test_a_preset_built_for_five_clients_would_not_fit_the_default_four() -> None:
    """What the `# federation:` line fixes: FlexLoRA's 5 ranks on the default 4 SuperNodes."""
    cfg = RunConfig.from_flower(launch.merged_config(ROOT, [str(ROOT / "conf/flexlora.toml")]))
    with pytest.raises(ConfigError, match="flexlora-ranks"):
        preflight.check_federation(cfg, 4)


def test_an_explicit_federation_config_wins_over_the_presets(tmp_path: Path) -> None:
    assert launch.preset_federation(["conf/fedtpa.toml"]) == (
        "num-supernodes=5 client-resources-num-cpus=1"
    )
    assert launch.preset_federation(["conf/fedtpa.toml", "conf/smoke.toml"]).startswith(
        "num-supernodes=4"
    )
    assert launch.preset_federation(["lora-rank=4"]) is None


@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_every_preset_passes_the_preflight_alone(preset: Path) -> None:
    done = typed(["fedprune", "run", "--run-config", str(preset.relative_to(ROOT)), "--check"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[fedprune] ok:" in done.stdout


@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [c for c in readme_commands() if c.startswith("fedprune run") and "/models/" not in c],
)
def test_the_readmes_run_commands_pass_check_as_printed(command: str) -> None:
    done = typed([*shlex.split(command), "--check"])
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_deployed_runs_config_is_one_checked_file(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """deployment.md step 7: Flower refuses a preset beside `key=value`; `fedprune run --check
    --save-run-config` writes them merged and checked into one file `flwr run` reads."""
    import tomllib

    from fedprune_cli.main import main

    out = tmp_path / "deploy-run.toml"
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(
            f'{{"question": "q{i}", "choices": ["a", "b"], "label": {i % 2}}}\n' for i in range(40)
        )
    )
    overrides = (
        f"model-name='{tiny_model_dir}' client-data='{data},{data}' server-eval-data='' "
        "min-nodes=2 test-examples=6 val-examples=2"
    )
    args = ["run", "--run-config", "conf/smoke.toml", "--run-config", overrides, "--check"]
    assert main([*args, "--save-run-config", str(out)]) == 0
    written = tomllib.loads(out.read_text())
    assert (
        written["min-nodes"] == 2 and written["method"] == "fedit" and written["run-tag"] == "smoke"
    )
    assert Path(written["output-dir"]).is_absolute()
    assert main(["run", "--run-config", "conf/smoke.toml", "--save-run-config", str(out)]) == 2
