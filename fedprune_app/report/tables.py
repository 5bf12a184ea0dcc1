"""results.md's tables and the broken-model judgement: every number read from `metrics.jsonl`
with its n and 95% interval, every term defined under its table, the broken models at the top; the
differential-privacy table; `MethodReport`, what a method adds."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from fedprune_app.core.config import RunConfig
from fedprune_app.core.privacy import VOID
from fedprune_app.llm.intervals import proportion_interval


class MethodReport(Protocol):
    """What a method adds to results.md and summary.json: two hooks of `FederatedStrategy`."""

    def server_columns(self) -> dict[str, tuple[str, str]]:
        """{row key: (column heading, legend line)} beside the server's per-round scores."""
        ...

    def results_sections(self, records: list[dict[str, Any]]) -> str:
        """Markdown appended to results.md, rendered from the run's metrics rows."""
        ...


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
        return num_text(value)
    return f"{value:.3f}" if isinstance(value, float) and abs(value) < 10 else f"{value:.2f}"


def num_text(value: float) -> str:
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
        return f"{what} is {final} (the untouched model's {num_text(untouched)})"
    if final > ratio * untouched:
        return (
            f"{what} {num_text(final)} is {num_text(final / untouched)}× the untouched model's "
            f"{num_text(untouched)}"
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


# --- the differential-privacy table ------------------------------------------------------------


def render_privacy(rows: Sequence[Mapping[str, Any]]) -> str:
    """results.md's privacy table: per round ε at δ, σ, C, m and the noise's standard deviation; the
    budget stop when there was one. Empty when the run had no differential privacy."""
    released = [r for r in rows if r.get("status") == "released"]
    stopped = [r for r in rows if r.get("status") == "budget-exhausted"]
    carried = [r for r in rows if r.get("status") == "carried"]
    if not released and not stopped:
        return ""
    lines = [
        "",
        "## Differential privacy",
        "",
        "| round | ε | δ | σ | C | sampled m | replies | noise std σ·C/m | clipped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in released:
        eps = r.get("dp-epsilon")
        shown = "void" if r.get("dp-void") else "∞" if eps is None else f"{eps:.3f}"
        lines.append(
            f"| {r['round']} | {shown} | {r['dp-delta']:g} | "
            f"{r['dp-noise-multiplier']:g} | {r['dp-clipping-norm']:g} | {r['dp-sampled']} | "
            f"{r['dp-replies']} | {r['dp-noise-std']:.3g} | {r['dp-clipped']}/{r['dp-replies']} |"
        )
    for r in carried:
        lines += [
            "",
            f"Resumed after round {r['round']}: the interrupted run had released "
            f"{r['dp-releases']} time(s) ({r['dp-beyond-checkpoint']} after its checkpoint); "
            "every one stays charged, and a round released again drew fresh noise and was charged "
            "again.",
        ]
    if any(r.get("dp-void") for r in released):
        lines += ["", f"**ε is void**, {VOID}."]
    for r in stopped:
        lines += [
            "",
            f"Round {r['round']} was not started: its release would take ε to "
            f"{r['dp-epsilon-next']:.3f} > dp-max-epsilon = {r['dp-max-epsilon']:g}; the final "
            f"models are those of round {r['round'] - 1}.",
        ]
    lines += [
        "",
        "Client-level DP-FedAvg (McMahan et al. 2018): each update clipped to L2 norm C, uniform "
        "mean over the m sampled clients, Gaussian noise σ·C/m; ε from Flower's RDP accountant "
        "(dp-accounting), no amplification by sampling, add-or-remove-one client; the noise "
        "from fresh OS entropy, kept nowhere. Central DP: the server is trusted with the clipped "
        "updates. Metrics, evaluation replies and per-client artefacts are not covered "
        "(docs/privacy.md). ∞: σ = 0, clipping alone.",
        "",
    ]
    return "\n".join(lines)
