"""A GGUF header reader: enough to tell a whole GGUF file from a wrong or truncated one
before llama.cpp gets it (llama.cpp's own message for a short file is a bare "failed to
load model"), and to show metadata without loading weights.

Layout (little-endian, GGUF v2/v3): magic "GGUF", u32 version, u64 tensor count, u64 kv
count, the kv pairs, the tensor infos (name, dims, ggml type, offset relative to the data
section), padding to `general.alignment`, then tensor data.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection

from specdash.errors import SpecdashError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# ggml type id -> (name, elements per block, bytes per block); from gguf-py's
# GGML_QUANT_SIZES. A type missing here only disables the size check.
_QK_K = 256
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 2 + 16),
    3: ("Q4_1", 32, 2 + 2 + 16),
    6: ("Q5_0", 32, 2 + 4 + 16),
    7: ("Q5_1", 32, 2 + 2 + 4 + 16),
    8: ("Q8_0", 32, 2 + 32),
    9: ("Q8_1", 32, 4 + 4 + 32),
    10: ("Q2_K", _QK_K, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    11: ("Q3_K", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    12: ("Q4_K", _QK_K, 2 + 2 + _QK_K // 2 + 12),
    13: ("Q5_K", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    14: ("Q6_K", _QK_K, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    15: ("Q8_K", _QK_K, 4 + _QK_K + _QK_K // 8),
    16: ("IQ2_XXS", _QK_K, 2 + _QK_K // 4),
    17: ("IQ2_XS", _QK_K, 2 + _QK_K // 4 + _QK_K // 32),
    18: ("IQ3_XXS", _QK_K, 2 + _QK_K // 4 + _QK_K // 8),
    19: ("IQ1_S", _QK_K, 2 + _QK_K // 8 + _QK_K // 16),
    20: ("IQ4_NL", 32, 2 + 16),
    21: ("IQ3_S", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    22: ("IQ2_S", _QK_K, 2 + _QK_K // 4 + _QK_K // 16),
    23: ("IQ4_XS", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", _QK_K, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", _QK_K, 2 + 4 * 13),
    35: ("TQ2_0", _QK_K, 2 + 64),
    39: ("MXFP4", 32, 1 + 16),
}

# GGUF metadata value types -> struct format of one scalar.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8  # GGML_MAX_DIMS is 4; anything far above means a corrupt header


class GGUFError(SpecdashError):
    """The file is not a usable GGUF; the message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class GGUFArray:
    """An array value whose contents were not read (only its element type and length)."""

    value_type: int
    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # relative to data_offset

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, (f"type {self.ggml_type}",))[0]

    def nbytes(self) -> int | None:
        """Bytes of this tensor's data, or None for a ggml type this module does not know."""
        if self.ggml_type not in GGML_TYPES:
            return None
        _, block, size = GGML_TYPES[self.ggml_type]
        n = 1
        for d in self.shape:
            n *= d
        return n // block * size


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]  # scalars as Python values; arrays as list or GGUFArray
    tensors: list[TensorInfo]
    data_offset: int
    # data_offset + the end of the last tensor; None if a tensor has an unknown ggml type.
    # Writers may pad after the last tensor, so a whole file is >= this, never smaller.
    expected_size: int | None
    file_size: int


class _Reader:
    def __init__(self, buf: mmap.mmap | bytes, path: Path):
        self.buf = buf
        self.pos = 0
        self.path = path

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GGUFError(
                f"{self.path}: truncated GGUF: the header runs past the end of the file "
                f"({len(self.buf):,} bytes)"
            )
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def skip(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise GGUFError(
                f"{self.path}: truncated GGUF: the header runs past the end of the file "
                f"({len(self.buf):,} bytes)"
            )
        self.pos += n

    def string(self) -> str:
        n = self.unpack("<Q")
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        self.skip(self.unpack("<Q"))

    def value(self, vtype: int, read_array: bool) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            length = self.unpack("<Q")
            if read_array:
                return [self.value(etype, True) for _ in range(length)]
            if etype in _SCALAR_FORMATS:
                self.skip(length * struct.calcsize(_SCALAR_FORMATS[etype]))
            elif etype == _STRING:
                # Strings are length-prefixed, so skipping a 151k-entry vocab still walks it;
                # unpack_from on the mmap keeps that well under a second.
                for _ in range(length):
                    self.skip_string()
            else:
                for _ in range(length):
                    self.value(etype, False)
            return GGUFArray(etype, length)
        raise GGUFError(f"{self.path}: corrupt GGUF header: unknown metadata value type {vtype}")


def read_gguf_header(path: str | Path, arrays: Collection[str] = ()) -> GGUFHeader:
    """Parse the header of the GGUF at `path`. Array values are returned as GGUFArray
    (type and length) except for the keys named in `arrays`, which are read in full."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            file_size = path.stat().st_size
            if file_size < 8:
                raise GGUFError(f"{path}: not a GGUF file (only {file_size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(_Reader(buf, path), file_size, frozenset(arrays))
    except IsADirectoryError:
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read: {exc.strerror or exc}")


def _parse(r: _Reader, file_size: int, arrays: frozenset[str]) -> GGUFHeader:
    magic = bytes(r.buf[:4])
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{r.path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    r.pos = 4
    version = r.unpack("<I")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(
            f"{r.path}: GGUF version {version} is not supported (supported: "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))})"
        )
    n_tensors = r.unpack("<Q")
    n_kv = r.unpack("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("<I")
        metadata[key] = r.value(vtype, key in arrays)

    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("<I")
        if n_dims > _MAX_DIMS:
            raise GGUFError(f"{r.path}: corrupt GGUF header: tensor {name!r} has {n_dims} dims")
        shape = tuple(r.unpack("<Q") for _ in range(n_dims))
        tensors.append(TensorInfo(name, r.unpack("<I"), shape, r.unpack("<Q")))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise GGUFError(f"{r.path}: corrupt GGUF header: general.alignment = {alignment!r}")
    data_offset = -(-r.pos // alignment) * alignment

    sizes = [t.nbytes() for t in tensors]
    expected: int | None
    if not tensors:
        expected = r.pos  # no data section, so no padding is needed either (vocab-only files)
    elif any(s is None for s in sizes):
        expected = None
    else:
        expected = data_offset + max(t.offset + s for t, s in zip(tensors, sizes))
    return GGUFHeader(version, metadata, tensors, data_offset, expected, file_size)


def check_gguf(path: str | Path) -> GGUFHeader:
    """read_gguf_header, plus: the file holds all the tensor data the header promises."""
    header = read_gguf_header(path)
    if header.expected_size is not None and header.file_size < header.expected_size:
        raise GGUFError(
            f"{path}: truncated GGUF: {header.file_size:,} bytes but its tensors end at "
            f"{header.expected_size:,} bytes"
        )
    return header


def gguf_metadata(path: str | Path, arrays: Collection[str] = ()) -> dict[str, Any]:
    """The metadata of a GGUF: scalars as values, arrays as their length unless named in
    `arrays` (then as lists)."""
    header = read_gguf_header(path, arrays)
    return {
        k: (len(v) if isinstance(v, GGUFArray) else v) for k, v in header.metadata.items()
    }
