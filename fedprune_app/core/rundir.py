"""What a run leaves behind: `outputs/<date>-<method>-<tag>/`.

- `config.json`: the resolved run config; `flower-run.json`: the Flower run id (how `fedprune run`
  finds its own run's directory);
- `metrics.jsonl`: one line per (round, client, phase) and per server evaluation, appended as they
  come;
- `summary.json`: `"status"`, wall time, the final per-client table and server metrics, and
  `"warnings"`: one line per final model the run broke (`broken_models`);
- `results.md`: the paper-style tables, every number read from `metrics.jsonl` with its n and 95%
  interval, every term defined under its table, the broken models at the top;
- `plots/*.png`: loss and metrics per round, per client and task;
- `tensorboard/`: every numeric value of `metrics.jsonl` as TensorBoard scalars (`board_scalars`),
  for `tensorboard --logdir outputs/`;
- the final artefacts (written by the strategy, e.g. `adapter/`);
- later, `rescore.json` (fedprune_cli/rescore_rouge.py): per-example Rouge-L of the final model on
  unused examples.
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
from typing import Any, Protocol

from fedprune_app.core.config import RunConfig
from fedprune_app.core.privacy import render_privacy
from fedprune_app.core.statefile import write_text_atomically
from fedprune_app.llm.intervals import proportion_interval


class MethodReport(Protocol):
    """What a method adds to results.md and summary.json: two hooks of `FederatedStrategy`."""

    def server_columns(self) -> dict[str, tuple[str, str]]:
        """{row key: (column heading, legend line)} beside the server's per-round scores."""
        ...

    def results_sections(self, records: list[dict[str, Any]]) -> str:
        """Markdown appended to results.md, rendered from the run's metrics rows."""
        ...


