"""benchmarks/llama7b.py's functions on tiny LLaMA shapes: every method's client step and server
aggregation run, and the figures follow the shapes and the wire encodings."""

from __future__ import annotations

import math

import torch

from benchmarks.llama7b import extrapolate, run
from fedprune_app.core.encoding import sparse_bytes
from fedprune_app.methods.fedspallm.masks import target_count

HIDDEN, INTER, HEADS, LAYERS = 32, 64, 4, 2


def test_every_method_runs_on_tiny_shapes_and_bytes_follow_the_encodings() -> None:
    torch.set_num_threads(1)
    measured = run(HIDDEN, INTER, HEADS, LAYERS, vocab=64, seq_len=16, clients=3)
    assert set(measured) == {"fedspallm", "fedit", "fedtpa", "flexlora", "sftp"}
    sizes = [HIDDEN * HIDDEN] * 4 + [HIDDEN * INTER] * 3  # q k v o, gate up down
    spa = measured["fedspallm"]
    assert spa["weights"] == LAYERS * sum(sizes)
    # SparseGPT keeps exactly d - round(s*d) per 32-column block (here: per matrix) at 50%
    expected = LAYERS * sum(sparse_bytes(d, d - target_count(0.5, d)) for d in sizes)
    assert spa["up bytes"]["float32"] == expected
    assert spa["up bytes"]["bfloat16"] == LAYERS * sum(
        sparse_bytes(d, d - target_count(0.5, d), "bfloat16") for d in sizes
    )
    assert spa["down bytes round 1"]["float32"] == LAYERS * sum(sparse_bytes(d, d) for d in sizes)
    assert spa["up bytes, dense fp32 + bool masks"] == LAYERS * sum(5 * d for d in sizes)
    lora = (
        2 * LAYERS * 16 * (HIDDEN + HIDDEN) * 4
    )  # rank 16 on q_proj, v_proj: A (16 x 32) + B (32 x 16), fp32
    for method in ("fedit", "fedtpa", "flexlora"):
        assert measured[method]["up bytes"] == lora, method
    assert (
        measured["sftp"]["up bytes"] > lora
        and measured["sftp"]["final-round masks bytes"] == 4 * LAYERS * HIDDEN
    )
    for m in measured.values():
        assert (
            m["client seconds"] > 0
            and m["server seconds"] > 0
            and math.isfinite(m["client peak MB"])
        )
    extra = extrapolate(measured, LAYERS, 3)
    assert extra["fedit"]["up MB per client per round"] == lora * 16 / 1e6  # 32 layers / 2 measured
    assert math.isclose(
        extra["fedspallm"]["server seconds, 100 clients"],
        25 * extra["fedspallm"]["server seconds, 4 clients"],
    )
