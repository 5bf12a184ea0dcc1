"""`fedprune deploy`: the app on Flower's Deployment Engine over loopback, with TLS and
SuperNode authentication, checked and cleaned up (what `scripts/deploy_local.sh` runs).

One invocation, everything under a fresh work directory (its own FLWR_HOMEs, certificates, keys,
logs):

1. a CA and a server certificate for 127.0.0.1 / localhost (openssl, as Flower's TLS guide does)
   and one ECDSA P-384 key pair per SuperNode in OpenSSH format (what `ssh-keygen -t ecdsa -b 384`
   writes);
2. `flower-superlink` with TLS and `--enable-supernode-auth` (isolation `subprocess`) on a free
   port;
3. the CLI's SuperLink connection `local-deployment` (address + root-certificates) in
   FLWR_HOME/config.toml, and every SuperNode's public key registered with `flwr supernode register`
   (flwr 1.41: CLI-managed authentication; the CSV `--auth-list-public-keys` of older releases is
   refused);
4. N `flower-supernode`s (TLS, own private key, `--node-config "partition-id=i num-partitions=N
   [data-path=...] [resources=...]"`), then waits until the SuperLink lists all N online;
5. `flwr run <app> local-deployment --stream --run-config <merged config>`, after the launcher's
   preflight checks against the N SuperNodes (`fedprune_cli/preflight.py`: a bad config fails before
   anything starts);
6. the run's status (`flwr list --format json`) and its run directory's summary.json;
7. stops every process it started, with their descendants and sessions (SuperExec, ServerApp,
   ClientApps), by PID, whatever happened.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedprune_app.core.config import ConfigError
from fedprune_cli import launch
from fedprune_cli.processes import free_port, signals_held, stop_processes, wait_for_port

CONNECTION = "local-deployment"
TIMEOUT_CODE = 124  # as `timeout(1)` and `fedprune run --timeout`
CERTIFICATE_CONF = """[req]
default_bits = 2048
prompt = no
default_md = sha256
req_extensions = req_ext
distinguished_name = dn

[dn]
O = fedprune
CN = {cn}

[req_ext]
subjectAltName = @alt_names

[alt_names]
{alt_names}
"""


@dataclass(frozen=True)
class Certificates:
    """The SuperLink's TLS files: the CA certificate every client trusts, the server certificate and
    key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def generate_certificates(
    out_dir: Path, names: Sequence[str] = ("localhost", "127.0.0.1", "::1"), days: int = 365
) -> Certificates:
    """A self-signed CA and a server certificate signed by it whose subjectAltName lists `names`
    (DNS names or IP addresses: every address SuperNodes and the CLI use to reach the SuperLink)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ips = [n for n in names if _is_ip(n)]
    dns = [n for n in names if not _is_ip(n)]
    alt = [f"DNS.{i} = {n}" for i, n in enumerate(dns, 1)] + [
        f"IP.{i} = {n}" for i, n in enumerate(ips, 1)
    ]
    conf = out_dir / "certificate.conf"
    conf.write_text(CERTIFICATE_CONF.format(cn=(dns or ips)[0], alt_names="\n".join(alt)))
    ca_key, ca_crt = out_dir / "ca.key", out_dir / "ca.crt"
    key, csr, pem = out_dir / "server.key", out_dir / "server.csr", out_dir / "server.pem"
    for path in (ca_key, ca_crt, key, csr, pem):  # openssl must write new files, never via a link
        _remove(path)
    for cmd in (
        ["genrsa", "-out", ca_key, "2048"],
        [
            "req",
            "-new",
            "-x509",
            "-key",
            ca_key,
            "-sha256",
            "-subj",
            "/O=fedprune/CN=fedprune CA",
            "-days",
            str(days),
            "-out",
            ca_crt,
        ],
        ["genrsa", "-out", key, "2048"],
        ["req", "-new", "-key", key, "-out", csr, "-config", conf],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca_crt,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            pem,
            "-days",
            str(days),
            "-sha256",
            "-extfile",
            conf,
            "-extensions",
            "req_ext",
        ],
    ):
        # umask 077: the private keys are 0600 from the moment openssl creates them
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True, umask=0o077)
    return Certificates(ca_crt, pem, key)


def _remove(path: Path) -> None:
    """Delete a file or a symbolic link at `path` (a link itself, never what it points to)."""
    if path.is_symlink() or path.exists():
        path.unlink()


def write_private(path: Path, data: bytes) -> None:
    """Write a private key as a new file created with mode 0600 (no moment with wider rights) and
    without following a symbolic link at `path`."""
    _remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _is_ip(name: str) -> bool:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, name)
            return True
        except OSError:
            pass
    return False


def generate_node_keys(out_dir: Path, name: str) -> tuple[Path, Path]:
    """An ECDSA P-384 key pair in OpenSSH format (`<name>` private, `<name>.pub` public), the same
    files as `ssh-keygen -t ecdsa -b 384 -N "" -f <name>`; the SuperNode keeps the private key, the
    operator registers the public one."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out_dir.mkdir(parents=True, exist_ok=True)
    private = ec.generate_private_key(ec.SECP384R1())
    priv, pub = out_dir / name, out_dir / f"{name}.pub"
    write_private(
        priv,
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    _remove(pub)
    pub.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n"
    )
    return priv, pub


