"""A GGUF header reader: enough to tell a whole GGUF file from a wrong or truncated one
before llama.cpp gets it (llama.cpp's own message for a short file is a bare "failed to
load model"), and to show metadata without loading weights.

Layout (little-endian, GGUF v2/v3): magic "GGUF", u32 version, u64 tensor count, u64 kv
count, the kv pairs, the tensor infos (name, dims, ggml type, offset relative to the data
section), padding to `general.alignment`, then tensor data.

String arrays (a tokenizer's tokens and merges: 50k-260k length-prefixed strings) are
most of a header. Walking them one string at a time in Python costs tens of ms per
file, so they are skipped in vectorised windows (numpy) that are checked exactly
against the length prefixes; see `_Reader.skip_strings`.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdash.contract.errors import SpecdashError

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

# general.file_type (llama.cpp's llama_ftype, include/llama.h) -> the name quantizers use.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}
FILE_TYPE_GUESSED = 1024  # llama.cpp ORs this in when it inferred the type

# GGUF metadata value types -> struct format of one scalar.
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 8  # GGML_MAX_DIMS is 4; anything far above means a corrupt header
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_TYPE_OFFSET = struct.Struct("<IQ")
# String arrays shorter than this are walked in Python: numpy's setup would cost more.
_VECTOR_MIN_STRINGS = 256
# Bytes per string assumed when sizing a vectorised window (token texts average 5-10
# bytes plus the 8-byte length). Too small costs one more window, never a wrong answer.
_WINDOW_BYTES_PER_STRING = 18
_MAX_WINDOW = 16 << 20


class GGUFError(SpecdashError):
    """The file is not a usable GGUF; the message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class GGUFArray:
    """An array value whose contents were not read (only its element type and length).

    `offset` and `end` are the file offsets of its first element and of the byte after
    its last; `digest` is set only when read_gguf_header was asked for one (`digests`)."""

    value_type: int
    length: int
    offset: int = 0
    end: int = 0
    digest: str | None = None

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

    def skip_strings(self, n: int, starts: list[int] | None = None) -> None:
        """Skip `n` consecutive length-prefixed strings, appending each one's offset to
        `starts` if given. Same result as n calls of skip_string, faster.

        Vectorised over a window of bytes: every string whose length is 1..255 has its
        length prefix as one non-zero byte followed by seven zero bytes, so numpy marks
        every position with that shape. Marks that are not string starts (zero bytes
        inside a text) and starts that are not marked (empty or >255-byte strings) are
        both caught by checking the chain exactly: each start must be the previous
        start + 8 + its length. Where the chain breaks, the string there is read
        directly and the chain resumes after it."""
        remaining = n
        while remaining >= _VECTOR_MIN_STRINGS:
            done, new_pos = _chain_window(self.buf, self.pos, remaining, starts)
            if done == 0:
                if starts is not None:
                    starts.append(self.pos)
                self.skip_string()  # the string the window could not prove; bounds-checked
                remaining -= 1
                continue
            if new_pos > len(self.buf):
                self.pos = len(self.buf)
                self.skip(new_pos - len(self.buf))  # raises: truncated
            self.pos = new_pos
            remaining -= done
        for _ in range(remaining):
            if starts is not None:
                starts.append(self.pos)
            self.skip_string()

    def string_array(self, n: int) -> list[bytes]:
        """Read `n` strings as raw bytes."""
        starts: list[int] = []
        self.skip_strings(n, starts)
        starts.append(self.pos)
        buf = self.buf
        return [buf[a + 8:b] for a, b in zip(starts, starts[1:])]

    def value(self, vtype: int, read_array: bool, digest_from: int | None = None) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            length = self.unpack("<Q")
            if read_array:
                if etype == _STRING:
                    return [b.decode("utf-8", errors="replace") for b in self.string_array(length)]
                return [self.value(etype, True) for _ in range(length)]
            offset = self.pos
            digest_at: int | None = None
            if etype in _SCALAR_FORMATS:
                self.skip(length * struct.calcsize(_SCALAR_FORMATS[etype]))
            elif etype == _STRING:
                if digest_from is not None and length > digest_from:
                    for _ in range(digest_from):
                        self.skip_string()
                    digest_at = self.pos
                    self.skip_strings(length - digest_from)
                else:
                    self.skip_strings(length)
            else:
                for _ in range(length):
                    self.value(etype, False)
            digest = None
            if digest_from is not None:
                digest = _sha1(self.buf, self.pos if digest_at is None else digest_at, self.pos)
            return GGUFArray(etype, length, offset, self.pos, digest)
        raise GGUFError(f"{self.path}: corrupt GGUF header: unknown metadata value type {vtype}")


def _sha1(buf: mmap.mmap | bytes, start: int, end: int) -> str:
    with memoryview(buf) as view, view[start:end] as part:
        return hashlib.sha1(part, usedforsecurity=False).hexdigest()


