"""Multiple-choice scoring with each question encoded once: an lm-eval `HFLM` whose log-likelihoods come from a
shared-context KV cache.

lm-eval turns a multiple-choice document into one `(context, continuation)` request per choice and its stock
`HFLM` runs `context + continuation` through the model for every one of them (its `logits_cache` only merges
choices that differ in their last token). `PrefixCachedLM` keeps lm-eval's requests, metrics and result format
and changes only how `_loglikelihood_tokens` computes log P(continuation | context):

1. requests are grouped by their context tokens; a batch holds several contexts;
2. one prefix pass runs `context[:-1]` of each context (right-padded; causal attention never lets a real token see
   the padding to its right) and keeps the keys/values;
3. the cache is expanded to one row per continuation (`batch_select_indices`), and one continuation pass runs
   `context[-1:] + continuation[:-1]` with an attention mask that hides each row's prefix padding and explicit
   position ids (prefix length + offset): its logits are exactly those HFLM reads for the continuation tokens.

The model must honour `past_key_values`, `attention_mask` and `position_ids` (HF LLaMA, peft-wrapped models, SFT-P's
routed and compiled models do). `cache_support` checks that on a probe before any scoring; a model that fails it
is scored by the stock HFLM path, with the reason logged.
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

Request = tuple[Any, list[int], list[int]]  # lm-eval's ((context str, continuation str) | None, ctx ids, cont ids)


def _parts(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """(decoder, LM head) of a HF causal LM (through a peft wrapper), or None when it does not expose them."""
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return (decoder, head) if isinstance(decoder, nn.Module) and isinstance(head, nn.Module) else None


@torch.no_grad()
def score_continuations(model: nn.Module, contexts: Sequence[Sequence[int]], rows: Sequence[tuple[int, list[int]]],
                        pad_id: int, split: bool = True) -> list[tuple[float, bool]]:
    """(sum of log P(continuation tokens), greedy) for each row (context index, continuation ids): one prefix pass
    over the contexts, one continuation pass over the rows (see the module docstring). `split`: run the decoder
    and apply the LM head to the continuation tokens only (no head on the prefix or on padding); else the
    model's own forward."""
    device = next(model.parameters()).device
    decoder, head = _parts(model) if split else (model, None)
    prefix_lens = [len(c) - 1 for c in contexts]
    width = max(prefix_lens)
    cache = None
    if width > 0:
        prefix = torch.full((len(contexts), width), pad_id, dtype=torch.long)
        for i, c in enumerate(contexts):
            prefix[i, :prefix_lens[i]] = torch.tensor(c[:-1])
        cache = decoder(input_ids=prefix.to(device), use_cache=True).past_key_values
        cache.batch_select_indices(torch.tensor([g for g, _ in rows], device=device))
    cont_width = max(len(cont) for _, cont in rows)
    inputs = torch.full((len(rows), cont_width), pad_id, dtype=torch.long)
    targets = torch.full((len(rows), cont_width), -1, dtype=torch.long)
    mask = torch.zeros(len(rows), width + cont_width, dtype=torch.long)
    for r, (g, cont) in enumerate(rows):
        inputs[r, :len(cont)] = torch.tensor([contexts[g][-1], *cont[:-1]])
        targets[r, :len(cont)] = torch.tensor(cont)
        mask[r, :prefix_lens[g]] = 1
        mask[r, width:width + len(cont)] = 1
    positions = torch.tensor([prefix_lens[g] for g, _ in rows])[:, None] + torch.arange(cont_width)
    out = decoder(input_ids=inputs.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                  past_key_values=cache, use_cache=cache is not None)
    real = (targets >= 0).to(device)
    logits = head(out.last_hidden_state[real]) if split else out.logits[real]
    logp = F.log_softmax(logits.float(), dim=-1)
    target = targets.to(device)[real]
    token_ll = logp.gather(1, target[:, None])[:, 0]
    row_of = torch.arange(len(rows), device=device)[:, None].expand_as(real)[real]
    ll = torch.zeros(len(rows), dtype=token_ll.dtype, device=device).index_add_(0, row_of, token_ll)
    missed = torch.zeros(len(rows), device=device).index_add_(0, row_of, (logp.argmax(-1) != target).float())
    return [(float(a), bool(m == 0)) for a, m in zip(ll.tolist(), missed.tolist(), strict=True)]


@torch.no_grad()
def _full_pass(model: nn.Module, context: Sequence[int], cont: Sequence[int]) -> float:
    """log P(cont | context) from one forward over context + continuation (the stock HFLM computation)."""
    ids = torch.tensor([[*context, *cont]], device=next(model.parameters()).device)
    logp = F.log_softmax(model(input_ids=ids[:, :-1]).logits[0, -len(cont):].float(), dim=-1)
    return float(logp.gather(1, ids[0, -len(cont):, None]).sum())


