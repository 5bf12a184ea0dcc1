"""What a run leaves behind: `outputs/<date>-<method>-<tag>/`.

- `config.json`: the resolved run config;
- `metrics.jsonl`: one line per (round, client, phase) and per server evaluation, appended as they come;
- `summary.json`: `"status"`, wall time, the final per-client table and server metrics;
- `results.md`: the paper-style table, every number read from `metrics.jsonl`;
- `plots/*.png`: loss and metrics per round;
- `tensorboard/`: every numeric value of `metrics.jsonl` as TensorBoard scalars (`board_scalars`), for
  `tensorboard --logdir outputs/`;
- the final artefacts (written by the strategy, e.g. `adapter/`);
- later, `rescore.json` (tools/rescore_rouge.py): per-example Rouge-L of the final model on unused examples.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import warnings
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from fedprune_app.core.config import RunConfig


def resolve_output_dir(output_dir: str) -> Path:
    """An absolute `output-dir` as is; a relative one against $FEDPRUNE_OUTPUT_DIR or the working directory."""
    path = Path(output_dir).expanduser()
    if not path.is_absolute():
        path = Path(os.environ.get("FEDPRUNE_OUTPUT_DIR", os.getcwd())) / path
    return path


class RunDirectory:
    """The run directory and its append-only metrics log."""

    def __init__(self, path: Path, cfg: RunConfig) -> None:
        self.path = path
        self.cfg = cfg
        self.started = time.time()
        self.records: list[dict[str, Any]] = []
        self.board: Any = None  # the TensorBoard event writer of <run>/tensorboard, opened at the first scalar

    @classmethod
    def create(cls, cfg: RunConfig) -> RunDirectory:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        name = "-".join(p for p in (stamp, cfg.method, cfg.run_tag) if p)
        root = resolve_output_dir(cfg.output_dir)
        path = root / name
        suffix = 1
        while path.exists():
            suffix += 1
            path = root / f"{name}-{suffix}"
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        return cls(path, cfg)

    def log(self, record: Mapping[str, Any]) -> None:
        """Append one metrics line (a flat dict; `round`, `phase` and `client` are the usual keys)."""
        row = {"time": round(time.time() - self.started, 3), **record}
        self.records.append(row)
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        self.write_board([row])

    def extend(self, rows: list[dict[str, Any]]) -> None:
        """Start from rows an earlier run logged (a resumed run begins with the interrupted run's rounds)."""
        self.records.extend(rows)
        with open(self.path / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        self.write_board(rows)

    def write_board(self, rows: list[dict[str, Any]]) -> None:
        """Each row's scalars into <run>/tensorboard as one event (torch.utils.tensorboard's FileWriter, the writer
        under SummaryWriter, without its per-scalar overhead): queued in memory, written every 30 s and at `finish`."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        for row in rows:
            scalars = board_scalars(row, self.cfg.num_server_rounds)
            if not scalars:
                continue
            if self.board is None:
                from torch.utils.tensorboard.writer import FileWriter

                self.board = FileWriter(str(self.path / "tensorboard"), max_queue=1000, flush_secs=30)
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, _, value, _ in scalars])
            self.board.add_summary(summary, scalars[0][1], walltime=self.started + scalars[0][3])

    def close_board(self) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None

    def rows(self, phase: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("phase") == phase]

    def finish(self, status: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Write summary.json, results.md and the plots; return the summary."""
        table = client_table(self.rows("evaluate"))
        server: dict[str, dict[str, float]] = defaultdict(dict)
        for r in self.rows("server-evaluate"):
            server[str(r["round"])][f"ppl `{r['data']}`"] = r["ppl"]
            if "kept-ratio-prunable" in r:  # a strategy that says what it scored (SFT-P: global_model_notes)
                server[str(r["round"])]["kept (prunable)"] = r["kept-ratio-prunable"]
        scored = next((str(r["model"]) for r in reversed(self.rows("server-evaluate")) if r.get("model")), None)
        dropped = [{"round": r.get("round"), "phase": r["phase"], "node": r.get("node"),
                    "problem": r.get("problem", "")[-300:]}
                   for r in self.records if r.get("status") in ("failed", "rejected")]
        summary = {"status": status, "method": self.cfg.method, "started-at": self.started,
                   "seconds": round(time.time() - self.started, 1),
                   "clients": table, "server": server, "references": reference_means(self.rows("reference")),
                   "failures": len(dropped), "dropped-replies": dropped, **(extra or {})}
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        try:
            self.close_board()
        except Exception as err:  # noqa: BLE001 - as the plots: never costs a finished run its status
            warnings.warn(f"writing the TensorBoard events failed: {err!r}", stacklevel=1)
        text = render_results(self.cfg, table, server, summary["seconds"], scored)
        text += render_references(self.cfg, server, self.rows("reference"))
        text += render_compiled(self.rows("compiled"))
        if dropped:
            text += (f"\n{len(dropped)} client replies failed or were rejected and left out "
                     "(details in summary.json and metrics.jsonl).\n")
        (self.path / "results.md").write_text(text)
        try:
            plot_rounds(self.records, self.path / "plots")
        except Exception as err:  # a figure must never cost a finished run its status
            warnings.warn(f"plotting failed: {err!r}", stacklevel=1)
        return summary


def client_table(eval_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per client: its metrics at round 0 (untouched model) and at its last evaluated round."""
    by_client: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in eval_rows:
        if r.get("status") == "ok" and r.get("client") is not None:
            by_client[int(r["client"])][int(r["round"])] = r
    table = []
    for client in sorted(by_client):
        rounds = by_client[client]
        first, last = rounds.get(0, {}), rounds[max(rounds)]
        metrics = sorted(k for k in set(first) | set(last) if k in METRIC_NAMES)
        table.append({"client": client, "data": last.get("data", first.get("data", "")),
                      "final-round": max(rounds),
                      **{f"{m}/untouched": first.get(m) for m in metrics},
                      **{f"{m}/tuned": last.get(m) for m in metrics}})
    return table


METRIC_NAMES = ("acc", "acc_norm", "ppl", "rouge-l", "val-loss")

BOARD_IDENTITY = frozenset({"time", "round", "phase", "node", "client", "partition-id"})  # what a row is, not values
BOARD_QUALIFIERS = {"server-evaluate": ("data",), "reference": ("model", "data"), "compiled": ("model",)}


def _tag_part(value: Any) -> str:
    return re.sub(r"/+", "_", re.sub(r"\s+", "-", str(value).strip())) or "_"


def board_scalars(row: Mapping[str, Any], final_round: int) -> list[tuple[str, int, float, float]]:
    """(tag, step, value, seconds since the run started) of every numeric value of one metrics row, but for
    `BOARD_IDENTITY` fields. Tag `<phase>/<key>`, then what names the row within its phase
    (`BOARD_QUALIFIERS`: server-evaluate `data`, reference `model` and `data`, compiled `model`), then
    `client-<k>` for a client's row: `train/train-loss/client-0`, `server-evaluate/ppl/wikitext`,
    `reference/ppl/standalone/wikitext/client-2`. Step: the row's round; rows without one (scored after the last
    round: references, compiled models) at `final_round`. Failed and rejected replies are left out."""
    if row.get("status") in ("failed", "rejected"):
        return []
    phase = _tag_part(row.get("phase", "run"))
    names = [_tag_part(row[k]) for k in BOARD_QUALIFIERS.get(str(row.get("phase")), ()) if row.get(k) is not None]
    if row.get("client") is not None:
        names.append(f"client-{_tag_part(row['client'])}")
    suffix = "".join(f"/{n}" for n in names)
    step = int(row["round"]) if isinstance(row.get("round"), int | float) else final_round
    offset = float(row["time"]) if isinstance(row.get("time"), int | float) else 0.0
    return [(f"{phase}/{_tag_part(key)}{suffix}", step, float(value), offset) for key, value in row.items()
            if key not in BOARD_IDENTITY and isinstance(value, int | float)]


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if not isinstance(value, int | float):
        return str(value)
    return f"{value:.3f}" if isinstance(value, float) and abs(value) < 10 else f"{value:.2f}"


def render_results(cfg: RunConfig, table: list[dict[str, Any]], server: Mapping[str, Any], seconds: float,
                   scored: str | None = None) -> str:
    """The results table in Markdown (per client: untouched vs after federated tuning); then the server's
    per-round scores, with `scored` (what the strategy's `global_model` built, when it says) in the heading."""
    metrics = [m for m in METRIC_NAMES if any(f"{m}/untouched" in row for row in table)]
    lines = [f"# {cfg.method}: {cfg.num_server_rounds} rounds, model `{cfg.model_name}`", "",
             f"Wall time {seconds:.0f} s.", ""]
    if not table:
        lines.append("No federated (client-side) evaluation in this run: the method evaluates on the server, "
                     "fraction-evaluate is 0, or every client evaluation failed.")
    else:
        clients = f"{len(table)} client{'s' * (len(table) != 1)}"
        lines += [f"{clients}, each on its own test split: the untouched model (round 0) and the federated model "
                  "after the last round.", ""]
        head = "| client | data | " + " | ".join(f"{m} untouched | {m} {cfg.method}" for m in metrics) + " |"
        lines += [head, "|" + "---|" * (2 + 2 * len(metrics))]
        for row in table:
            cells = [str(row["client"]), f"`{row['data']}`"]
            for m in metrics:
                cells += [_fmt(row.get(f"{m}/untouched")), _fmt(row.get(f"{m}/tuned"))]
            lines.append("| " + " | ".join(cells) + " |")
        cells = ["mean", ""]
        for m in metrics:
            for side in ("untouched", "tuned"):
                vals = [row[f"{m}/{side}"] for row in table if row.get(f"{m}/{side}") is not None]
                cells.append(_fmt(sum(vals) / len(vals)) if vals else "–")
        lines.append("| " + " | ".join(cells) + " |")
    if server:
        rounds = sorted(server, key=int)
        keys = sorted({k for r in rounds for k in server[r]})
        heading = ("Server-side evaluation of the global model (perplexity of held-out text):" if not scored else
                   f"Server-side evaluation after each round (perplexity of held-out text). The model scored: "
                   f"{scored}.")
        lines += ["", heading, "", "| round | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
        for r in rounds:
            lines.append(f"| {r} | " + " | ".join(_fmt(server[r].get(k)) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def reference_means(refs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{model: {data: ppl}} from the `reference` rows; a client-built reference (one row per client) is the mean
    over its clients, as the FedSpaLLM paper reports its `standalone` row; `clients` counts them."""
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in refs:
        if r.get("status") != "failed" and isinstance(r.get("ppl"), int | float):
            per[str(r["model"])][str(r["data"])].append(float(r["ppl"]))
    out: dict[str, dict[str, float]] = {}
    for name, by_data in per.items():
        out[name] = {data: sum(v) / len(v) for data, v in by_data.items()}
        if any(r.get("client") is not None for r in refs if r.get("model") == name):
            out[name]["clients"] = max(len(v) for v in by_data.values())
    return out


def render_compiled(rows: list[dict[str, Any]]) -> str:
    """SFT-P's compiled client models against the dense one: size and, when timed, prefill and generation, each
    speed-up beside its FLOP ceiling and the share of it reached; then, when scored, the server's perplexity of
    its held-out text for each of them (the models the clients deploy)."""
    if not rows:
        return ""
    timed = "prefill-ms" in rows[0]
    ceiling = timed and "prefill-ceiling" in rows[0]
    lines = ["", "Compiled models (each client's deployable model: LoRA merged, sliced by its mask)"
             + (f"; prefill of {rows[0]['prefill-tokens']} tokens, batch 1, and 32 greedy tokens, medians of 3, "
                "timed round-robin in one process" if timed else "")
             + ("; ceiling = FLOPs(dense) / FLOPs(model) of the same workload (every matmul: pruned projections, "
                "attention, the unpruned LM head), of ceiling = speed-up / ceiling" if ceiling else "") + ":", ""]
    head, rule = "| model | params | params ratio | MB |", "|---|---|---|---|"
    if timed:
        head += " prefill ms | speed-up |" + (" ceiling | of ceiling |" if ceiling else "") + " generation tok/s |"
        rule += "---|---|" + ("---|---|" if ceiling else "") + "---|"
        if ceiling:
            head += " speed-up | ceiling | of ceiling |"
            rule += "---|---|---|"
    lines += [head, rule]
    for r in rows:
        line = f"| {r['model']} | {r['params'] / 1e6:.1f} M | {r['params-ratio']:.3f} | {r['MB']:.1f} |"
        if timed:
            line += f" {r['prefill-ms']:.0f} | {r['prefill-speedup']:.2f}× |"
            if ceiling:
                line += f" {r['prefill-ceiling']:.2f}× | {r['prefill-of-ceiling']:.2f} |"
            line += f" {r['generate-tok-s']:.1f} |"
            if ceiling:
                line += (f" {r['generate-speedup']:.2f}× | {r['generate-ceiling']:.2f}× |"
                         f" {r['generate-of-ceiling']:.2f} |")
        lines.append(line)
    sources = list(dict.fromkeys(k[4:] for r in rows for k in r if k.startswith("ppl/")))
    if sources:
        lines += ["", "Server-side evaluation of the deployed models: the server's held-out text (the per-round "
                  "evaluation's) scored by the dense base model and by each client's compiled model after the last "
                  "round (perplexity):", "",
                  "| model | kept (prunable) | " + " | ".join(f"ppl `{s}`" for s in sources) + " |",
                  "|---|---|" + "---|" * len(sources)]
        lines += [f"| {r['model']} | {_fmt(r.get('kept-ratio-prunable'))} | "
                  + " | ".join(_fmt(r.get(f"ppl/{s}")) for s in sources) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_references(cfg: RunConfig, server: Mapping[str, Mapping[str, float]],
                      refs: list[dict[str, Any]]) -> str:
    """Dense (round 0), each comparison model, and the method's final global model, per held-out source."""
    means = reference_means(refs)
    if not means:
        return ""
    sources = list(dict.fromkeys(r["data"] for r in refs if "data" in r))
    rows: dict[str, dict[str, float]] = {}
    if "0" in server:
        rows["dense (round 0)"] = {src: server["0"].get(f"ppl `{src}`") for src in sources}
    for name, vals in means.items():
        label = f"{name} (mean of {int(vals['clients'])} clients)" if "clients" in vals else name
        rows[label] = vals
    last = max(server, key=int) if server else None
    if last is not None and last != "0":
        rows[f"{cfg.method} (round {last})"] = {src: server[last].get(f"ppl `{src}`") for src in sources}
    lines = ["", "Comparison (perplexity of held-out text; the same texts for every row):", "",
             "| model | " + " | ".join(f"`{s}`" for s in sources) + " |", "|---|" + "---|" * len(sources)]
    lines += [f"| {name} | " + " | ".join(_fmt(vals.get(s)) for s in sources) + " |" for name, vals in rows.items()]
    return "\n".join(lines) + "\n"


def plot_rounds(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per metric: its value per round, a line per client (and the server)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out_dir.mkdir(parents=True, exist_ok=True)
    series: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("status") in ("failed", "rejected") or "round" not in r:
            continue
        who = f"server {r.get('data')}" if r.get("phase") == "server-evaluate" else f"client {r.get('client')}"
        for k, v in r.items():
            if k in (*METRIC_NAMES, "train-loss") and isinstance(v, int | float):
                phase = str(r.get("phase"))
                series[k if k.startswith(phase) else f"{phase}-{k}"][who].append((int(r["round"]), float(v)))
    paths = []
    for name, lines in series.items():
        fig, ax = plt.subplots(figsize=(5, 3.2))
        for who, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=who)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(name)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