def write_connection(
    flwr_home: Path, address: str, root_certificates: Path, name: str = CONNECTION
) -> Path:
    """The CLI's SuperLink connection `name` (the default one) in `<FLWR_HOME>/config.toml`. flwr
    1.41 reads a relative `root-certificates` against the CLI's working directory, so the path is
    written absolute."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(
        f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n'
        f"root-certificates = {json.dumps(str(Path(root_certificates).resolve()))}\n"
    )
    return path


@dataclass(frozen=True)
class NodeSpec:
    """One SuperNode's node config (see `fedprune_app.core.config.NodeConfig`)."""

    partition_id: int
    num_partitions: int
    data_path: str | None = None
    resources: float | None = None

    def node_config(self) -> str:
        """The `--node-config` string (TOML values, as `flwr` parses it)."""
        parts = [f"partition-id={self.partition_id}", f"num-partitions={self.num_partitions}"]
        if self.data_path:
            parts.append(
                f"data-path={json.dumps(str(Path(self.data_path).expanduser().resolve()))}"
            )
        if self.resources is not None:
            parts.append(f"resources={float(self.resources)!r}")
        return " ".join(parts)


def node_specs(
    n: int, data_paths: Sequence[str | None] = (), resources: Sequence[float | None] = ()
) -> list[NodeSpec]:
    """N specs; `data_paths` / `resources` give one value per node (missing or empty = not set) or
    one for all."""

    def nth(values: Sequence[Any], i: int) -> Any:
        return values[0] if len(values) == 1 else values[i] if i < len(values) else None

    if n < 1 or len(data_paths) > n or len(resources) > n:
        raise ConfigError(
            f"{n} SuperNodes cannot take {len(data_paths)} data paths / {len(resources)} resources"
        )
    return [NodeSpec(i, n, nth(data_paths, i) or None, nth(resources, i)) for i in range(n)]


def _flwr_json(flwr: str, args: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(
        [flwr, *args, "--format", "json"], env=env, capture_output=True, text=True, timeout=120
    )
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"success": False, "error": (done.stdout + done.stderr)[-500:]}