def cache_support(model: nn.Module, pad_id: int = 0, tol: float = 1e-3) -> tuple[bool, bool, str]:
    """(usable, split, reason): whether `score_continuations` reproduces one full forward on a probe of two
    contexts of different lengths, one of them shared by two continuations of different lengths."""
    vocab = int(model.get_output_embeddings().weight.shape[0]) if model.get_output_embeddings() is not None else 2
    ids = [(7 * i + 3) % max(vocab - 1, 2) + 1 for i in range(9)]
    contexts, rows = [ids[:5], ids[5:7]], [(0, ids[2:5]), (0, ids[6:7]), (1, ids[0:2])]
    reasons = []
    for split in (True, False) if _parts(model) is not None else (False,):
        try:
            fast = score_continuations(model, contexts, rows, pad_id, split)
            slow = [_full_pass(model, contexts[g], cont) for g, cont in rows]
        except Exception as exc:  # noqa: BLE001 (any failure means: try the next form, then the stock path)
            reasons.append(f"{type(exc).__name__}: {exc}")
            continue
        worst = max(abs(a - b) for (a, _), b in zip(fast, slow, strict=True))
        if worst <= tol:
            return True, split, ""
        reasons.append(f"cached scores differ from full forwards by {worst:.2e}")
    return False, False, f"{type(model).__name__} cannot be scored from a KV cache: {'; '.join(reasons)}"


class PrefixCachedLM(HFLM):
    """lm-eval's HFLM with `_loglikelihood_tokens` computed from shared-context KV caches (module docstring).

    `batch_tokens` bounds the continuation positions of one continuation pass (its logits are
    rows × positions × vocab floats); a batch holds at most `contexts_per_batch` contexts."""

    def __init__(self, *args: Any, batch_tokens: int = 1024, contexts_per_batch: int = 32, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch_tokens, self.contexts_per_batch = batch_tokens, contexts_per_batch
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eot_token_id)
        self.uses_cache, self.split, self.fallback_reason = False, False, "not a causal LM"
        if self.backend == "causal":
            self.uses_cache, self.split, self.fallback_reason = cache_support(self.model, self.pad_id)
        if not self.uses_cache:
            log.warning("fast evaluator off, scoring with lm-eval's HFLM: %s", self.fallback_reason)

    def _loglikelihood_tokens(self, requests: list[Request], disable_tqdm: bool = False,
                              override_bs: int | None = None) -> list[tuple[float, bool]]:
        if not self.uses_cache:
            return super()._loglikelihood_tokens(requests, disable_tqdm, override_bs)
        res: list[tuple[float, bool] | None] = [None] * len(requests)
        long = [i for i, (_, ctx, cont) in enumerate(requests) if len(ctx) + len(cont) > self.max_length + 1]
        if long:  # lm-eval truncates these from the left: its own path scores them
            for i, ans in zip(long, super()._loglikelihood_tokens([requests[i] for i in long], True, override_bs),
                              strict=True):
                res[i] = ans
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, (_, ctx, cont) in enumerate(requests):
            if res[i] is None:
                if not ctx or not cont:
                    raise ValueError("lm-eval requests need a non-empty context and continuation")
                groups.setdefault(tuple(ctx), []).append(i)
        for batch in self._batches(groups, requests):
            contexts = [list(ctx) for ctx, _ in batch]
            rows = [(g, requests[i][2]) for g, (_, members) in enumerate(batch) for i in members]
            for i, ans in zip([i for _, members in batch for i in members],
                              score_continuations(self.model, contexts, rows, self.pad_id, self.split),
                              strict=True):
                res[i] = ans
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], ans)
        return res  # type: ignore[return-value]

    def _batches(self, groups: dict[tuple[int, ...], list[int]], requests: list[Request]
                 ) -> list[list[tuple[tuple[int, ...], list[int]]]]:
        """Contexts longest first, packed while rows × longest continuation stays within `batch_tokens`."""
        batches: list[list[tuple[tuple[int, ...], list[int]]]] = [[]]
        rows = width = 0
        for ctx, members in sorted(groups.items(), key=lambda kv: -len(kv[0])):
            w = max(width, *(len(requests[i][2]) for i in members))
            if batches[-1] and ((rows + len(members)) * w > self.batch_tokens
                                or len(batches[-1]) >= self.contexts_per_batch):
                batches.append([])
                rows, w = 0, max(len(requests[i][2]) for i in members)
            batches[-1].append((ctx, members))
            rows, width = rows + len(members), w
        return [b for b in batches if b]

