"""Multiple-choice scoring with each question encoded once: an lm-eval `HFLM` whose log-likelihoods
come from one forward over the question and all its choices, packed as a tree.

lm-eval turns a multiple-choice document into one `(context, continuation)` request per choice and
its stock `HFLM` runs `context + continuation` through the model for every one of them (its
`logits_cache` only merges choices that differ in their last token). `PackedChoicesLM` keeps
lm-eval's requests, metrics and result format and changes only how `_loglikelihood_tokens` computes
log P(continuation | context):

1. requests are grouped by their context tokens (one group = one question and its choices);
2. a group becomes one token segment, `context + cont_1[:-1] + cont_2[:-1] + ...`, with position ids
   that restart each choice right after the context, and an attention pattern in which the context
   is causal and each choice sees the whole context and its own earlier tokens only (never another
   choice): a tree, so every choice gets exactly the hidden states a separate `context + choice`
   forward gives it;
3. segments are packed first-fit into rows of at most `row_tokens` tokens (several questions per
   row, a block-diagonal 4D mask, no padding inside a row) and rows are batched;
4. the LM head and the log-softmax run only at the positions that predict a continuation token (the
   last context token predicts every choice's first token).

So the forward costs the context once plus each choice's tokens, with almost no padding: the FLOPs
of the shared form (`flop_ceiling` in experiments/benchmarks/evaluator.py), one pass instead of a
prefix pass, a KV-cache copy per choice and a padded continuation pass (this module's first form;
experiments/benchmarks/evaluator.py measures the forms against each other). The model must honour
a custom 4D `attention_mask` and explicit `position_ids` (HF LLaMA, peft-wrapped models and the
structurally pruned models built on them, routed or compiled, do): `packing_support` checks that
on a probe before any scoring; a model that fails it is scored by the stock HFLM path, with the
reason logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.models.huggingface import HFLM
from torch import nn

log = logging.getLogger(__name__)

Request = tuple[
    Any, list[int], list[int]
]  # lm-eval's ((context str, continuation str) | None, ctx ids, cont ids)
Group = tuple[Sequence[int], list[Sequence[int]]]  # (context ids, [continuation ids, ...])


def _parts(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(decoder, LM head) of a HF causal LM (through a peft wrapper), or None when it does not
    expose them."""
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return (
        (decoder, head) if isinstance(decoder, nn.Module) and isinstance(head, nn.Module) else None
    )


def segment(context: Sequence[int], conts: Sequence[Sequence[int]]) -> dict[str, list[int]]:
    """One question as a token tree: `ids` = context + each continuation but its last token; `pos`
    its position ids; `branch` 0 for the context, i + 1 for continuation i; `reads`/`targets` per
    continuation token, the index (in `ids`) whose output predicts it and the token itself."""
    ids, pos, branch = list(context), list(range(len(context))), [0] * len(context)
    reads: list[int] = []
    targets: list[int] = []
    for i, cont in enumerate(conts):
        start = len(ids)
        ids += cont[:-1]
        pos += range(len(context), len(context) + len(cont) - 1)
        branch += [i + 1] * (len(cont) - 1)
        reads += [len(context) - 1, *range(start, start + len(cont) - 1)]
        targets += cont
    return {"ids": ids, "pos": pos, "branch": branch, "reads": reads, "targets": targets}


