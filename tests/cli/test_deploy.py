"""Deployment: node-config validation, a client reading its own JSONL (`data-path`), the TLS /
SuperNode-auth material, and (slow) one real loopback deployment: SuperLink + 2 authenticated
SuperNodes + `flwr run`."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict
from flwr.common.config import parse_config_args

from fedprune_app.core.config import NODE_KEYS, ConfigError, NodeConfig
from fedprune_app.core.lora import LoRAClient
from fedprune_app.llm.data import normalize_record
from fedprune_cli import deploy
from fedprune_cli.processes import alive
from tests.conftest import small_config


def _jsonl(path: Path, n: int, template: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps({"instruction": template.format(i=i), "output": str(2 * i)}) + "\n"
            for i in range(n)
        )
    )
    return path


@pytest.fixture()
def mine(tmp_path: Path) -> Path:
    return _jsonl(tmp_path / "device data" / "mine.jsonl", 30, "Add {i} and {i}.")


# --- (a) node-config validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node_config", "key", "allowed"),
    [
        ({"partition-id": 2, "num-partitions": 2}, "partition-id", "[0, 2)"),
        ({"partition-id": -1, "num-partitions": 2}, "partition-id", "[0, 2)"),
        ({"partition-id": 1.5, "num-partitions": 2}, "partition-id", "an int"),
        ({"partition-id": True, "num-partitions": 2}, "partition-id", "an int"),
        ({"partition-id": "first", "num-partitions": 2}, "partition-id", "an int"),
        ({"partition-id": 0, "num-partitions": 0}, "num-partitions", ">= 1"),
        ({"num-partitions": "many"}, "num-partitions", ">= 1"),
        ({"data-path": "/no/such/file.jsonl"}, "data-path", "does not exist"),
        ({"data-path": 7}, "data-path", ".jsonl file"),
        ({"resources": 0}, "resources", "(0, 1]"),
        ({"resources": 1.5}, "resources", "(0, 1]"),
        ({"resources": -0.2}, "resources", "(0, 1]"),
        ({"resources": float("nan")}, "resources", "(0, 1]"),
        ({"resources": "half"}, "resources", "(0, 1]"),
    ],
)
def test_bad_node_config_names_the_key_and_what_it_accepts(
    node_config: dict, key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as err:
        NodeConfig.from_flower(node_config)
    assert f"'{key}'" in str(err.value) and allowed in str(err.value)


def test_data_path_must_be_a_jsonl_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text('{"text": "hello"}\n')
    with pytest.raises(ConfigError, match="'data-path'.*not a .jsonl file"):
        NodeConfig.from_flower({"data-path": str(text)})


def test_unknown_node_config_key_lists_the_allowed_ones() -> None:
    with pytest.raises(ConfigError) as err:
        NodeConfig.from_flower({"partition_id": 0, "num-partitions": 2})
    message = str(err.value)
    assert "'partition_id'" in message and all(f"'{k}'" in message for k in NODE_KEYS)


def test_good_node_configs(mine: Path) -> None:
    assert NodeConfig.from_flower({}) == NodeConfig(0, 1, None, None)
    # Flower's Ray proxy passes partition-id as a string; TOML's resources=1 is an int
    assert NodeConfig.from_flower(
        {"partition-id": "3", "num-partitions": 4, "resources": 1}
    ) == NodeConfig(3, 4, None, 1.0)
    node = NodeConfig.from_flower(
        {"partition-id": 0, "num-partitions": 1, "data-path": str(mine), "resources": 0.25}
    )
    assert (node.data_path, node.resources) == (str(mine.resolve()), 0.25)
    assert NodeConfig.from_flower({"data-path": ""}).data_path is None


def test_node_config_string_round_trips_through_flower_parser(mine: Path) -> None:
    """What `deploy` passes to `flower-supernode --node-config` is what the ClientApp validates."""
    specs = deploy.node_specs(3, ["", str(mine), ""], [0.5])
    parsed = [NodeConfig.from_flower(parse_config_args([s.node_config()])) for s in specs]
    assert parsed == [
        NodeConfig(0, 3, None, 0.5),
        NodeConfig(1, 3, str(mine.resolve()), 0.5),
        NodeConfig(2, 3, None, 0.5),
    ]
    with pytest.raises(ConfigError):
        deploy.node_specs(2, ["a.jsonl", "b.jsonl", "c.jsonl"])


def test_deploy_runs_the_preflight_checks_against_its_supernodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A config that cannot fit N SuperNodes is refused before a certificate is made or a process
    started."""
    monkeypatch.setattr(deploy, "LocalFederation", lambda *a, **k: pytest.fail("nothing may start"))
    with pytest.raises(
        ConfigError, match="'keep-ratios' has 3 comma-separated values .* num-supernodes = 2"
    ):
        deploy.deploy(["method='sftp' keep-ratios='0.5,0.5,0.8'"], deploy.node_specs(2))
    with pytest.raises(ConfigError, match="'min-nodes' is 3 but num-supernodes = 2"):
        deploy.deploy(["min-nodes=3"], deploy.node_specs(2))


