"""Read and validate safetensors files and Hugging Face weight directories.

``SafetensorsDir(path)`` checks a directory before anything is converted: every shard that the
index names exists and is not truncated, every tensor that the index names is in its shard,
and no tensor appears twice. Tensors are then read on demand with ``pread`` (whole, or a range
of rows), so the resident memory of a conversion stays at one tensor or one block of rows; a
memory map would keep every page it touched resident and charge the whole model to the process.

Left out: writing (``safetensors_writer``) and pickle-based ``.bin`` / ``.pt`` weights, which are
refused because loading them can run arbitrary code.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from rlx.convert.errors import ConvertError

INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 << 20

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_CODES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, absolute byte range, dtype code and shape."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse one safetensors header; raise ConvertError if the file is truncated or malformed.

    The checks are the safetensors library's: a JSON object of entries with a known dtype, a shape
    of non-negative integers, byte offsets that match the shape, and tensors that tile the data
    area exactly (no gap, no overlap, nothing outside the file)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw_len = f.read(8)
        header_len = struct.unpack("<Q", raw_len)[0] if len(raw_len) == 8 else -1
        if not 0 < header_len <= min(size - 8, MAX_HEADER_BYTES):
            raise ConvertError(
                f"{path} is truncated or not a safetensors file ({size} bytes, header "
                "length unreadable); re-copy it from the original checkpoint"
            )
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConvertError(f"{path} has a corrupt safetensors header ({exc}); re-copy it") from None
    if not isinstance(header, dict):
        raise ConvertError(
            f"{path} has a corrupt safetensors header (a JSON {type(header).__name__}, not an "
            "object of tensors); re-copy it"
        )
    data_start = 8 + header_len
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise ConvertError(f"{path} has a corrupt safetensors header (__metadata__ is {metadata!r}); re-copy it")
    tensors = {name: _tensor_info(path, name, entry, data_start) for name, entry in header.items()}
    _check_covered(path, tensors, data_start, size)
    return tensors, metadata


def _tensor_info(path: Path, name: str, entry: dict, data_start: int) -> TensorInfo:
    try:
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise ConvertError(f"{path}: header entry for {name!r} is malformed ({entry!r}); re-copy the file") from None
    if not all(_is_count(n) for n in (*shape, begin, end)) or begin > end:
        raise ConvertError(
            f"{path}: tensor {name!r} has shape {list(shape)} and byte offsets {[begin, end]}; "
            "both must be non-negative integers (offsets ascending); the file is corrupt, re-copy it"
        )
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ConvertError(f"{path}: tensor {name!r} has dtype {dtype!r}, which rlx does not convert")
    numel = 1
    for dim in shape:
        numel *= dim
    if end - begin != numel * DTYPES[dtype].itemsize:
        raise ConvertError(
            f"{path}: tensor {name!r} spans {end - begin} bytes but {dtype}{list(shape)} "
            f"needs {numel * DTYPES[dtype].itemsize}; the file is corrupt"
        )
    return TensorInfo(name, path, dtype, shape, data_start + begin, data_start + end)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_covered(path: Path, tensors: dict[str, TensorInfo], data_start: int, size: int) -> None:
    data_bytes = size - data_start
    position = 0
    for info in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        begin, end = info.start - data_start, info.end - data_start
        if end > data_bytes:
            raise ConvertError(
                f"{path} is truncated: tensor {info.name!r} ends at byte {end} of the tensor data "
                f"but the file holds {data_bytes}; re-copy it from the original checkpoint"
            )
        if begin != position:
            problem = "overlaps the tensor before it" if begin < position else f"leaves a gap at byte {position}"
            raise ConvertError(
                f"{path}: tensor {info.name!r} at bytes [{begin}, {end}) {problem}; the file is corrupt, re-copy it"
            )
        position = end
    if position < data_bytes:
        raise ConvertError(
            f"{path} has {data_bytes - position} bytes after its last tensor; it is corrupt "
            "or was written twice; re-copy it"
        )


class SafetensorsDir:
    """The validated tensors of a Hugging Face weight directory (index + shards, or plain files)."""

    def __init__(self, path: str | Path, files: list[str] | None = None):
        self.path = Path(path)
        self.tensors: dict[str, TensorInfo] = {}
        self.metadata: dict[str, str] = {}
        if not self.path.is_dir():
            raise ConvertError(f"{self.path} is not a directory; pass the folder that holds the weights")
        index = self.path / INDEX_NAME
        if files is None and index.is_file():
            self._load_indexed(index)
        else:
            self._load_files(files or self._discover())

    def _discover(self) -> list[str]:
        names = sorted(p.name for p in self.path.glob("*.safetensors") if not p.name.startswith("."))
        if names:
            return names
        pickled = sorted(p.name for p in self.path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = (
            (
                f" It holds pickle-based weights ({', '.join(pickled[:3])}), which rlx does not load: "
                "re-save them as safetensors in a trusted environment "
                "(from_pretrained(...).save_pretrained(dir, safe_serialization=True))."
            )
            if pickled
            else ""
        )
        raise ConvertError(f"{self.path} has no *.safetensors files.{hint}")

    def _load_files(self, names: list[str]) -> None:
        for name in names:
            shard = self.path / name
            if not shard.is_file():
                raise ConvertError(f"{shard} is missing; re-copy the checkpoint")
            tensors, self.metadata = read_header(shard)
            for tname, info in tensors.items():
                if tname in self.tensors:
                    raise ConvertError(
                        f"tensor {tname!r} is in both {self.tensors[tname].file.name} and "
                        f"{name}; remove the stale file from {self.path}"
                    )
                self.tensors[tname] = info

    def _load_indexed(self, index: Path) -> None:
        weight_map = _read_weight_map(index)
        headers = {}
        for shard_name in sorted(set(weight_map.values())):
            shard = self.path / shard_name
            if not shard.is_file():
                named = sorted(t for t, s in weight_map.items() if s == shard_name)
                raise ConvertError(
                    f"{index.name} names shard {shard_name} for {len(named)} tensors "
                    f"(e.g. {named[0]!r}) but {shard} is missing; re-copy the checkpoint"
                )
            headers[shard_name], self.metadata = read_header(shard)
        for tname, shard_name in weight_map.items():
            info = headers[shard_name].get(tname)
            if info is None:
                raise ConvertError(
                    f"{index} says tensor {tname!r} is in {shard_name}, but that shard does "
                    "not contain it; the index and the shards come from different saves — "
                    "re-copy the checkpoint"
                )
            self.tensors[tname] = info

    @property
    def files(self) -> list[Path]:
        return sorted({info.file for info in self.tensors.values()})

    @property
    def total_bytes(self) -> int:
        return sum(info.nbytes for info in self.tensors.values())

    def read(self, name: str) -> torch.Tensor:
        info = self.tensors[name]
        return read_rows(info, 0, info.shape[0]) if info.shape else read_range(info, info.start, info.end).view(())

    def read_rows(self, name: str, row_start: int, row_end: int) -> torch.Tensor:
        return read_rows(self.tensors[name], row_start, row_end)


def read_rows(info: TensorInfo, row_start: int, row_end: int) -> torch.Tensor:
    """Rows [row_start, row_end) of a tensor (dim 0), read without touching the other rows."""
    if not info.shape:
        return read_range(info, info.start, info.end).view(())
    row_bytes = info.nbytes // info.shape[0] if info.shape[0] else 0
    flat = read_range(info, info.start + row_start * row_bytes, info.start + row_end * row_bytes)
    return flat.reshape((row_end - row_start,) + info.shape[1:])


def read_range(info: TensorInfo, begin: int, end: int) -> torch.Tensor:
    """Bytes [begin, end) of ``info.file`` as a 1-D tensor of the tensor's dtype."""
    buf = torch.empty(end - begin, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    fd = os.open(info.file, os.O_RDONLY)
    try:
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], begin + done)
            if got == 0:
                raise ConvertError(
                    f"{info.file} ended early while reading {info.name!r}; the file was "
                    "truncated during the conversion — re-copy it"
                )
            done += got
    finally:
        os.close(fd)
    return buf.view(info.torch_dtype)


def _read_weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_bytes())["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ConvertError(
            f"{index} is not a valid safetensors index ({exc!r}); re-copy it, or delete it "
            "if the directory holds a single model.safetensors"
        ) from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConvertError(f"{index} has an empty weight_map; re-copy the checkpoint")
    bad = next((v for v in weight_map.values() if not isinstance(v, str) or Path(v).name != v), None)
    if bad is not None:
        raise ConvertError(f"{index} maps a tensor to {bad!r}, not the file name of a shard beside it; re-copy it")
    return weight_map