def tree_mask(doc: torch.Tensor, pos: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """(rows, 1, T, T) boolean attention mask of packed segments (True = attend): query q sees key k
    when both lie in the same segment (`doc`, -1 = padding), k is not later (`pos`), and k is
    context (branch 0) or on q's branch. A padding query sees itself only (a row of False would give
    NaN)."""
    same = (doc[:, :, None] == doc[:, None, :]) & (doc[:, None, :] >= 0)
    causal = pos[:, None, :] <= pos[:, :, None]
    tree = (branch[:, None, :] == 0) | (branch[:, None, :] == branch[:, :, None])
    mask = same & causal & tree
    mask |= torch.eye(doc.shape[1], dtype=torch.bool)[None] & (doc < 0)[:, :, None]
    return mask[:, None]


@torch.no_grad()
def score_groups(
    model: nn.Module, rows: Sequence[Sequence[Group]], pad_id: int, split: bool = True
) -> list[list[tuple[float, bool]]]:
    """Per group (in the order of `rows`, flattened), per continuation: (sum of log P(continuation
    tokens), greedy). One forward over the packed rows (module docstring). `split`: run the decoder
    and apply the LM head to the scored positions only; else the model's own forward (logits
    everywhere)."""
    device = next(model.parameters()).device
    decoder, head = _parts(model) if split else (model, None)
    segs = [[segment(ctx, conts) for ctx, conts in row] for row in rows]
    width = max(sum(len(s["ids"]) for s in row) for row in segs)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros(len(rows), width, dtype=torch.long)
    doc = torch.full((len(rows), width), -1, dtype=torch.long)
    branch = torch.zeros(len(rows), width, dtype=torch.long)
    reads: list[int] = []  # flat index row * width + column
    targets: list[int] = []
    token_conts: list[
        int
    ] = []  # which continuation (global numbering) each scored token belongs to
    n_conts = 0
    for r, row in enumerate(segs):
        at = 0
        for d, s in enumerate(row):
            n = len(s["ids"])
            ids[r, at : at + n], pos[r, at : at + n] = (
                torch.tensor(s["ids"]),
                torch.tensor(s["pos"]),
            )
            doc[r, at : at + n], branch[r, at : at + n] = d, torch.tensor(s["branch"])
            reads += [r * width + at + i for i in s["reads"]]
            targets += s["targets"]
            conts = rows[r][d][1]
            token_conts += [n_conts + i for i, c in enumerate(conts) for _ in c]
            n_conts += len(conts)
            at += n
    mask = tree_mask(doc, pos, branch)
    out = decoder(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=pos.to(device),
        use_cache=False,
    )
    where = torch.tensor(reads, device=device)
    if split:
        logits = head(out.last_hidden_state.flatten(0, 1)[where])
    else:
        logits = out.logits.flatten(0, 1)[where]
    logp = F.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(targets, device=device)
    token_ll = logp.gather(1, target[:, None])[:, 0]
    owner = torch.tensor(token_conts, device=device)
    ll = torch.zeros(n_conts, dtype=token_ll.dtype, device=device).index_add_(0, owner, token_ll)
    missed = torch.zeros(n_conts, device=device).index_add_(
        0, owner, (logp.argmax(-1) != target).float()
    )
    flat = [(float(a), bool(m == 0)) for a, m in zip(ll.tolist(), missed.tolist(), strict=True)]
    out_groups, at = [], 0
    for row in rows:
        for _, conts in row:
            out_groups.append(flat[at : at + len(conts)])
            at += len(conts)
    return out_groups


def pack_rows(sizes: Sequence[int], row_tokens: int) -> list[list[int]]:
    """First-fit-decreasing packing of segment sizes into rows of at most `row_tokens` tokens (a
    segment longer than that gets a row of its own): lists of segment indices."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        for r, free in enumerate(room):
            if sizes[i] <= free:
                rows[r].append(i)
                room[r] -= sizes[i]
                break
        else:
            rows.append([i])
            room.append(row_tokens - sizes[i])
    return rows


@torch.no_grad()
def _full_pass(model: nn.Module, context: Sequence[int], cont: Sequence[int]) -> float:
    """log P(cont | context) from one forward over context + continuation (the stock HFLM
    computation)."""
    ids = torch.tensor([[*context, *cont]], device=next(model.parameters()).device)
    logp = F.log_softmax(model(input_ids=ids[:, :-1]).logits[0, -len(cont) :].float(), dim=-1)
    return float(logp.gather(1, ids[0, -len(cont) :, None]).sum())


def packing_support(model: nn.Module, pad_id: int = 0, tol: float = 1e-3) -> tuple[bool, bool, str]:
    """(usable, split, reason): whether `score_groups` reproduces one full forward per (context,
    continuation) on a probe of two rows, one holding two questions (one with three choices, two of
    them several tokens long, so a choice that could see another's tokens would score differently),
    one padded."""
    vocab = (
        int(model.get_output_embeddings().weight.shape[0])
        if model.get_output_embeddings() is not None
        else 2
    )
    ids = [(7 * i + 3) % max(vocab - 1, 2) + 1 for i in range(9)]
    rows = [
        [(ids[:5], [ids[2:5], ids[6:9], ids[7:8]]), (ids[5:7], [ids[0:2]])],
        [(ids[3:4], [ids[1:3]])],
    ]
    reasons = []
    for split in (True, False) if _parts(model) is not None else (False,):
        try:
            fast = [ll for g in score_groups(model, rows, pad_id, split) for ll, _ in g]
            slow = [_full_pass(model, ctx, c) for row in rows for ctx, conts in row for c in conts]
        # any failure means: try the next form, then the stock path
        except Exception as exc:  # noqa: BLE001
            reasons.append(f"{type(exc).__name__}: {exc}")
            continue
        worst = max(abs(a - b) for a, b in zip(fast, slow, strict=True))
        if worst <= tol:
            return True, split, ""
        reasons.append(f"packed scores differ from full forwards by {worst:.2e}")
    return False, False, f"{type(model).__name__} cannot score packed choices: {'; '.join(reasons)}"


class PackedChoicesLM(HFLM):
    """lm-eval's HFLM with `_loglikelihood_tokens` computed from packed question trees (module
    docstring).

    `row_tokens` bounds one packed row; a forward holds at most `batch_tokens` row tokens (its
    activations are rows × row_tokens × hidden floats per layer; its attention masks
    rows × row_tokens² booleans)."""

    def __init__(
        self, *args: Any, row_tokens: int = 256, batch_tokens: int = 2048, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.row_tokens, self.batch_tokens = row_tokens, batch_tokens
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eot_token_id)
        self.uses_packing, self.split, self.fallback_reason = False, False, "not a causal LM"
        if self.backend == "causal":
            self.uses_packing, self.split, self.fallback_reason = packing_support(
                self.model, self.pad_id
            )
        if not self.uses_packing:
            log.warning("fast evaluator off, scoring with lm-eval's HFLM: %s", self.fallback_reason)

    def loglikelihood(
        self, requests: list[Any], disable_tqdm: bool = True
    ) -> list[tuple[float, bool]]:
        """HFLM's, without its per-request progress bars (lm-eval's evaluator asks for them)."""
        return super().loglikelihood(requests, disable_tqdm=True)

    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, override_bs: int | None = None
    ) -> list[tuple[float, bool]]:
        if not self.uses_packing:
            return super()._loglikelihood_tokens(requests, disable_tqdm, override_bs)
        res: list[tuple[float, bool] | None] = [None] * len(requests)
        long = [
            i
            for i, (_, ctx, cont) in enumerate(requests)
            if len(ctx) + len(cont) > self.max_length + 1
        ]
        if long:  # lm-eval truncates these from the left: its own path scores them
            for i, ans in zip(
                long,
                super()._loglikelihood_tokens([requests[i] for i in long], True, override_bs),
                strict=True,
            ):
                res[i] = ans
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (_, ctx, cont) in enumerate(requests):
            if res[i] is None:
                if not ctx or not cont:
                    raise ValueError("lm-eval requests need a non-empty context and continuation")
                groups.setdefault(tuple(ctx), []).append(i)
        keys = list(groups)
        sizes = [len(k) + sum(len(requests[i][2]) - 1 for i in groups[k]) for k in keys]
        rows = pack_rows(sizes, self.row_tokens)
        for batch in self._batches(rows, sizes):
            packed = [
                [(keys[g], [requests[i][2] for i in groups[keys[g]]]) for g in row] for row in batch
            ]
            members = [i for row in batch for g in row for i in groups[keys[g]]]
            answers = [
                a for grp in score_groups(self.model, packed, self.pad_id, self.split) for a in grp
            ]
            for i, ans in zip(members, answers, strict=True):
                res[i] = ans
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], ans)
        return res  # type: ignore[return-value]

    def _batches(self, rows: list[list[int]], sizes: Sequence[int]) -> list[list[list[int]]]:
        """Rows longest first, batched while rows × the longest row stays within `batch_tokens`."""
        batches: list[list[list[int]]] = []
        width = 0
        for row in sorted(rows, key=lambda r: -sum(sizes[g] for g in r)):
            w = sum(sizes[g] for g in row)
            if batches and (len(batches[-1]) + 1) * max(width, w) <= self.batch_tokens:
                batches[-1].append(row)
            else:
                batches.append([row])
                width = w
        return batches