# --- (b) a client with data-path ------------------------------------------------------------------


def test_client_with_data_path_trains_on_that_file(
    tiny_model_dir: Path, tmp_path: Path, mine: Path
) -> None:
    embedded = _jsonl(tmp_path / "embedded.jsonl", 40, "Double {i}.")
    cfg = small_config(
        tiny_model_dir,
        client_data=f"{embedded},{embedded}",
        test_examples=6,
        val_examples=4,
        max_train_examples=0,
        seed=3,
    )
    context = Context(
        run_id=1,
        node_id=5,
        node_config={
            "partition-id": 1,
            "num-partitions": 2,
            "data-path": str(mine),
            "resources": 0.5,
        },
        state=RecordDict(),
        run_config=cfg.to_dict(),
    )
    client = LoRAClient(cfg, context)
    assert (client.partition_id, client.num_partitions, client.resources) == (1, 2, 0.5)
    # brute force: the file's records, seeded shuffle, then test | val | train
    records = [
        normalize_record(f"jsonl:{mine.resolve()}", json.loads(line))
        for line in mine.read_text().splitlines()
    ]
    order = list(range(len(records)))
    random.Random(3).shuffle(order)
    expected = [records[i] for i in order]
    assert client.data.test == expected[:6]
    assert client.data.val == expected[6:10]
    assert client.data.train == expected[10:]
    assert all("Double" not in e["prompt"] for e in client.data.train + client.data.test)
    info = dict(client.info())
    assert info == {"data": "data-path:mine.jsonl"}, (
        "the reply names the file, not its path on the device"
    )
    # the same node without data-path reads its embedded partition
    plain = LoRAClient(
        cfg,
        Context(
            run_id=1,
            node_id=5,
            node_config={"partition-id": 1, "num-partitions": 2},
            state=RecordDict(),
            run_config=cfg.to_dict(),
        ),
    )
    assert plain.resources is None and all("Double" in e["prompt"] for e in plain.data.train)


# --- TLS and SuperNode-auth material --------------------------------------------------------------


def test_certificates_chain_to_the_ca_and_cover_loopback(tmp_path: Path) -> None:
    from cryptography import x509

    certs = deploy.generate_certificates(
        tmp_path, ["localhost", "127.0.0.1", "::1", "superlink.example.org"]
    )
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(certs.ca_cert), str(certs.server_cert)],
        capture_output=True,
        text=True,
    )
    assert verified.returncode == 0, verified.stderr
    san = (
        x509.load_pem_x509_certificate(certs.server_cert.read_bytes())
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "superlink.example.org"}
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}


