"""SFT-P beside the two references a reader needs: the floor and the ceiling, on the same clients
and data.

`make run` calls this with `conf/sftp.toml`. Three `flwr run` simulations through `fedprune run`,
one after the other, with the same preset, overrides and federation:

1. **SFT-P**: the run as configured (its compiled models are what the clients deploy);
2. **ceiling**: the same run with every gate held open (`hold-open='all'`): the dense model
   trained by the same recipe, steps and data (LoRA with the same schedule; the generator gets no
   gradient);
3. **floor**: the post hoc cut at the same budget: LLM-Pruner's round 1 (first-order Taylor
   importance of kv groups and MLP channels from every client, averaged, one global cut at p on
   SFT-P's parameter accounting, no training; `method='llmpruner' num-server-rounds=1`). It is the
   better of the app's two post hoc cuts: on `make run`'s clients at keep 0.8 fedflap's cut of the
   bus lanes (FLAP without its bias compensation) scored answer perplexity 604–11,282, LLM-Pruner's
   44–805 (docs/methods/sftp.md).

The references skip what the SFT-P run measures already (round 0's untouched model, the server's
view); they need one budget p for every client. Then one table per client from the three runs'
`metrics.jsonl`: answer perplexity and accuracy of the untouched model (SFT-P's round 0), the floor,
SFT-P and the ceiling; SFT-P's kept ratio, its perplexity ratio to the ceiling and its compiled
model's measured prefill speed-up beside the FLOP ceiling of that speed-up. Accuracies carry a 95%
binomial interval (normal approximation, n = test examples). Written to `<SFT-P run>/references.md`
and `references.json` and printed. Exits non-zero if any of the three runs failed.

    fedprune run --references --run-config conf/sftp.toml \\
        --federation-config "num-supernodes=4 client-resources-num-cpus=1"
    fedprune run --references --render outputs/<sftp run> outputs/<ceiling run> outputs/<floor run>
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

from fedprune_app.core.config import ConfigError
from fedprune_cli import launch

# The references skip what the SFT-P run already measures: the untouched model (round 0) and the
# server's view.
SKIP = "eval-untouched=false server-eval-data=''"
CEILING = f"hold-open='all' sftp-speed-prefill=0 {SKIP} run-tag='ceiling'"


def floor_overrides(keep_ratio: float) -> str:
    """LLM-Pruner's post hoc cut at SFT-P's budget: its round 1 only (importance, cut, evaluation),
    no recovery."""
    return (
        f"method='llmpruner' llmpruner-keep-ratio={keep_ratio:g} llmpruner-centralized=false "
        f"num-server-rounds=1 {SKIP} run-tag='post-hoc'"
    )


def single_budget(config: dict[str, Any]) -> float:
    """The one keep ratio p of `keep-ratios`; ConfigError when the clients have several."""
    values = {float(v) for v in str(config.get("keep-ratios", "")).split(",") if v.strip()}
    if len(values) != 1:
        raise ConfigError(
            "fedprune_cli.references compares against references at one budget: run-config key "
            "'keep-ratios' must hold a single keep ratio, got "
            f"{config.get('keep-ratios')!r}"
        )
    return values.pop()


def evaluate_rows(run_dir: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """{(round, client): row} of a run's successful `evaluate` rows."""
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if (
            row.get("phase") == "evaluate"
            and row.get("status", "ok") == "ok"
            and row.get("client") is not None
        ):
            rows[(int(row["round"]), int(row["client"]))] = row
    return rows


def compiled_rows(run_dir: Path) -> dict[int, dict[str, Any]]:
    """{client: row} of SFT-P's `compiled` rows (model 'client k')."""
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("phase") == "compiled" and str(row.get("model", "")).startswith("client "):
            rows[int(str(row["model"]).split()[1])] = row
    return rows


def accuracy_interval(acc: float, n: int) -> tuple[float, float]:
    """95% normal-approximation binomial interval of an accuracy over n examples."""
    half = 1.96 * math.sqrt(max(acc * (1 - acc), 0.0) / max(n, 1))
    return acc - half, acc + half


def compare(sftp_dir: Path, ceiling_dir: Path, floor_dir: Path) -> list[dict[str, Any]]:
    """One row per client: untouched / floor / SFT-P / ceiling scores, kept ratio, ratio to the
    ceiling, speed."""
    sftp, ceiling, floor = (
        evaluate_rows(sftp_dir),
        evaluate_rows(ceiling_dir),
        evaluate_rows(floor_dir),
    )
    last = max(r for r, _ in sftp)
    last_ceiling = max(r for r, _ in ceiling)
    speed = compiled_rows(sftp_dir)
    out = []
    for client in sorted(c for r, c in sftp if r == 0):
        untouched, trained = sftp[(0, client)], sftp.get((last, client), {})
        top, bottom = ceiling.get((last_ceiling, client), {}), floor.get((1, client), {})
        n = int(untouched.get("num-examples", 0))
        row: dict[str, Any] = {
            "client": client,
            "data": untouched.get("data"),
            "n": n,
            "keep-target": trained.get("keep-target"),
            "kept": trained.get("kept-ratio-prunable"),
            "floor-kept": bottom.get("kept-ratio-prunable"),
        }
        for name, src in (
            ("untouched", untouched),
            ("floor", bottom),
            ("sftp", trained),
            ("ceiling", top),
        ):
            row[f"ppl-{name}"], row[f"acc-{name}"] = src.get("ppl"), src.get("acc")
        if row["ppl-sftp"] and row["ppl-ceiling"]:
            row["ratio-to-ceiling"] = row["ppl-sftp"] / row["ppl-ceiling"]
        if row["acc-untouched"] is not None:
            row["acc-untouched-lo"] = accuracy_interval(row["acc-untouched"], n)[0]
        compiled = speed.get(client, {})
        row["prefill-speedup"] = compiled.get("prefill-speedup")
        row["prefill-ceiling"] = compiled.get("prefill-ceiling")
        out.append(row)
    return out


