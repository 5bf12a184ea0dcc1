"""State files that load without running code: the server checkpoint and each client's private
state.

- A server state (nested dicts, lists and tuples of numbers, strings, None, numpy arrays and torch
  tensors) is one safetensors file: the arrays by a key each, everything else a JSON skeleton in the
  file's metadata, beside `fedprune-state` = the format version.
- A client's `context.state` (a Flower `RecordDict`) is Flower's own protobuf message for it.

Reading either parses data only, never code (unlike pickle). A file of another format or version is
refused with one line; pickles written by older versions are refused with the command that converts
a trusted one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "1"
FORMAT_KEY = "fedprune-state"


class StateFileError(ValueError):
    """A state file this version cannot (or will not) read."""


def pickle_refusal(path: Path) -> StateFileError:
    """The one line for a pickle an older version wrote: not read (loading a pickle can run
    code)."""
    return StateFileError(
        f"{path} is a pickle written by an older fedprune; loading a pickle can run any code "
        "in it, so this version does not. If you trust the file (your own run wrote it), "
        f"convert it: python -m fedprune_cli.convert_state {path}"
    )


def _write_bytes_atomically(path: Path, write: Any) -> None:
    """`write(tmp)`, then the temp file synced to disk and renamed over `path`: a reader sees the
    old file or the new one, never half of one, even after a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text_atomically(path: Path, text: str) -> None:
    """`text` in `path`, atomically (`_write_bytes_atomically`)."""
    _write_bytes_atomically(path, lambda tmp: tmp.write_text(text))


def write_json_atomically(path: Path, value: Any) -> None:
    """`value` as JSON in `path`, atomically (`_write_bytes_atomically`)."""
    _write_bytes_atomically(path, lambda tmp: tmp.write_text(json.dumps(value, indent=1) + "\n"))


# --- server state: arrays in safetensors, the rest as JSON ----------------------------------------


def _encode(obj: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    """`obj` as JSON, its arrays moved into `arrays` (a key each); anything else is refused."""
    import torch

    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, np.ndarray | torch.Tensor):
        key = f"a{len(arrays)}"
        if isinstance(obj, torch.Tensor):
            tensor = obj.detach().cpu().contiguous()
            dtype = str(tensor.dtype).removeprefix("torch.")
            if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits, as int16
                tensor = tensor.view(torch.int16)
            arrays[key] = tensor.numpy()
            return {"__tensor__": key, "dtype": dtype}
        if obj.dtype == object:
            raise StateFileError(f"state at {where}: an object array cannot be stored")
        arrays[key] = np.ascontiguousarray(obj)
        return {"__ndarray__": key}
    if isinstance(obj, np.generic):
        return {"__scalar__": obj.dtype.str, "value": obj.item()}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return {
            "__dict__": [
                [_encode(k, arrays, f"{where} key"), _encode(v, arrays, f"{where}[{k!r}]")]
                for k, v in obj.items()
            ]
        }
    raise StateFileError(
        f"state at {where}: a {type(obj).__name__} cannot be stored (numbers, strings, arrays, "
        "lists, tuples and dicts only)"
    )


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    import torch

    if isinstance(node, list):
        return [_decode(v, arrays) for v in node]
    if not isinstance(node, dict):
        return node
    if "__ndarray__" in node:
        return arrays[node["__ndarray__"]]
    if "__tensor__" in node:
        tensor = torch.from_numpy(np.array(arrays[node["__tensor__"]]))
        dtype = getattr(torch, str(node["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise StateFileError(f"unknown tensor dtype {node['dtype']!r}")
        return tensor.view(dtype) if dtype == torch.bfloat16 else tensor.to(dtype)
    if "__scalar__" in node:
        return np.dtype(node["__scalar__"]).type(node["value"])
    if "__tuple__" in node:
        return tuple(_decode(v, arrays) for v in node["__tuple__"])
    if "__dict__" in node:
        return {_hashable(_decode(k, arrays)): _decode(v, arrays) for k, v in node["__dict__"]}
    raise StateFileError(f"unknown entry in a state file: {sorted(node)}")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key


def write_state(path: Path, state: Any) -> None:
    """Write a server state atomically (`path` is replaced only once the new file is complete)."""
    from safetensors.numpy import save_file

    arrays: dict[str, np.ndarray] = {}
    skeleton = json.dumps(_encode(state, arrays, "state"))
    metadata = {FORMAT_KEY: FORMAT, "skeleton": skeleton}
    _write_bytes_atomically(path, lambda tmp: save_file(arrays, str(tmp), metadata=metadata))


def read_state(path: Path) -> Any:
    """A state `write_state` wrote; StateFileError (one line) for anything else."""
    from safetensors import safe_open

    if path.suffix == ".pkl":
        raise pickle_refusal(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
            if metadata.get(FORMAT_KEY) != FORMAT:
                found = metadata.get(FORMAT_KEY)
                raise StateFileError(
                    f"{path} is not a fedprune state file of format {FORMAT}"
                    + (f" (format {found})" if found else "")
                )
            arrays = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 - safe_open has no items()
        return _decode(json.loads(metadata["skeleton"]), arrays)
    except StateFileError:
        raise
    except Exception as err:  # noqa: BLE001 - any parse failure is the same answer: not our file
        raise StateFileError(
            f"{path} is not a readable fedprune state file ({type(err).__name__}: {err})"
        ) from err


# --- client state: Flower's protobuf encoding of a RecordDict -------------------------------------


def write_records(path: Path, records: Any) -> None:
    """Write a client's `context.state` (RecordDict) atomically, as Flower's protobuf message."""
    from flwr.common.serde import recorddict_to_proto

    data = recorddict_to_proto(records).SerializeToString()
    _write_bytes_atomically(path, lambda tmp: tmp.write_bytes(data))


def read_records(path: Path) -> Any:
    """A RecordDict `write_records` wrote; StateFileError (one line) for anything else."""
    from flwr.common.serde import ProtoRecordDict, recorddict_from_proto

    if path.suffix == ".pkl":
        raise pickle_refusal(path)
    message = ProtoRecordDict()
    try:
        message.ParseFromString(path.read_bytes())
        return recorddict_from_proto(message)
    except Exception as err:  # noqa: BLE001
        raise StateFileError(
            f"{path} is not a readable client state file ({type(err).__name__}: {err})"
        ) from err
