"""The wire encodings of sparse matrices (fedprune_app.core.encoding) against brute-force
references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedprune_app.core.encoding import (
    MASK_SUFFIX,
    EncodingError,
    decode_dense,
    decode_sparse,
    encode_sparse,
    from_payload,
    pack_kept,
    pack_mask,
    sparse_bytes,
    to_payload,
    unpack_kept,
    unpack_mask,
)
from fedprune_app.core.protocol import record_bytes, to_record


def _brute_pack(mask: np.ndarray) -> np.ndarray:
    """Bit i of the flattened mask in byte i // 8 at bit 7 - i % 8, built one bit at a time."""
    flat = [bool(b) for b in mask.reshape(-1)]
    out = [0] * ((len(flat) + 7) // 8)
    for i, bit in enumerate(flat):
        if bit:
            out[i // 8] |= 1 << (7 - i % 8)
    return np.array(out, dtype=np.uint8)


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (3, 5), (4, 16), (2, 3, 7), (13, 11)])
def test_pack_mask_matches_a_bit_by_bit_loop_and_round_trips(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    for density in (0.0, 0.3, 1.0):
        mask = rng.random(shape) < density
        packed = pack_mask(mask)
        np.testing.assert_array_equal(packed, _brute_pack(mask))
        np.testing.assert_array_equal(unpack_mask(packed, shape), mask)


def test_unpack_mask_refuses_anything_but_an_exact_packed_mask() -> None:
    mask = np.ones((3, 5), dtype=bool)  # 15 bits -> 2 bytes, 1 padding bit
    packed = pack_mask(mask)
    with pytest.raises(EncodingError, match="unpacked bool mask.*update the client"):
        unpack_mask(mask.reshape(-1), (3, 5), "w:mask")
    with pytest.raises(
        EncodingError, match=r"w:mask: .*shape \(2,\) uint8, got shape \(3,\) uint8"
    ):
        unpack_mask(np.zeros(3, np.uint8), (3, 5), "w:mask")
    with pytest.raises(EncodingError, match="got shape \\(2,\\) uint16"):
        unpack_mask(packed.astype(np.uint16), (3, 5), "w:mask")
    bad = packed.copy()
    bad[-1] |= 1  # the padding bit
    with pytest.raises(EncodingError, match="padding bits"):
        unpack_mask(bad, (3, 5), "w:mask")


def test_bfloat16_matches_torchs_rounding_and_decodes_exactly() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.normal(scale=0.05, size=4000),
            rng.normal(scale=300, size=1000),
            [0.0, -0.0, 1e-30, -1e-40, 3.0e38, 1.00390625, 1.01171875],
        ]
    ).astype(np.float32)
    bits = to_payload(x, "bfloat16")
    reference = torch.from_numpy(x).to(torch.bfloat16)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bits, reference.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(from_payload(bits, "bfloat16"), reference.float().numpy())


def test_float16_is_numpys_cast_and_overflow_is_refused_by_name() -> None:
    x = np.array([0.1, -2.5, 1e-8, 65504.0], dtype=np.float32)
    np.testing.assert_array_equal(
        from_payload(to_payload(x, "float16"), "float16"), x.astype(np.float16)
    )
    with pytest.raises(
        EncodingError,
        match="model.w: a value of magnitude 7e\\+04 overflows payload-dtype 'float16'",
    ):
        to_payload(np.array([70000.0], np.float32), "float16", "model.w")
    with pytest.raises(EncodingError, match="non-finite"):
        to_payload(np.array([np.nan], np.float32), "float32")
    with pytest.raises(
        ValueError,
        match="'payload-dtype' must be one of 'float32', 'float16', 'bfloat16', got 'int8'",
    ):
        to_payload(x, "int8")


def test_kept_values_are_the_masked_weights_in_row_major_order() -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(size=(6, 9)).astype(np.float32)
    mask = rng.random(w.shape) > 0.5
    brute = np.array([w[i, j] for i in range(6) for j in range(9) if mask[i, j]], dtype=np.float32)
    np.testing.assert_array_equal(pack_kept(w, mask), brute)
    dense = unpack_kept(brute, mask)
    np.testing.assert_array_equal(dense, np.where(mask, w, 0))
    with pytest.raises(
        EncodingError, match=r"keeps \d+ weights, so the kept values must have shape"
    ):
        unpack_kept(brute[:-1], mask)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_record_round_trips_and_costs_what_sparse_bytes_says(dtype: str) -> None:
    rng = np.random.default_rng(2)
    shapes = {"a.weight": (16, 24), "b.weight": (5, 7)}
    weights = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    masks = {k: rng.random(s) > 0.4 for k, s in shapes.items()}
    encoded = encode_sparse(weights, masks, dtype)
    decoded = decode_sparse(encoded, shapes, dtype)
    for k in shapes:
        values, mask = decoded[k]
        np.testing.assert_array_equal(mask, masks[k])
        np.testing.assert_array_equal(
            values, from_payload(to_payload(weights[k][masks[k]], dtype), dtype)
        )
        if dtype == "float32":
            np.testing.assert_array_equal(
                decode_dense(encoded, shapes)[k], np.where(masks[k], weights[k], 0)
            )
    expected = sum(
        sparse_bytes(int(np.prod(s)), int(masks[k].sum()), dtype) for k, s in shapes.items()
    )
    assert record_bytes(to_record(encoded)) == expected
    # the default mask is W != 0: a pruned matrix encodes to the same record as with its mask
    pruned = {k: np.where(masks[k], weights[k], 0).astype(np.float32) for k in shapes}
    assert all(np.array_equal(v, encode_sparse(pruned, dtype=dtype)[k]) for k, v in encoded.items())


def test_decode_names_what_is_missing_extra_or_wrong() -> None:
    shapes = {"a.weight": (4, 4)}
    good = encode_sparse({"a.weight": np.eye(4, dtype=np.float32)})
    with pytest.raises(
        EncodingError, match="holds 0 weight matrices, expected the 1 sent; missing a.weight"
    ):
        decode_sparse({}, shapes)
    with pytest.raises(EncodingError, match="holds 2 weight matrices.*unexpected z.weight"):
        decode_sparse({**good, "z.weight": np.zeros(1, np.float32)}, shapes)
    with pytest.raises(EncodingError, match="1 unexpected arrays, e.g. z.weight:mask"):
        decode_sparse({**good, "z.weight" + MASK_SUFFIX: np.zeros(1, np.uint8)}, shapes)
    with pytest.raises(EncodingError, match="its mask a.weight:mask is missing"):
        decode_sparse({"a.weight": good["a.weight"]}, shapes)
    with pytest.raises(
        EncodingError, match="payload-dtype 'float16' travels as float16, got float32"
    ):
        decode_sparse(good, shapes, "float16")
    nan = {**good, "a.weight": np.full(4, np.nan, np.float32)}
    with pytest.raises(EncodingError, match="a.weight: holds non-finite values"):
        decode_sparse(nan, shapes)