class LocalFederation:
    """A SuperLink and SuperNodes on 127.0.0.1 under a fresh work directory (certificates, keys, one
    FLWR_HOME per component, logs). A context manager: leaving it stops every process it started
    (`self.stopped`) and deletes the work directory unless `keep`."""

    def __init__(self, keep: bool = False) -> None:
        self.keep = keep
        search = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
        self.exe = {
            n: shutil.which(n, path=search) or ""
            for n in ("flwr", "flower-superlink", "flower-supernode")
        }
        if not all(self.exe.values()):
            raise FileNotFoundError(
                f"Flower's commands are not installed in this environment: {self.exe}"
            )
        self.work = Path(tempfile.mkdtemp(prefix="fedprune-deploy-"))  # 0700: keys live here
        self.logs = self.work / "logs"
        self.logs.mkdir()
        self.marker = (
            f"FEDPRUNE_DEPLOYMENT={self.work}"  # inherited by everything the components start
        )
        from fedprune_app.core.runtime import OFFLINE_ENV  # imports torch: not for `--help`

        self.env = {
            **OFFLINE_ENV,
            **os.environ,  # the user's HF_HUB_OFFLINE=0 wins
            "PATH": search,
            "FEDPRUNE_DEPLOYMENT": str(self.work),
        }
        self.cli_env = {
            **self.env,
            "FLWR_HOME": str(self.work / "cli-home"),
        }  # the operator's / user's CLI
        self.procs: list[subprocess.Popen] = []
        self.stopped: set[int] = set()
        try:
            self.certs = generate_certificates(self.work / "certificates")
        except BaseException:
            shutil.rmtree(self.work, ignore_errors=True)  # the CA key written so far
            raise
        self.address = ""

    def __enter__(self) -> LocalFederation:
        return self

    def __exit__(self, *exc: object) -> None:
        with signals_held():  # a second Ctrl-C must not leave processes or keys behind
            self.stopped = stop_processes(self.procs, self.marker)
            if not self.keep:
                shutil.rmtree(self.work, ignore_errors=True)

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        """One long-running component, in its own session, with its own FLWR_HOME and log file."""
        with (self.logs / f"{name}.log").open("wb") as log:
            self.procs.append(
                subprocess.Popen(
                    cmd,
                    env={**self.env, "FLWR_HOME": str(self.work / f"{name}-home")},
                    cwd=self.work,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        return self.procs[-1]

    def start_superlink(self) -> None:
        """`flower-superlink` with TLS and SuperNode authentication on a free port; the CLI
        connection to it."""
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        proc = self.start(
            "superlink",
            [
                self.exe["flower-superlink"],
                "--ssl-ca-certfile",
                str(self.certs.ca_cert),
                "--ssl-certfile",
                str(self.certs.server_cert),
                "--ssl-keyfile",
                str(self.certs.server_key),
                "--enable-supernode-auth",
                "--isolation",
                "subprocess",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
        )
        wait_for_port(port, proc)
        write_connection(self.work / "cli-home", self.address, self.certs.ca_cert)

    def add_supernode(
        self, spec: NodeSpec, register: bool = True, ca_cert: Path | None = None
    ) -> subprocess.Popen:
        """A key pair for the node, registered by the operator (`flwr supernode register`) unless
        told not to, then `flower-supernode` with TLS (trusting `ca_cert`, default: our CA), the
        private key, the node config."""
        name = f"supernode-{spec.partition_id}"
        private, public = generate_node_keys(self.work / "keys", name)
        if register:
            register_node(self.exe["flwr"], self.cli_env, public)
        return self.start(
            name,
            [
                self.exe["flower-supernode"],
                "--superlink",
                self.address,
                "--root-certificates",
                str(ca_cert or self.certs.ca_cert),
                "--auth-supernode-private-key",
                str(private),
                "--node-config",
                spec.node_config(),
                "--isolation",
                "subprocess",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
            ],
        )

    def wait_until_online(self, n: int, timeout: float = 180.0) -> None:
        """Block until the SuperLink lists `n` SuperNodes `online` (they authenticated); fail early
        when a component exits."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            nodes = _flwr_json(
                self.exe["flwr"], ["supernode", "list", CONNECTION], self.cli_env
            ).get("nodes", [])
            if sum(node.get("status") == "online" for node in nodes) >= n:
                return
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(
                    "a SuperNode or the SuperLink exited before every SuperNode came online"
                )
            time.sleep(1.0)
        raise TimeoutError(f"fewer than {n} SuperNodes online after {timeout:.0f} s")

    def run(self, app_dir: Path, run_config: Path, timeout: float, quiet: bool) -> tuple[int, str]:
        """`flwr run <app> local-deployment --stream --run-config <file>`; (its exit code, the run's
        status)."""
        with (self.logs / "flwr-run.log").open("wb") as log:
            stream = log if quiet else None
            try:
                done = subprocess.run(
                    [
                        self.exe["flwr"],
                        "run",
                        str(app_dir),
                        CONNECTION,
                        "--stream",
                        "--run-config",
                        str(run_config),
                    ],
                    env=self.cli_env,
                    cwd=app_dir,
                    timeout=timeout,
                    stdout=stream,
                    stderr=stream,
                )
            except subprocess.TimeoutExpired:
                return (
                    TIMEOUT_CODE,
                    (
                        f"timeout after {timeout:.0f} s "
                        f"({launch.run_status(self.cli_env, self.exe['flwr'])})"
                    ),
                )
        return done.returncode, launch.run_status(self.cli_env, self.exe["flwr"])

    def print_logs(self, lines: int = 25) -> None:
        for log in sorted(self.logs.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            print(
                f"--- {log.name} (last lines) ---\n" + "\n".join(tail), file=sys.stderr, flush=True
            )


def register_node(flwr: str, env: dict[str, str], public_key: Path, timeout: float = 60.0) -> str:
    """`flwr supernode register <public key> local-deployment` (retried while the SuperLink starts);
    the node id."""
    deadline = time.time() + timeout
    while True:
        out = _flwr_json(flwr, ["supernode", "register", str(public_key), CONNECTION], env)
        if out.get("success"):
            return str(out["node-id"])
        if time.time() > deadline:
            raise RuntimeError(f"could not register {public_key.name}: {out}")
        time.sleep(0.5)


@dataclass
class Deployment:
    """What one deployment did: exit code, run directory, run status, the PIDs it stopped, kept
    logs."""

    code: int
    run_dir: Path | None
    status: str
    stopped: set[int]
    log_dir: Path | None = None


def deploy(
    run_configs: Sequence[str],
    nodes: Sequence[NodeSpec],
    app_dir: Path = launch.APP_DIR,
    timeout: float = 7200,
    quiet: bool = False,
    keep_work_dir: bool = False,
) -> Deployment:
    """Run the app once on a loopback deployment (SuperLink + `nodes`), check it, stop everything it
    started."""
    from flwr.common.config import parse_config_args

    from fedprune_app.core.config import NodeConfig

    for spec in nodes:  # the ClientApp would raise the same error, after the whole start-up
        NodeConfig.from_flower(parse_config_args([spec.node_config()]))
    # the preflight checks against the N SuperNodes (`client-data` is not read when every node
    # brings its data)
    values = launch.checked_config(
        app_dir,
        [f"min-nodes={len(nodes)}", *run_configs],
        f"num-supernodes={len(nodes)}",
        check_data=not all(s.data_path for s in nodes),
    )
    out_root = Path(values["output-dir"])
    before = set(out_root.iterdir()) if out_root.is_dir() else set()
    code, status = 1, "not started"
    fed = LocalFederation(keep=True)  # the logs are read below; the work directory goes at the end
    try:
        with fed:
            try:
                fed.start_superlink()
                for spec in nodes:
                    fed.add_supernode(spec)
                fed.wait_until_online(len(nodes))
                resolved = launch.write_run_config(
                    fed.work / "run-config.toml", values
                )  # checked, paths absolute
                code, status = fed.run(app_dir, resolved, timeout, quiet)
            except (RuntimeError, TimeoutError) as err:
                status = f"deployment failed: {err}"
        new_dirs = sorted(set(out_root.iterdir()) - before) if out_root.is_dir() else []
        run_dir = new_dirs[-1] if new_dirs else None
        summary_ok = (launch.read_summary(run_dir) or {}).get("status") == "completed"
        ok = code == 0 and status.endswith("completed") and summary_ok
        print(f"\n[fedprune] deployment run status: {status}; run directory: {run_dir}", flush=True)
        if not ok:
            fed.print_logs()
        if keep_work_dir:
            print(f"[fedprune] certificates, keys and logs kept in {fed.work}", flush=True)
    finally:  # every exit, Ctrl-C and SIGTERM included: no CA or node key stays behind
        if not keep_work_dir:
            with signals_held():
                shutil.rmtree(fed.work, ignore_errors=True)
    result = 0 if ok else TIMEOUT_CODE if code == TIMEOUT_CODE else 1
    return Deployment(result, run_dir, status, fed.stopped, fed.logs if keep_work_dir else None)


def _floats(text: str) -> list[float | None]:
    return [float(v) if v.strip() else None for v in text.split(",")] if text else []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fedprune deploy`."""
    parser.add_argument(
        "--run-config",
        action="append",
        default=[],
        help="a TOML preset (conf/X.toml) or 'key=value ...' overrides; repeatable, later wins",
    )
    parser.add_argument(
        "--supernodes", type=int, default=2, help="number of SuperNodes N (partition-id 0..N-1)"
    )
    parser.add_argument(
        "--data-paths",
        default="",
        help="comma-separated JSONL files, one per SuperNode "
        "(empty entry = that node uses its embedded partition), e.g. ',/data/mine.jsonl'",
    )
    parser.add_argument(
        "--resources", default="", help="comma-separated r_i in (0, 1], one per SuperNode or one"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=7200,
        help="seconds the run may take before it is stopped (default: %(default)s)",
    )
    parser.add_argument(
        "--keep-work-dir", action="store_true", help="keep certificates, keys and logs"
    )
    parser.add_argument(
        "--certs-only",
        metavar="DIR",
        help="only write a CA and a server certificate for --san names into DIR (for a real "
        "deployment), then exit; with --supernodes N > 0 also N node key pairs (a rehearsal: "
        "on real devices each makes its own with --node-key)",
    )
    parser.add_argument(
        "--san",
        action="append",
        default=[],
        help="extra DNS name / IP of the SuperLink "
        "for the server certificate (with --certs-only); repeatable",
    )
    parser.add_argument(
        "--node-key",
        metavar="PATH",
        help="on a device: write this SuperNode's key pair (PATH private, 0600; PATH.pub to "
        "give the operator) and exit; the private key never leaves the device",
    )


def run(args: argparse.Namespace) -> int:
    """A local deployment (SuperLink + N SuperNodes over TLS), or with --certs-only its certificates
    and keys."""
    if args.node_key:
        path = Path(args.node_key).expanduser()
        priv, pub = generate_node_keys(path.parent, path.name)
        print(
            f"SuperNode key pair: {priv} (0600, stays on this device; give it to "
            f"flower-supernode --auth-supernode-private-key), {pub} (send it to the operator, who "
            "registers it with `flwr supernode register`)"
        )
        return 0
    if args.certs_only:
        out = Path(args.certs_only)
        certs = generate_certificates(
            out / "certificates", ["localhost", "127.0.0.1", "::1", *args.san]
        )
        keys = [generate_node_keys(out / "keys", f"supernode-{i}") for i in range(args.supernodes)]
        print(
            f"CA certificate (give to every SuperNode and CLI user): {certs.ca_cert}\n"
            f"server certificate and key (SuperLink only): {certs.server_cert}, "
            f"{certs.server_key}\n"
            + "\n".join(
                f"SuperNode key pair: {priv} (stays on the device), {pub} (register it)"
                for priv, pub in keys
            )
        )
        return 0
    signal.signal(
        signal.SIGTERM, lambda *_: sys.exit(143)
    )  # run the clean-up in `deploy` on TERM too
    try:
        specs = node_specs(
            args.supernodes,
            [p.strip() for p in args.data_paths.split(",")] if args.data_paths else [],
            _floats(args.resources),
        )
        return deploy(
            args.run_config, specs, timeout=args.timeout, keep_work_dir=args.keep_work_dir
        ).code
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("[fedprune] deployment stopped by Ctrl-C (SIGINT)", file=sys.stderr)
        return 130