def resolve_output_dir(output_dir: str) -> Path:
    """An absolute `output-dir` as is; a relative one against $FEDPRUNE_OUTPUT_DIR or the working
    directory."""
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
        # the TensorBoard event writer of <run>/tensorboard, opened at the first scalar
        self.board: Any = None

    @classmethod
    def create(cls, cfg: RunConfig, run_id: int | None = None) -> RunDirectory:
        """A new directory `<output-dir>/<date>-<method>[-<tag>][-<n>]` with config.json (and, given
        Flower's `run_id`, flower-run.json): made with one `mkdir` each try, so two runs started in
        the same second each get their own."""
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        name = "-".join(p for p in (stamp, cfg.method, cfg.run_tag) if p)
        root = resolve_output_dir(cfg.output_dir)
        root.mkdir(parents=True, exist_ok=True)
        for suffix in range(1, 10_000):
            path = root / (name if suffix == 1 else f"{name}-{suffix}")
            try:
                path.mkdir()
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free run directory name under {root} for {name}")
        (path / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        if run_id is not None:
            (path / "flower-run.json").write_text(json.dumps({"run-id": run_id}) + "\n")
        return cls(path, cfg)

    def log(self, record: Mapping[str, Any]) -> None:
        """Append one metrics line (a flat dict; `round`, `phase` and `client` are the usual
        keys)."""
        row = {"time": round(time.time() - self.started, 3), **record}
        self.records.append(row)
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        self.write_board([row])

    def extend(self, rows: list[dict[str, Any]]) -> None:
        """Start from rows an earlier run logged (a resumed run begins with the interrupted run's
        rounds)."""
        self.records.extend(rows)
        with open(self.path / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        self.write_board(rows)

    def write_board(self, rows: list[dict[str, Any]]) -> None:
        """Each row's scalars into <run>/tensorboard as one event (torch.utils.tensorboard's
        FileWriter, the writer under SummaryWriter, without its per-scalar overhead): queued in
        memory, written every 30 s and at `finish`."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        for row in rows:
            scalars = board_scalars(row, self.cfg.num_server_rounds)
            if not scalars:
                continue
            if self.board is None:
                from torch.utils.tensorboard.writer import FileWriter

                self.board = FileWriter(
                    str(self.path / "tensorboard"), max_queue=1000, flush_secs=30
                )
            summary = Summary(
                value=[Summary.Value(tag=tag, simple_value=value) for tag, _, value, _ in scalars]
            )
            self.board.add_summary(summary, scalars[0][1], walltime=self.started + scalars[0][3])

    def close_board(self) -> None:
        """Flush and close the TensorBoard writer, if one was opened."""
        if self.board is not None:
            self.board.close()
            self.board = None

    def rows(self, phase: str) -> list[dict[str, Any]]:
        """The logged rows of one phase, in order."""
        return [r for r in self.records if r.get("phase") == phase]

    def finish(
        self,
        status: str,
        extra: Mapping[str, Any] | None = None,
        report: MethodReport | None = None,
    ) -> dict[str, Any]:
        """Write summary.json, results.md and the plots; return the summary.

        Args:
            status: the run's end, `completed` or `failed`.
            extra: more fields for summary.json (artefacts, the error).
            report: what the method adds (its strategy's `server_columns` and `results_sections`).

        Returns:
            The summary; its `warnings`: one line per model the run broke (`broken_models`), also at
            the top of results.md.
        """
        columns = report.server_columns() if report is not None else {}
        table = client_table(self.rows("evaluate"), self.records)
        server: dict[str, dict[str, float]] = defaultdict(dict)
        for r in self.rows("server-evaluate"):
            server[str(r["round"])][f"ppl `{r['data']}`"] = r["ppl"]
            for key, (heading, _) in columns.items():  # numbers the strategy noted beside its score
                if key in r:
                    server[str(r["round"])][heading] = r[key]
        dropped = [
            {
                "round": r.get("round"),
                "phase": r["phase"],
                "node": r.get("node"),
                "problem": r.get("problem", "")[-300:],
            }
            for r in self.records
            if r.get("status") in ("failed", "rejected")
        ]
        flags = broken_models(self.records, self.cfg.method)
        summary = {
            "status": status,
            "method": self.cfg.method,
            "started-at": self.started,
            "seconds": round(time.time() - self.started, 1),
            "clients": table,
            "server": server,
            "references": reference_means(self.rows("reference")),
            "failures": len(dropped),
            "dropped-replies": dropped,
            "warnings": flags,
            **(extra or {}),
        }
        write_text_atomically(self.path / "summary.json", json.dumps(summary, indent=2) + "\n")
        try:
            self.close_board()
        except Exception as err:  # noqa: BLE001 - as the plots: never costs a finished run its status
            warnings.warn(f"writing the TensorBoard events failed: {err!r}", stacklevel=1)
        scored = self.rows("server-evaluate")
        text = render_results(self.cfg, table, scored, summary["seconds"], flags, columns)
        text += render_references(self.cfg, server, self.rows("reference"), scored)
        text += report.results_sections(self.records) if report is not None else ""
        text += render_privacy(self.rows("privacy"))
        if dropped:
            text += (
                f"\n{len(dropped)} client replies failed or were rejected and left out "
                "(details in summary.json and metrics.jsonl).\n"
            )
        write_text_atomically(self.path / "results.md", text)
        try:
            plot_rounds(self.records, self.path / "plots")
        except Exception as err:  # a figure must never cost a finished run its status
            warnings.warn(f"plotting failed: {err!r}", stacklevel=1)
        return summary


def _side(row: Mapping[str, Any], metric: str, side: str) -> dict[str, Any]:
    """One score of an eval row with its n and 95% interval, keyed `<key>/<side>`."""
    if row.get(metric) is None:
        return {}
    lo, hi, n = score_interval(row, metric)
    return {
        f"{metric}/{side}": row[metric],
        f"{metric}-lo/{side}": lo,
        f"{metric}-hi/{side}": hi,
        f"{metric}-n/{side}": n,
    }


def client_table(
    eval_rows: list[dict[str, Any]], records: list[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """Per client: its metrics at round 0 (untouched model) and at its last evaluated round, each
    with its n and 95% interval (`<metric>-n/<side>`, `-lo`, `-hi`), and chance where known.
    `status`: 'ok'; 'failed' (a reply of it in `records` failed or was rejected: `failed-rounds`);
    'stale' (no score from the run's last evaluated round: its tuned scores are left out, never
    its older ones shown as the final model's)."""
    by_client: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in eval_rows:
        if r.get("status") == "ok" and r.get("client") is not None:
            by_client[int(r["client"])][int(r["round"])] = r
    failed: dict[int | str, set[int]] = defaultdict(set)  # "node <id>": it never said its partition
    for r in records:
        if (
            r.get("status") in ("failed", "rejected")
            and isinstance(r.get("round"), int)
            and r.get("phase") in ("train", "evaluate")
        ):
            who = r.get("client") if isinstance(r.get("client"), int) else f"node {r.get('node')}"
            failed[who].add(r["round"])
    final = max((int(r["round"]) for r in eval_rows if isinstance(r.get("round"), int)), default=0)
    table = [
        {
            "client": client,
            "data": "",
            "final-round": None,
            "status": "failed",
            "failed-rounds": sorted(failed[client]),
        }
        for client in sorted(set(failed) - set(by_client))
    ]
    for client in sorted(by_client):
        rounds = by_client[client]
        first, last = rounds.get(0, {}), rounds[max(rounds)]
        stale = max(rounds) < final
        metrics = sorted(k for k in set(first) | set(last) if k in METRIC_NAMES)
        row = {
            "client": client,
            "data": last.get("data", first.get("data", "")),
            "final-round": max(rounds),
            "status": "stale" if stale else "failed" if failed[client] else "ok",
            "failed-rounds": sorted(failed[client]),
        }
        if stale:
            last = {}
        for m in metrics:
            row |= {f"{m}/untouched": first.get(m), f"{m}/tuned": last.get(m)}
            row |= _side(first, m, "untouched") | _side(last, m, "tuned")
        chance = last.get(CHANCE, first.get(CHANCE))
        if chance is not None:
            row[CHANCE] = chance
        table.append(row)
    return sorted(table, key=_client_order)


def _client_order(row: Mapping[str, Any]) -> tuple[int, int, str]:
    """Partition ids in order, then the nodes that never said theirs."""
    client = row["client"]
    return (1, 0, str(client)) if isinstance(client, str) else (0, int(client), "")


def left_out_line(summary: Mapping[str, Any]) -> str:
    """'' when every reply of the run counted, else one line: how many were left out and which
    clients' rows results.md marks."""
    failures = summary.get("failures", 0)
    if not failures:
        return ""
    marked = [
        f"client {row['client']} ({row['status']})"
        for row in summary.get("clients", [])
        if row.get("status", "ok") != "ok"
    ]
    return (
        f"{failures} client repl{'y was' if failures == 1 else 'ies were'} left out (failed or "
        f"rejected){': ' + ', '.join(marked) if marked else ''}; see results.md and "
        "summary.json's dropped-replies"
    )


def client_state(row: Mapping[str, Any]) -> str:
    """'' for a client whose replies all counted, else what results.md marks its row with."""
    rounds = ", ".join(map(str, row.get("failed-rounds", [])))
    failed = f"failed in round {rounds}" if rounds else ""
    if row.get("status") == "stale" or row.get("final-round") is None:
        last = row.get("final-round")
        scored = "never scored" if last is None else f"no score after round {last}"
        return f"⚠ stale: {scored}" + (f", {failed}" if failed else "")
    return f"⚠ {failed}" if failed else ""


METRIC_NAMES = ("acc", "acc_norm", "ppl", "rouge-l", "val-loss")
CHANCE = "acc-chance"  # an eval row's chance accuracy: mean over its questions of 1 / their choices
PPL_BROKEN_RATIO = 2.0  # a perplexity above this × the untouched model's marks a broken model

# How results.md and the plots name each score, and what the name means (the legends).
SCORE_LABELS = {
    "acc": "accuracy",
    "acc_norm": "accuracy, length-normalised",
    "ppl": "perplexity",
    "rouge-l": "Rouge-L",
    "val-loss": "validation loss",
}
SCORE_TERMS = {
    "acc": "accuracy: the share of test questions whose most likely choice (by the model's "
    "log-likelihood) is the right one (lm-eval's `acc`); higher is better",
    "acc_norm": "accuracy, length-normalised: the same, each choice's log-likelihood divided by "
    "its length in characters (lm-eval's `acc_norm`)",
    "ppl": "perplexity: exp(mean negative log-likelihood per token) of the test answers given "
    "their questions, or of the text itself for plain-text data; lower is better",
    "rouge-l": "Rouge-L: the F1 of the longest common subsequence of the generated and the "
    "reference answer, 0 to 1; higher is better",
    "val-loss": "validation loss: mean negative log-likelihood per answer token of the client's "
    "validation split; lower is better",
}

# what a row is, not values
BOARD_IDENTITY = frozenset({"time", "round", "phase", "node", "client", "partition-id"})
BOARD_QUALIFIERS = {
    "server-evaluate": ("data",),
    "reference": ("model", "data"),
    "compiled": ("model",),
}


def _tag_part(value: Any) -> str:
    return re.sub(r"/+", "_", re.sub(r"\s+", "-", str(value).strip())) or "_"


def board_scalars(row: Mapping[str, Any], final_round: int) -> list[tuple[str, int, float, float]]:
    """(tag, step, value, seconds since the run started) of every numeric value of one metrics row,
    but for `BOARD_IDENTITY` fields. Tag `<phase>/<key>`, then what names the row within its phase
    (`BOARD_QUALIFIERS`: server-evaluate `data`, reference `model` and `data`, compiled `model`),
    then `client-<k>` for a client's row: `train/train-loss/client-0`,
    `server-evaluate/ppl/wikitext`, `reference/ppl/standalone/wikitext/client-2`. Step: the row's
    round; rows without one (scored after the last round: references, compiled models) at
    `final_round`. Failed and rejected replies are left out."""
    if row.get("status") in ("failed", "rejected"):
        return []
    phase = _tag_part(row.get("phase", "run"))
    names = [
        _tag_part(row[k])
        for k in BOARD_QUALIFIERS.get(str(row.get("phase")), ())
        if row.get(k) is not None
    ]
    if row.get("client") is not None:
        names.append(f"client-{_tag_part(row['client'])}")
    suffix = "".join(f"/{n}" for n in names)
    step = int(row["round"]) if isinstance(row.get("round"), int | float) else final_round
    offset = float(row["time"]) if isinstance(row.get("time"), int | float) else 0.0
    return [
        (f"{phase}/{_tag_part(key)}{suffix}", step, float(value), offset)
        for key, value in row.items()
        if key not in BOARD_IDENTITY and isinstance(value, int | float)
    ]


def score_interval(
    row: Mapping[str, Any], metric: str
) -> tuple[float | None, float | None, int | None]:
    """(lo, hi, n) of one score of a metrics row: for an accuracy the Wilson interval of its `acc-n`
    questions; else the `<metric>-lo`, `-hi`, `-n` the row carries. None where the row has none."""
    value = row.get(metric)
    if metric in ("acc", "acc_norm"):
        n = row.get("acc-n")
        if not isinstance(value, int | float) or not n or not 0.0 <= value <= 1.0:
            return None, None, int(n) if n else None
        ci = proportion_interval(float(value), int(n))
        return ci.lo, ci.hi, int(n)
    n = row.get(f"{metric}-n")
    return row.get(f"{metric}-lo"), row.get(f"{metric}-hi"), int(n) if n else None


def cell(value: Any) -> str:
    """A number as a results.md table cell: 3 decimals below 10, else 2; `–` for none or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and (math.isinf(value) or abs(value) >= 1e7):
        return _num(value)
    return f"{value:.3f}" if isinstance(value, float) and abs(value) < 10 else f"{value:.2f}"


def _num(value: float) -> str:
    """A number for a sentence: 3 significant digits, powers of ten as `1.5e10`."""
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e5:
        mantissa, exponent = f"{value:.1e}".split("e")
        return f"{mantissa.removesuffix('.0')}e{int(exponent)}"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def interval_cell(lo: Any, hi: Any, n: Any = None) -> str:
    """`[lo, hi]`, or `–` where there is none or it rests on a single unit."""
    if lo is None or hi is None or (n is not None and n < 2):
        return "–"
    return f"[{cell(lo)}, {cell(hi)}]"


def short_name(data: str) -> str:
    """A data source as a person names it: `bigbench:goal_step_wikihow/step_inference` ->
    `goal_step_wikihow`, `squad_shifts:squaddev` -> `squaddev`, a file -> its stem."""
    text = str(data)
    if text.endswith((".jsonl", ".json")):
        return Path(text).stem
    return text.split(":", 1)[-1].split("/")[0] or text


def client_label(client: Any, data: Any) -> str:
    """`client 1 (goal_step_wikihow)`; `client 1` without data."""
    return f"client {client} ({short_name(data)})" if data else f"client {client}"


def _ppl_problem(what: str, final: Any, untouched: Any, ratio: float) -> str | None:
    """Why a final perplexity marks a broken model: above `ratio` × the untouched one, or NaN."""
    numbers = isinstance(final, int | float) and isinstance(untouched, int | float)
    if not numbers or untouched <= 0:
        return None
    if not math.isfinite(final):
        return f"{what} is {final} (the untouched model's {_num(untouched)})"
    if final > ratio * untouched:
        return (
            f"{what} {_num(final)} is {_num(final / untouched)}× the untouched model's "
            f"{_num(untouched)}"
        )
    return None


def _accuracy_problem(acc: Any, n: Any, chance: Any) -> str | None:
    """Why a final accuracy marks a broken model: below chance by its whole 95% (Wilson) interval,
    so that a healthy model near chance on a few questions is not flagged; no n, no verdict."""
    numbers = all(isinstance(v, int | float) for v in (acc, n, chance))
    if not numbers or n < 1 or not 0.0 <= acc <= 1.0:
        return None
    interval = proportion_interval(acc, int(n))
    if interval.hi < chance:
        return (
            f"accuracy {acc:.3f} [{interval.lo:.3f}, {interval.hi:.3f}] (n = {int(n)}) is below "
            f"chance {chance:.3f}"
        )
    return None


def broken_models(
    records: list[dict[str, Any]], method: str, ratio: float = PPL_BROKEN_RATIO
) -> list[str]:
    """One line per final or deployed model that the run broke: a perplexity above `ratio` × the
    untouched model's on the same data, or a multiple-choice accuracy whose 95% interval lies below
    chance. Looks at each client's last evaluation (against its round 0), the server's last score of
    the global model (against round 0; not where the strategy labels the scored model as no one's,
    `model`) and, where no client evaluated its own, the compiled models (against the `dense` one).
    Each line names the model and points to docs/methods/<method>.md."""
    problems: dict[str, list[str]] = defaultdict(list)
    judged = [
        row
        for row in client_table([r for r in records if r.get("phase") == "evaluate"])
        if (row["final-round"] or 0) > 0
    ]
    for row in judged:
        label = client_label(row["client"], row["data"])
        found = _ppl_problem(
            "test perplexity", row.get("ppl/tuned"), row.get("ppl/untouched"), ratio
        )
        problems[label] += [found] if found else []
        found = _accuracy_problem(row.get("acc/tuned"), row.get("acc-n/tuned"), row.get(CHANCE))
        problems[label] += [found] if found else []
    server: dict[str, dict[int, float]] = defaultdict(dict)
    for r in records:
        if (
            r.get("phase") == "server-evaluate"
            and not r.get("model")
            and "round" in r
            and r.get("status") != "failed"
        ):
            server[str(r.get("data"))][int(r["round"])] = r.get("ppl")
    for data, by_round in server.items():
        last = max(by_round)
        if last > 0:
            found = _ppl_problem(
                f"perplexity of the server's text `{short_name(data)}`",
                by_round[last],
                by_round.get(0),
                ratio,
            )
            problems[f"the global model after round {last}"] += [found] if found else []
    # A deployed (compiled) model is judged on the server's text only where no client judged its
    # own: a client's model that beats the untouched one on its own task is specialised, not broken,
    # however it scores on general text (per-client pruned models can score 7-14x the dense one on
    # other text).
    compiled = [] if judged else [r for r in records if r.get("phase") == "compiled"]
    dense = next(
        (r for r in compiled if r.get("model") == "dense"), compiled[0] if compiled else None
    )
    for r in compiled:
        if r is dense:
            continue
        for key in (k for k in r if k.startswith("ppl/")):
            found = _ppl_problem(
                f"perplexity of the server's text `{short_name(key[4:])}`",
                r[key],
                (dense or {}).get(key),
                ratio,
            )
            problems[f"compiled model `{r.get('model')}`"] += [found] if found else []
    doc = f"docs/methods/{method}.md#known-limits"
    return [
        f"⚠ {label}: {'; '.join(found)} — this model is broken; see {doc}"
        for label, found in problems.items()
        if found
    ]


def render_warnings(flags: list[str], ratio: float = PPL_BROKEN_RATIO) -> str:
    """The broken-model lines (`broken_models`) as a list under a heading; none: nothing."""
    if not flags:
        return ""
    head = (
        f"**Broken models** (perplexity above {ratio:g}× the untouched model's on the same "
        "data, or accuracy below chance by its whole 95% interval):"
    )
    return "\n".join([head, "", *(f"- {f}" for f in flags)])


def legend(lines: list[str]) -> list[str]:
    """The `Terms:` list under a results.md table, one line per term."""
    return ["", "Terms:", *(f"- {line}." for line in lines)]


def render_results(
    cfg: RunConfig,
    table: list[dict[str, Any]],
    server_rows: list[dict[str, Any]],
    seconds: float,
    flags: list[str] | None = None,
    columns: Mapping[str, tuple[str, str]] | None = None,
) -> str:
    """results.md's head and first tables: what the file is, the broken-model lines, per client its
    scores before and after federated training, then the server's per-round scores (with the
    strategy's `columns`: {row key: (heading, legend line)}); every score with its n and 95%
    interval, every term defined under its table."""
    rounds = f"{cfg.num_server_rounds} round{'s' * (cfg.num_server_rounds != 1)}"
    lines = [
        f"# {cfg.method}: {rounds}, model `{cfg.model_name}`",
        "",
        f"Scores of the models this `{cfg.method}` run trained, against the untouched base "
        "model: per client on its own test split, and on the server's held-out text. Every "
        "score has its sample size n and its 95% interval; the terms are defined under each "
        "table.",
        "",
    ]
    warned = render_warnings(flags or [])
    lines += [warned, ""] if warned else []
    lines += [f"Wall time {seconds:.0f} s.", ""]
    if not table:
        lines.append(
            "No federated (client-side) evaluation in this run: the method evaluates on "
            "the server, fraction-evaluate is 0, or every client evaluation failed."
        )
    else:
        lines += _client_lines(cfg, table)
    lines += _server_lines(cfg, server_rows, columns or {})
    return "\n".join(lines) + "\n"


def _client_lines(cfg: RunConfig, table: list[dict[str, Any]]) -> list[str]:
    metrics = [
        m for m in METRIC_NAMES if any(f"{m}/untouched" in r or f"{m}/tuned" in r for r in table)
    ]
    final = max((r["final-round"] for r in table if r["final-round"] is not None), default=0)
    after = f"{cfg.method} (round {final})"
    clients = f"{len(table)} client{'s' * (len(table) != 1)}"
    lines = [
        f"Per client ({clients}), each on its own test split: the untouched model and the "
        "model after the last round.",
        "",
        f"| client | data | score | n | untouched | 95% interval | {after} | 95% interval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in table:
        first = True
        state = client_state(row)
        if not any(
            row.get(f"{m}/{side}") is not None for m in metrics for side in ("untouched", "tuned")
        ):
            lines.append(f"| {row['client']} {state} | – | – | – | – | – | failed | – |")
            continue
        for m in metrics:
            if row.get(f"{m}/untouched") is None and row.get(f"{m}/tuned") is None:
                continue
            label = SCORE_LABELS[m]
            if m in ("acc", "acc_norm") and row.get(CHANCE) is not None:
                label += f" (chance {row[CHANCE]:.3f})"
            n = row.get(f"{m}-n/tuned") or row.get(f"{m}-n/untouched")
            who = [f"{row['client']} {state}".strip(), f"`{row['data']}`"] if first else ["", ""]
            cells = [*who, label, str(n) if n else "–"]
            for side in ("untouched", "tuned"):
                stale = side == "tuned" and row.get("status") == "stale"
                cells += [
                    "failed" if stale else cell(row.get(f"{m}/{side}")),
                    interval_cell(
                        row.get(f"{m}-lo/{side}"),
                        row.get(f"{m}-hi/{side}"),
                        row.get(f"{m}-n/{side}"),
                    ),
                ]
            lines.append("| " + " | ".join(cells) + " |")
            first = False
    if len(table) > 1:
        for m in metrics:
            cells = [f"mean of {clients}" if m == metrics[0] else "", "", SCORE_LABELS[m], ""]
            for side in ("untouched", "tuned"):
                vals = [r[f"{m}/{side}"] for r in table if r.get(f"{m}/{side}") is not None]
                some = f" ({len(vals)} of {len(table)})" if vals and len(vals) < len(table) else ""
                cells += [cell(sum(vals) / len(vals)) + some if vals else "–", ""]
            lines.append("| " + " | ".join(cells) + " |")
    terms = [
        "untouched: the base model before any training (round 0)",
        f"{after}: the model each client uses after the last round it evaluated",
        *(
            [
                "⚠: a reply of this client failed or was rejected in the rounds named "
                "(summary.json `dropped-replies`); stale: it sent no score in the run's last "
                "evaluated round, so "
                "its final model has no score (failed)"
            ]
            if any(client_state(r) for r in table)
            else []
        ),
        *(SCORE_TERMS[m] for m in metrics),
    ]
    if any(row.get(CHANCE) is not None for row in table):
        terms.append(
            "chance: the accuracy of guessing, 1 / the number of choices, averaged over "
            "the questions"
        )
    terms.append(
        f"n: test examples scored (for plain-text perplexity: windows of up to "
        f"{cfg.ppl_window} tokens)"
    )
    terms.append(_interval_term(cfg, any(m in metrics for m in ("acc", "acc_norm")), "examples"))
    if len(table) > 1:
        terms.append(
            "mean: the unweighted mean over the clients' scores (on different data: no interval)"
        )
    return lines + legend(terms)


def _interval_term(cfg: RunConfig, accuracy: bool, units: str) -> str:
    """The legend line of the '95% interval' column."""
    text = (
        "95% interval: the range that holds the model's true score with 95% confidence, given "
        "the n scored; "
    )
    if accuracy:
        text += "for an accuracy the Wilson score interval, for the others "
    text += (
        f"a percentile bootstrap over the scored {units} ({cfg.ppl_bootstrap_iters} "
        "resamples); – where none was recorded or n < 2"
    )
    return text


def _server_lines(
    cfg: RunConfig, rows: list[dict[str, Any]], columns: Mapping[str, tuple[str, str]]
) -> list[str]:
    """The server's score of the global model after each round (perplexity of held-out text), after
    the `columns` ({row key: (heading, legend line)}) that its rows carry."""
    rows = [r for r in rows if r.get("status") != "failed" and "round" in r and "data" in r]
    if not rows:
        return []
    scored = next((str(r["model"]) for r in reversed(rows) if r.get("model")), None)
    sources = list(dict.fromkeys(str(r["data"]) for r in rows))
    noted = {key: column for key, column in columns.items() if any(key in r for r in rows)}
    by_round: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        by_round[int(r["round"])][str(r["data"])] = r
    heading = (
        "Server-side evaluation of the global model after each round: perplexity of held-out text."
        if not scored
        else "Server-side evaluation after each round: "
        f"perplexity of held-out text. The model scored: {scored}."
    )
    head = "| round |" + "".join(f" {heading} |" for heading, _ in noted.values())
    for s in sources:
        n = next((_units(r) for r in rows if r["data"] == s and _units(r)), None)
        head += f" ppl `{s}`{f' (n = {n})' if n else ''} | 95% interval |"
    lines = ["", heading, "", head, "|---|" + "---|" * (len(noted) + 2 * len(sources))]
    for rnd in sorted(by_round):
        got = by_round[rnd]
        cells = [str(rnd)]
        for key in noted:
            cells.append(cell(next((r.get(key) for r in got.values()), None)))
        for s in sources:
            r = got.get(s, {})
            cells += [cell(r.get("ppl")), interval_cell(r.get("ppl-lo"), r.get("ppl-hi"), _n(r))]
        lines.append("| " + " | ".join(cells) + " |")
    terms = [
        "round 0: the untouched base model; round r: the model after round r",
        f"ppl: perplexity of the text, exp(mean negative log-likelihood per token), scored in "
        f"windows of up to {cfg.ppl_window} tokens; lower is better",
        "n: windows scored (and their tokens)",
        _interval_term(cfg, False, "windows"),
    ]
    terms += [term for _, term in noted.values()]
    return lines + legend(terms)


def _n(row: Mapping[str, Any]) -> int | None:
    """The number of windows a perplexity row scored, where it says."""
    if row.get("ppl-n"):
        return int(row["ppl-n"])
    return len(row["window-nll"]) if isinstance(row.get("window-nll"), list) else None


def _units(row: Mapping[str, Any]) -> str | None:
    """`4 windows, 1023 tokens` of a perplexity row."""
    n, tokens = _n(row), row.get("ppl-tokens")
    if n is None:
        return None
    return f"{n} window{'s' * (n != 1)}" + (f", {int(tokens)} tokens" if tokens else "")


def reference_means(refs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{model: {data: ppl}} from the `reference` rows; a client-built reference (one row per client)
    is the mean over its clients, as the pruning papers report such a row; `clients` counts them."""
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


def render_references(
    cfg: RunConfig,
    server: Mapping[str, Mapping[str, float]],
    refs: list[dict[str, Any]],
    server_rows: list[dict[str, Any]] | None = None,
) -> str:
    """Dense (round 0), each comparison model, and the method's final global model, per held-out
    source, each perplexity with its 95% interval where a single model's row carries one
    (`server_rows`: the server's per-round rows)."""
    means = reference_means(refs)
    if not means:
        return ""
    sources = list(dict.fromkeys(r["data"] for r in refs if "data" in r))
    scored = {(str(r.get("round")), str(r.get("data"))): r for r in server_rows or []}
    rows: dict[str, dict[str, Any]] = {}

    def at_round(rnd: str) -> dict[str, Any]:
        return {
            src: scored.get((rnd, src), {"ppl": server[rnd].get(f"ppl `{src}`")}) for src in sources
        }

    if "0" in server:
        rows["dense (round 0)"] = at_round("0")
    for name, vals in means.items():
        label = f"{name} (mean of {int(vals['clients'])} clients)" if "clients" in vals else name
        single = (
            {}
            if "clients" in vals
            else {
                str(r["data"]): r
                for r in refs
                if r.get("model") == name and r.get("status") != "failed"
            }
        )
        rows[label] = {src: single.get(src, {"ppl": vals.get(src)}) for src in sources}
    last = max(server, key=int) if server else None
    if last is not None and last != "0":
        rows[f"{cfg.method} (round {last})"] = at_round(last)
    head = "| model |" + "".join(f" `{s}` | 95% interval |" for s in sources)
    lines = [
        "",
        "Comparison (perplexity of held-out text; the same texts for every row):",
        "",
        head,
        "|---|" + "---|---|" * len(sources),
    ]
    for name, vals in rows.items():
        cells = [name]
        for s in sources:
            r = vals.get(s) or {}
            cells += [cell(r.get("ppl")), interval_cell(r.get("ppl-lo"), r.get("ppl-hi"), _n(r))]
        lines.append("| " + " | ".join(cells) + " |")
    terms = [
        "dense (round 0): the untouched base model",
        f"{cfg.method} (round r): the global model after the last round",
        "a model 'mean of k clients': each client's own model, the mean of their perplexities "
        "(no interval)",
        "perplexity: exp(mean negative log-likelihood per token) of the held-out text; lower "
        "is better",
        _interval_term(cfg, False, "windows"),
    ]
    return "\n".join(lines + legend(terms)) + "\n"


# Each plot's title and y-axis label, by its file name (`<phase>-<metric>`, or the train loss).
PLOT_TEXT = {
    "evaluate-acc": (
        "Multiple-choice accuracy on each client's test split",
        "accuracy (share of questions right)",
    ),
    "evaluate-acc_norm": (
        "Length-normalised multiple-choice accuracy on each client's test split",
        "accuracy, length-normalised",
    ),
    "evaluate-ppl": ("Perplexity on each client's test split", "perplexity (lower is better)"),
    "evaluate-rouge-l": (
        "Rouge-L of the generated answers on each client's test split",
        "Rouge-L F1 (0 to 1)",
    ),
    "evaluate-val-loss": (
        "Validation loss on each client's validation split",
        "loss (nats per answer token)",
    ),
    "train-loss": (
        "Training loss of each client, mean over the round's local steps",
        "loss (nats per token)",
    ),
    "train-val-loss": (
        "Validation loss of each client after its local training",
        "loss (nats per answer token)",
    ),
    "server-evaluate-ppl": (
        "Server: perplexity of the global model on held-out text",
        "perplexity (lower is better)",
    ),
}
SHARE_METRICS = ("acc", "acc_norm", "rouge-l")  # scores in [0, 1]: drawn on a 0-1 axis


def plot_series(
    records: list[dict[str, Any]],
) -> dict[str, dict[str, list[tuple[int, float, float | None, float | None]]]]:
    """{plot name: {series label: [(round, value, lo, hi), ...] sorted by round}} of every per-round
    score; a client's series is labelled `client_label`, the server's by its held-out text."""
    series: dict[str, dict[str, list[tuple[int, float, float | None, float | None]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in records:
        if r.get("status") in ("failed", "rejected") or "round" not in r:
            continue
        phase = str(r.get("phase"))
        who = (
            f"server: {short_name(str(r.get('data')))} text"
            if phase == "server-evaluate"
            else client_label(r.get("client"), r.get("data"))
        )
        for k, v in r.items():
            if k in (*METRIC_NAMES, "train-loss") and isinstance(v, int | float):
                lo, hi, _ = score_interval(r, k)
                name = k if k.startswith(phase) else f"{phase}-{k}"
                series[name][who].append((int(r["round"]), float(v), lo, hi))
    for lines in series.values():
        for pts in lines.values():
            pts.sort(key=lambda p: p[0])
    return series


def plot_rounds(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per score: its value per round, one line per client (and the server), 95% intervals
    as error bars where known, chance accuracy dotted. A single round's score: a bar per client."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    out_dir.mkdir(parents=True, exist_ok=True)
    chance = {
        client_label(r.get("client"), r.get("data")): float(r[CHANCE])
        for r in records
        if r.get("phase") == "evaluate" and isinstance(r.get(CHANCE), int | float)
    }
    paths = []
    for name, lines in plot_series(records).items():
        title, ylabel = PLOT_TEXT.get(name, (name, name))
        metric = name.removeprefix("server-evaluate-").removeprefix("evaluate-")
        fig, ax = plt.subplots(figsize=(7, 4))
        rounds = sorted({p[0] for pts in lines.values() for p in pts})
        chances = chance if metric in ("acc", "acc_norm") else {}
        if len(rounds) == 1:
            _bars(ax, lines, chances)
            title += f", round {rounds[0]}"
        else:
            _lines(
                ax,
                lines,
                rounds,
                chances,
                "round" if name.startswith("train") else "round (0 = untouched model)",
            )
        values = [p[1] for pts in lines.values() for p in pts if math.isfinite(p[1])]
        if metric in SHARE_METRICS:
            ax.set_ylim(0, 1)
        elif values and min(values) > 0 and max(values) / min(values) > 20:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _num(v)))
        if any(_errors(pts) for pts in lines.values()):
            title += "\n(error bars: 95% intervals)"
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _errors(pts: list[tuple[int, float, float | None, float | None]]) -> Any:
    """matplotlib's yerr (2 × n distances below and above) where every point has an interval."""
    if not all(lo is not None and hi is not None for _, _, lo, hi in pts):
        return None
    return [[max(0.0, v - lo) for _, v, lo, _ in pts], [max(0.0, hi - v) for _, v, _, hi in pts]]


def _lines(
    ax: Any,
    lines: Mapping[str, list[tuple[int, float, float | None, float | None]]],
    rounds: list[int],
    chance: Mapping[str, float],
    xlabel: str,
) -> None:
    """A line per series; series side by side around each round so that their error bars do not hide
    each other; each client's chance accuracy dotted in its colour."""
    names = sorted(lines)
    gap = min((b - a for a, b in zip(rounds, rounds[1:], strict=False)), default=1)
    step = 0.06 * gap if any(_errors(pts) for pts in lines.values()) else 0.0
    for i, who in enumerate(names):
        pts, shift = lines[who], (i - (len(names) - 1) / 2) * step
        drawn = ax.errorbar(
            [p[0] + shift for p in pts],
            [p[1] for p in pts],
            yerr=_errors(pts),
            marker="o",
            capsize=3,
            label=who,
        )
        if who in chance:
            ax.axhline(
                chance[who],
                color=drawn[0].get_color(),
                linestyle=":",
                linewidth=1.2,
                label=f"chance, {who.split(' (')[0]} ({chance[who]:.2f})",
            )
    ax.set_xlabel(xlabel)
    if len(rounds) <= 20:
        ax.set_xticks(rounds)
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _bars(
    ax: Any,
    lines: Mapping[str, list[tuple[int, float, float | None, float | None]]],
    chance: Mapping[str, float],
) -> None:
    """One bar per series (its single point), its value above it and its chance accuracy dotted."""
    names = sorted(lines)
    pts = [lines[who][-1] for who in names]
    ax.bar(
        range(len(names)),
        [p[1] for p in pts],
        yerr=_errors(pts),
        capsize=4,
        color=[f"C{i}" for i in range(len(names))],
    )
    labelled = False
    for i, (who, p) in enumerate(zip(names, pts, strict=True)):
        ax.annotate(_num(p[1]), (i, p[1]), textcoords="offset points", xytext=(8, 3), fontsize=8)
        if who in chance:
            ax.hlines(
                chance[who],
                i - 0.4,
                i + 0.4,
                colors="black",
                linestyles=":",
                label=None if labelled else "chance",
            )
            labelled = True
    ax.set_xticks(range(len(names)), names, fontsize=8, rotation=15 if len(names) > 3 else 0)