def test_node_keys_are_what_flower_registers_and_loads(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    private, public = deploy.generate_node_keys(tmp_path, "supernode-0")
    key = load_ssh_private_key(private.read_bytes(), None)  # what flower-supernode does
    assert key.curve.name == "secp384r1" and oct(private.stat().st_mode & 0o777) == "0o600"
    assert try_load_public_key(public) == public_key_to_bytes(
        key.public_key()
    )  # what `flwr supernode register` sends


def test_connection_file_is_read_by_flwr_with_an_absolute_ca_path(
    tmp_path: Path, monkeypatch
) -> None:
    from flwr.cli.flower_config import read_superlink_connection

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    deploy.write_connection(tmp_path / "home", "127.0.0.1:9999", Path("certificates/ca.crt"))
    conn = read_superlink_connection(None)  # the default connection
    assert conn.name == deploy.CONNECTION and conn.address == "127.0.0.1:9999"
    assert conn.root_certificates == str(tmp_path / "certificates" / "ca.crt")


# --- (c) one real deployment ----------------------------------------------------------------------


@pytest.mark.slow
def test_loopback_deployment_with_tls_and_authenticated_supernodes(
    tiny_model_dir: Path, tmp_path: Path, mine: Path, monkeypatch
) -> None:
    monkeypatch.setenv(
        "PATH", str(Path(os.sys.executable).parent) + os.pathsep + os.environ["PATH"]
    )
    embedded = tmp_path / "embedded.jsonl"
    embedded.write_text(
        "".join(
            json.dumps({"question": f"Is {i} even?", "choices": ["yes", "no"], "label": i % 2})
            + "\n"
            for i in range(40)
        )
    )
    overrides = (
        f"method='fedit' model-name='{tiny_model_dir}' client-data='{embedded}' "
        "num-server-rounds=1 local-steps=2 batch-size=2 test-examples=6 val-examples=2 "
        "max-train-examples=16 seq-len=64 lora-rank=4 eval-ppl-tokens=64 ppl-window=64 "
        f"ppl-stride=64 fraction-evaluate=0.0 server-eval-data='' output-dir='{tmp_path / 'out'}'"
    )
    nodes = deploy.node_specs(2, ["", str(mine)], [1.0, 0.5])
    done = deploy.deploy([overrides], nodes, timeout=600, quiet=True)
    assert done.code == 0 and done.status == "finished:completed" and done.run_dir is not None, (
        done.status
    )
    assert json.loads((done.run_dir / "summary.json").read_text())["status"] == "completed"
    rows = [json.loads(line) for line in (done.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = {r["client"]: r for r in rows if r.get("phase") == "train"}
    assert {c: r["status"] for c, r in train.items()} == {0: "accepted", 1: "accepted"}
    # node 0 shares the embedded source with partition 1 (by-source: half of its 16 training
    # examples)
    assert (
        train[0]["data"] == str(embedded) and train[0]["num-examples"] == min(16, 40 - 6 - 2) // 2
    )
    n_mine = sum(1 for _ in mine.read_text().splitlines())
    assert train[1]["data"] == "data-path:mine.jsonl" and train[1]["num-examples"] == min(
        16, n_mine - 6 - 2
    )
    assert done.stopped and not [p for p in done.stopped if alive(p)], (
        "every started process must be gone"
    )
    assert not math.isnan(float(train[1]["train-loss"]))


@pytest.mark.slow
def test_superlink_refuses_unregistered_and_untrusting_supernodes() -> None:
    """SuperNode authentication is on (an unregistered key is refused) and TLS is verified (a node
    trusting another CA cannot connect); both SuperNodes exit, nothing started survives."""
    with deploy.LocalFederation() as fed:
        fed.start_superlink()
        other_ca = deploy.generate_certificates(fed.work / "other-ca").ca_cert
        unregistered = fed.add_supernode(deploy.NodeSpec(0, 2), register=False)
        untrusting = fed.add_supernode(
            deploy.NodeSpec(1, 2), ca_cert=other_ca
        )  # registered, wrong CA
        assert unregistered.wait(timeout=120) != 0 and untrusting.wait(timeout=120) != 0
        assert (
            "No SuperNode found with the given public key"
            in (fed.logs / "superlink.log").read_text()
        )
        assert "CERTIFICATE_VERIFY_FAILED" in (fed.logs / "supernode-1.log").read_text()
    assert fed.stopped and not [p for p in fed.stopped if alive(p)] and not fed.work.exists()


def test_private_keys_are_0600_from_creation_and_never_written_through_a_link(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "supernode-0").symlink_to(victim)
    (tmp_path / "certificates").mkdir()
    (tmp_path / "certificates" / "ca.key").symlink_to(victim)
    priv, pub = deploy.generate_node_keys(keys, "supernode-0")
    certs = deploy.generate_certificates(tmp_path / "certificates")
    assert victim.read_text() == "keep me"
    for key in (priv, certs.server_key, tmp_path / "certificates" / "ca.key"):
        assert not key.is_symlink() and (key.stat().st_mode & 0o777) == 0o600, key
    assert pub.read_text().startswith("ecdsa-sha2-nistp384 ")


def _fake_federation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, run: Any) -> list[Path]:
    """`deploy` with its checks and components replaced: `run(fed)` plays the `flwr run`; returns
    the work directories the federations made."""
    works: list[Path] = []
    monkeypatch.setattr(
        deploy.launch, "checked_config", lambda *a, **k: {"output-dir": str(tmp_path / "out")}
    )
    for step in ("start_superlink", "add_supernode", "wait_until_online", "print_logs"):
        monkeypatch.setattr(deploy.LocalFederation, step, lambda self, *a, **k: None)
    monkeypatch.setattr(deploy.launch, "write_run_config", lambda path, values: path)

    def fake_run(self: Any, *a: Any, **k: Any) -> tuple[int, str]:
        works.append(self.work)
        assert (self.work / "certificates" / "ca.key").is_file()  # key material exists meanwhile
        return run(self)

    monkeypatch.setattr(deploy.LocalFederation, "run", fake_run)
    return works


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(143), RuntimeError("boom")])
def test_the_key_material_is_removed_on_every_exit(
    stop: BaseException, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ctrl-C, SIGTERM (the handler exits 143) and a failed deployment alike."""

    def interrupted(fed: Any) -> tuple[int, str]:
        raise stop

    works = _fake_federation(monkeypatch, tmp_path, interrupted)
    if isinstance(stop, RuntimeError):  # a failed deployment is reported, not raised
        assert deploy.deploy([], deploy.node_specs(2, [], [])).code == 1
    else:
        with pytest.raises(type(stop)):
            deploy.deploy([], deploy.node_specs(2, [], []))
    assert works and not works[0].exists()


def test_a_deployment_past_its_timeout_exits_124(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    works = _fake_federation(monkeypatch, tmp_path, lambda fed: (124, "timeout after 5 s"))
    done = deploy.deploy([], deploy.node_specs(2, [], []), timeout=5)
    assert done.code == 124 and not works[0].exists()


def test_the_run_step_reports_a_timeout_as_124(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def too_slow(*a: Any, **k: Any) -> Any:
        raise subprocess.TimeoutExpired("flwr", 5)

    monkeypatch.setattr(deploy.subprocess, "run", too_slow)
    monkeypatch.setattr(deploy.launch, "run_status", lambda env, flwr: "running")
    fed = deploy.LocalFederation.__new__(deploy.LocalFederation)
    fed.logs, fed.exe, fed.cli_env = tmp_path, {"flwr": "flwr"}, {}
    code, status = fed.run(Path("."), Path("x.toml"), 5, quiet=True)
    assert code == 124 and status.startswith("timeout after 5 s")


def test_a_device_makes_its_own_key_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fedprune deploy --node-key PATH`: the private key 0600 at PATH, the public one beside it."""
    from fedprune_cli.main import main

    assert main(["deploy", "--node-key", str(tmp_path / "device" / "supernode-key")]) == 0
    priv, pub = tmp_path / "device" / "supernode-key", tmp_path / "device" / "supernode-key.pub"
    assert (priv.stat().st_mode & 0o777) == 0o600 and pub.read_text().startswith("ecdsa-sha2-")
    assert "stays on this device" in capsys.readouterr().out


def test_certs_only_without_supernodes_writes_no_node_key(tmp_path: Path) -> None:
    from fedprune_cli.main import main

    assert main(["deploy", "--certs-only", str(tmp_path / "creds"), "--supernodes", "0"]) == 0
    assert (tmp_path / "creds" / "certificates" / "ca.crt").is_file()
    assert not (tmp_path / "creds" / "keys").exists()