def _chain_window(
    buf: mmap.mmap | bytes, pos: int, remaining: int, starts: list[int] | None
) -> tuple[int, int]:
    """One vectorised window of Reader.skip_strings: (strings proven, offset after the
    last of them); (0, pos) when not even the string at `pos` can be proven here."""
    import numpy as np  # here, not at the top: `specdash --help` need not load numpy

    width = min(len(buf) - pos, max(4096, remaining * _WINDOW_BYTES_PER_STRING), _MAX_WINDOW)
    if width < 16:
        return 0, pos
    window = np.frombuffer(buf, dtype=np.uint8, count=width, offset=pos)
    try:
        zero = window == 0
        marks = ~zero[: width - 7]
        for k in range(1, 8):
            marks &= zero[k : width - 7 + k]
        cand = np.flatnonzero(marks)
        following = cand + 8 + window[cand]
        # breaks[i]: the chain leaves the marks after cand[breaks[i]]
        breaks = np.flatnonzero(following[:-1] != cand[1:])
        breaks = np.append(breaks, len(cand) - 1)  # the window ends after the last mark
        done, at = 0, 0  # strings proven; window offset of the next string to prove
        while done < remaining:
            i = int(np.searchsorted(cand, at))
            if i < len(cand) and cand[i] == at:
                # A proven start: follow the marks to the next break.
                b = int(breaks[np.searchsorted(breaks, i)])
                take = min(b - i + 1, remaining - done)
                if starts is not None:
                    starts.extend((cand[i : i + take] + pos).tolist())
                done += take
                at = int(following[i + take - 1])
                continue
            # Unmarked (an empty or >255-byte string, or too near the window's end): read
            # its length directly, if it lies in the window.
            if at + 8 > width:
                break
            if starts is not None:
                starts.append(pos + at)
            done += 1
            at += 8 + _U64.unpack_from(buf, pos + at)[0]
            if at > width:
                break
        return done, pos + at
    finally:
        del window  # the mmap cannot close while numpy holds a view of it


def read_gguf_header(
    path: str | Path, arrays: Collection[str] = (), *, digests: Mapping[str, int] | None = None,
    array_suffixes: tuple[str, ...] = (),
) -> GGUFHeader:
    """Parse the header of the GGUF at `path`. Array values are returned as GGUFArray
    (type and length) except for the keys named in `arrays` or ending in one of
    `array_suffixes` (per-layer values whose key holds the architecture), read in full.

    `digests` maps array keys to a first element index: such an array's GGUFArray gets
    the sha1 of its raw encoding from that element on (equal digests: equal elements)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            file_size = path.stat().st_size
            if file_size < 8:
                raise GGUFError(f"{path}: not a GGUF file (only {file_size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(_Reader(buf, path), file_size, frozenset(arrays), digests or {},
                              array_suffixes)
    except IsADirectoryError:
        raise GGUFError(f"{path}: is a directory, not a GGUF file")
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read: {exc.strerror or exc}")


def read_string_array(path: str | Path, key: str) -> list[bytes]:
    """The elements of the string array `key` (e.g. tokenizer.ggml.tokens) as raw bytes,
    as llama.cpp reads them; [] if the file has no such key."""
    header = read_gguf_header(path)
    arr = header.metadata.get(key)
    if not isinstance(arr, GGUFArray) or arr.value_type != _STRING:
        return []
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            reader = _Reader(buf, path)
            reader.pos = arr.offset
            return reader.string_array(arr.length)
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read: {exc.strerror or exc}")


def has_gguf_magic(path: str | Path) -> bool:
    """Does the file start with b'GGUF'? False for anything unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def file_type_name(file_type: int) -> str:
    """general.file_type as a quantization name (Q4_K_M...)."""
    return FILE_TYPES.get(file_type & ~FILE_TYPE_GUESSED, f"ftype {file_type}")


def _parse(r: _Reader, file_size: int, arrays: frozenset[str], digests: Mapping[str, int],
           array_suffixes: tuple[str, ...] = ()) -> GGUFHeader:
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
        read = key in arrays or (bool(array_suffixes) and key.endswith(array_suffixes))
        metadata[key] = r.value(vtype, read, digests.get(key))

    tensors = _tensor_infos(r, n_tensors)

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
        expected = data_offset + max(t.offset + (s or 0) for t, s in zip(tensors, sizes))
    return GGUFHeader(version, metadata, tensors, data_offset, expected, file_size)


def _tensor_infos(r: _Reader, n_tensors: int) -> list[TensorInfo]:
    """The tensor infos, unpacked inline: a 300-tensor header is 2,000 fields, and a
    method call per field was most of the time of parsing a small model's header."""
    buf, pos, end = r.buf, r.pos, len(r.buf)
    u64, u32, tail = _U64.unpack_from, _U32.unpack_from, _TYPE_OFFSET.unpack_from
    tensors = []
    try:
        for _ in range(n_tensors):
            (n,) = u64(buf, pos)
            if pos + 8 + n > end:
                raise struct.error
            name = bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8", errors="replace")
            pos += 8 + n
            (n_dims,) = u32(buf, pos)
            if n_dims > _MAX_DIMS:
                raise GGUFError(f"{r.path}: corrupt GGUF header: tensor {name!r} has {n_dims} dims")
            shape = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            pos += 4 + 8 * n_dims
            ggml_type, offset = tail(buf, pos)
            pos += 12
            tensors.append(TensorInfo(name, ggml_type, shape, offset))
    except struct.error:
        raise GGUFError(
            f"{r.path}: truncated GGUF: the header runs past the end of the file ({end:,} bytes)"
        ) from None
    r.pos = pos
    return tensors


def check_gguf(path: str | Path, *, digests: Mapping[str, int] | None = None,
               array_suffixes: tuple[str, ...] = ()) -> GGUFHeader:
    """read_gguf_header, plus: the file holds all the tensor data the header promises."""
    header = read_gguf_header(path, digests=digests, array_suffixes=array_suffixes)
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