def _f(value: Any, fmt: str = ".2f") -> str:
    return (
        "–"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else format(value, fmt)
    )


def render(rows: list[dict[str, Any]], dirs: dict[str, Path]) -> str:
    head = (
        "| client | data | kept (target) | ppl untouched | ppl floor | ppl SFT-P | ppl ceiling | "
        "SFT-P / ceiling | acc untouched (95% lower) | acc floor | acc SFT-P | acc ceiling | "
        "prefill speed-up (FLOP ceiling) |"
    )
    lines = [
        "## SFT-P beside its floor and ceiling",
        "",
        "Floor: the post hoc cut at the same budget (LLM-Pruner's round 1: one global cut of kv "
        "groups and MLP channels from the clients' Taylor importance, no training). Ceiling: the "
        "same run with every gate open (dense + the same LoRA recipe). Answer perplexity and "
        "accuracy on each client's own test split; accuracy intervals: 95% binomial over the n "
        "test examples.",
        "",
        head,
        "|" + "---|" * 13,
    ]
    for r in rows:
        lines.append(
            f"| {r['client']} | {r['data']} | {_f(r['kept'], '.3f')} "
            f"({_f(r['keep-target'], '.2f')}) | {_f(r['ppl-untouched'])} | {_f(r['ppl-floor'])} | "
            f"{_f(r['ppl-sftp'])} | {_f(r['ppl-ceiling'])} | {_f(r.get('ratio-to-ceiling'))}× "
            f"| {_f(r['acc-untouched'], '.3f')} ({_f(r.get('acc-untouched-lo'), '.3f')}) "
            f"| {_f(r['acc-floor'], '.3f')} | {_f(r['acc-sftp'], '.3f')} | "
            f"{_f(r['acc-ceiling'], '.3f')} | {_f(r['prefill-speedup'])}× "
            f"({_f(r['prefill-ceiling'])}×) |"
        )
    met = [r for r in rows if r["ppl-sftp"] is not None and r["ppl-untouched"] is not None]
    below = sum(r["ppl-sftp"] <= r["ppl-untouched"] for r in met)
    kept_acc = sum((r["acc-sftp"] or 0) >= (r.get("acc-untouched-lo") or 0) for r in met)
    lines += [
        "",
        f"Clients whose SFT-P model is at or below the untouched answer perplexity: {below} of "
        f"{len(rows)}; accuracy not below the untouched model's interval: {kept_acc} of "
        f"{len(rows)}.",
        "",
        "Runs: " + ", ".join(f"{k} `{v}`" for k, v in dirs.items()),
        "",
    ]
    return "\n".join(lines)


def write(dirs: dict[str, Path], seconds: float | None = None) -> str:
    rows = compare(dirs["sftp"], dirs["ceiling"], dirs["floor"])
    text = render(rows, dirs)
    record = {"runs": {k: str(v) for k, v in dirs.items()}, "rows": rows, "seconds": seconds}
    (dirs["sftp"] / "references.json").write_text(json.dumps(record, indent=1) + "\n")
    (dirs["sftp"] / "references.md").write_text(text)
    return text


def run_references(
    run_configs: list[str],
    federation_config: str,
    timeout: float = 7200,
    render: list[Path] | None = None,
) -> int:
    """`fedprune run --references`: the three runs one after the other, then their table (or, with
    `render`, only the table of three finished runs)."""
    if render:
        print(write(dict(zip(("sftp", "ceiling", "floor"), render, strict=True))))
        return 0
    try:
        config = launch.checked_config(launch.APP_DIR, run_configs, federation_config)
        if config.get("method") != "sftp":
            raise ConfigError(
                "fedprune run --references needs run-config key 'method' = 'sftp', got "
                f"{config.get('method')!r}"
            )
        floor = floor_overrides(single_budget(config))
        for extra in (
            CEILING,
            floor,
        ):  # every configuration fails here, before the first run starts
            launch.checked_config(
                launch.APP_DIR, [*run_configs, extra], federation_config, advise=False
            )
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, launch.raise_terminated)  # the running launch stops its SuperLink
    start, dirs = time.perf_counter(), {}
    for name, extra in (("sftp", []), ("ceiling", [CEILING]), ("floor", [floor])):
        print(f"[fedprune] references: {name} run", flush=True)
        done = launch.launch(
            [*run_configs, *extra], federation_config, timeout=timeout, advise=name == "sftp"
        )  # the floor is the post hoc cut on purpose
        if done.code in (130, 143, 124):  # interrupted: it said so
            return done.code
        if done.code != 0 or done.run_dir is None:
            print(f"[fedprune] the {name} run failed; no comparison", file=sys.stderr)
            return 1
        dirs[name] = done.run_dir
    print(write(dirs, round(time.perf_counter() - start, 1)), flush=True)
    print(f"[fedprune] three runs in {time.perf_counter() - start:.0f} s", flush=True)
    return 0
