"""The evaluator benchmark's FLOP ceiling against torch's own FLOP count of the two ways to score
the requests."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from experiments.benchmarks.evaluator import flop_ceiling


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_flop_ceiling_matches_counted_forwards(tiny_model_dir: Path) -> None:
    """Two questions, three and one choices: the stock count is one full forward per request with
    every logit; the shared count encodes each question once (decoder only) and runs each
    continuation on a copy of its cache with logits for the continuation only. Both sides as
    FlopCounterMode counts them, with eager attention so that the attention matmuls, which the
    ceiling includes, are counted too."""
    from transformers import AutoModelForCausalLM

    # eager attention: its q·kᵀ and weights·v are matmuls the counter sees (torch's SDPA CPU op goes
    # uncounted)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager").eval()
    shapes = [
        ((5, 6, 7, 8, 9, 10), 2),
        ((5, 6, 7, 8, 9, 10), 3),
        ((5, 6, 7, 8, 9, 10), 1),
        ((11, 12, 13), 4),
    ]
    stock = shared = 0
    with torch.no_grad():
        for ctx, n in shapes:
            ids = torch.tensor([[*ctx, *range(20, 20 + n)]])
            stock += counted(lambda ids=ids: model(input_ids=ids[:, :-1]))
        caches = {}
        for ctx in dict.fromkeys(c for c, _ in shapes):
            prefix = torch.tensor([list(ctx[:-1])])
            shared += counted(
                lambda prefix=prefix, ctx=ctx: caches.__setitem__(
                    ctx, model.model(input_ids=prefix, use_cache=True).past_key_values
                )
            )
        for ctx, n in shapes:
            ids = torch.tensor([[ctx[-1], *range(20, 20 + n - 1)]])
            cache = copy.deepcopy(caches[ctx])
            shared += counted(
                lambda ids=ids, cache=cache, n=n: model(
                    input_ids=ids, past_key_values=cache, logits_to_keep=n
                )
            )
    got = flop_ceiling(model.config, shapes)
    assert got["flops-stock"] == stock and got["flops-shared"] == shared
    assert got["flop-ceiling"] == stock / shared > 1.0
