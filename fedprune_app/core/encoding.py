"""Compact wire encodings of sparse weight matrices: bit-packed masks, kept values only, 16-bit
payloads.

A matrix W of d weights with kept-mask M (True = kept) travels as two arrays:
- `<name>`: the kept values W[M] in row-major order, 1-D, in the payload dtype (`float32`,
  `float16`, or `bfloat16` carried as its uint16 bit pattern, since NumPy has no bfloat16);
- `<name>:mask`: M flattened and bit-packed (`np.packbits`, big bit order), ⌈d/8⌉ uint8, padding
  bits zero.

So a reply costs d/8 + |M|·itemsize bytes instead of 4d + d (fp32 weights + bool mask). The receiver
knows the shapes (the server its global state, a client its model) and decodes with `decode_sparse`,
which refuses anything that is not exactly such an encoding (wrong dtype, length, padding bits,
non-finite values), naming the array. Plain NumPy, no Flower import.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fedprune_app.core.replies import MAX_ABS_VALUE

PAYLOAD_DTYPES = ("float32", "float16", "bfloat16")
MASK_SUFFIX = ":mask"  # `<name>:mask` = the bit-packed kept-mask of `<name>`
_WIRE = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
}


class EncodingError(ValueError):
    """An array is not a valid encoding of what the receiver expects (the message names it)."""


def check_payload_dtype(dtype: str) -> str:
    """`dtype` when it is one of `PAYLOAD_DTYPES`, else ValueError naming `payload-dtype`."""
    if dtype not in PAYLOAD_DTYPES:
        raise ValueError(
            "run-config key 'payload-dtype' must be one of "
            f"{', '.join(map(repr, PAYLOAD_DTYPES))}, got {dtype!r}"
        )
    return dtype


def wire_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype that carries a payload dtype on the wire (bfloat16: uint16 bit patterns)."""
    return _WIRE[check_payload_dtype(dtype)]


# --- masks ----------------------------------------------------------------------------------------


def packed_length(size: int) -> int:
    """Bytes that `size` packed bits take."""
    return math.ceil(size / 8)


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """A bool mask of any shape as ⌈d/8⌉ uint8 (row-major, first element in the high bit; padding
    bits 0)."""
    if mask.dtype != np.bool_:
        raise EncodingError(f"pack_mask needs a bool mask, got {mask.dtype}")
    return np.packbits(mask.reshape(-1))


def unpack_mask(packed: np.ndarray, shape: tuple[int, ...], name: str = "mask") -> np.ndarray:
    """The bool mask of `shape` that `pack_mask` packed; EncodingError unless `packed` is exactly
    such an array."""
    size = int(np.prod(shape, dtype=np.int64))
    if packed.dtype == np.bool_:
        raise EncodingError(
            f"{name}: an unpacked bool mask (the format before bit-packed masks); this server "
            f"expects {packed_length(size)} bit-packed uint8: update the client"
        )
    if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != packed_length(size):
        raise EncodingError(
            f"{name}: a bit-packed mask of a {tuple(shape)} matrix has shape "
            f"({packed_length(size)},) uint8, got shape {tuple(packed.shape)} {packed.dtype}"
        )
    bits = np.unpackbits(packed)
    if bits[size:].any():
        raise EncodingError(f"{name}: padding bits of the packed mask are not zero")
    return bits[:size].astype(bool).reshape(shape)


# --- values ---------------------------------------------------------------------------------------


def to_payload(values: np.ndarray, dtype: str, name: str = "values") -> np.ndarray:
    """Float values in the payload dtype: a cast (float16: round to nearest even; EncodingError on
    overflow) or, for bfloat16, the upper 16 bits of the float32 pattern rounded to nearest even (as
    torch's bfloat16 cast)."""
    wire = wire_dtype(dtype)
    x = np.ascontiguousarray(values, dtype=np.float32)
    if not np.isfinite(x).all():
        raise EncodingError(f"{name}: non-finite values cannot be sent")
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    else:
        with np.errstate(over="ignore"):
            out = x.astype(wire)
    if not np.isfinite(from_payload(out, dtype, name, check=False)).all():
        raise EncodingError(
            f"{name}: a value of magnitude {float(np.abs(x).max()):.3g} overflows payload-dtype "
            f"{dtype!r}; use 'bfloat16' or 'float32'"
        )
    return out


def from_payload(
    values: np.ndarray, dtype: str, name: str = "values", check: bool = True
) -> np.ndarray:
    """Payload values back as float32 (exact: every float16 / bfloat16 value is a float32); with
    `check`, EncodingError unless they carry the expected wire dtype and are finite."""
    wire = wire_dtype(dtype)
    if check and values.dtype != wire:
        raise EncodingError(
            f"{name}: payload-dtype {dtype!r} travels as {wire}, got {values.dtype}"
        )
    if dtype == "bfloat16":
        out = (values.astype(np.uint32) << 16).view(np.float32)
    else:
        out = values.astype(np.float32)
    if check and not np.isfinite(out).all():
        raise EncodingError(f"{name}: holds non-finite values")
    return out


def pack_kept(
    weight: np.ndarray, mask: np.ndarray, dtype: str = "float32", name: str = "weight"
) -> np.ndarray:
    """W[M] (row-major) in the payload dtype."""
    if weight.shape != mask.shape:
        raise EncodingError(
            f"{name}: mask shape {mask.shape} differs from the weight's {weight.shape}"
        )
    return to_payload(weight[mask], dtype, name)


def unpack_kept(
    values: np.ndarray, mask: np.ndarray, dtype: str = "float32", name: str = "weight"
) -> np.ndarray:
    """The dense float32 matrix: the kept values at M, 0 elsewhere."""
    dense = np.zeros(mask.shape, dtype=np.float32)
    dense[mask] = kept_values(values, mask, dtype, name)
    return dense


def kept_values(values: np.ndarray, mask: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """The float32 kept values after checking there is exactly one per kept position, each finite
    and at most MAX_ABS_VALUE in magnitude (a sum of replies stays finite)."""
    kept = int(mask.sum())
    if values.ndim != 1 or values.size != kept:
        raise EncodingError(
            f"{name}: the mask keeps {kept} weights, so the kept values must have shape ({kept},), "
            f"got shape {tuple(values.shape)}"
        )
    out = from_payload(values, dtype, name)
    if out.size and float(np.abs(out).max()) > MAX_ABS_VALUE:
        raise EncodingError(
            f"{name}: holds values up to {float(np.abs(out).max()):.3g}, above {MAX_ABS_VALUE:g}"
        )
    return out


# --- whole records --------------------------------------------------------------------------------


def encode_sparse(
    weights: Mapping[str, np.ndarray],
    masks: Mapping[str, np.ndarray] | None = None,
    dtype: str = "float32",
) -> dict[str, np.ndarray]:
    """{name: W} (+ kept-masks; default W ≠ 0) as {name: kept values, name:mask: packed mask}."""
    out: dict[str, np.ndarray] = {}
    for name, weight in weights.items():
        mask = np.asarray(weight != 0) if masks is None else masks[name]
        out[name] = pack_kept(weight, mask, dtype, name)
        out[name + MASK_SUFFIX] = pack_mask(mask)
    return out


def decode_sparse(
    arrays: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], dtype: str = "float32"
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{name: (kept values as float32, bool mask)} of an `encode_sparse` record whose matrices have
    `shapes`; EncodingError naming the first array that is missing, extra, or not a valid
    encoding."""
    names = {k for k in arrays if not k.endswith(MASK_SUFFIX)}
    if names != set(shapes):
        missing, extra = sorted(set(shapes) - names), sorted(names - set(shapes))
        detail = (f"; missing {missing[0]}" if missing else "") + (
            f"; unexpected {extra[0]}" if extra else ""
        )
        raise EncodingError(
            f"holds {len(names)} weight matrices, expected the {len(shapes)} sent{detail}"
        )
    stray = sorted(
        k for k in arrays if k.endswith(MASK_SUFFIX) and k[: -len(MASK_SUFFIX)] not in names
    )
    if stray:
        raise EncodingError(f"{len(stray)} unexpected arrays, e.g. {stray[0]}")
    out = {}
    for name, shape in shapes.items():
        if name + MASK_SUFFIX not in arrays:
            raise EncodingError(f"{name}: its mask {name + MASK_SUFFIX} is missing")
        mask = unpack_mask(arrays[name + MASK_SUFFIX], tuple(shape), name + MASK_SUFFIX)
        out[name] = (kept_values(arrays[name], mask, dtype, name), mask)
    return out


def decode_dense(
    arrays: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], dtype: str = "float32"
) -> dict[str, np.ndarray]:
    """{name: dense float32 W} of an `encode_sparse` record."""
    out = {}
    for name, (values, mask) in decode_sparse(arrays, shapes, dtype).items():
        dense = np.zeros(mask.shape, dtype=np.float32)
        dense[mask] = values
        out[name] = dense
    return out


def sparse_bytes(size: int, kept: int, dtype: str = "float32") -> int:
    """Tensor bytes of one encoded matrix: ⌈d/8⌉ mask bytes + |M| values."""
    return packed_length(size) + kept * wire_dtype(dtype).itemsize


def dense_bytes(size: int, dtype: str = "float32", with_bool_mask: bool = False) -> int:
    """Tensor bytes of the unencoded form: d values (+ d bytes of bool mask)."""
    return size * wire_dtype(dtype).itemsize + (size if with_bool_mask else 0)
