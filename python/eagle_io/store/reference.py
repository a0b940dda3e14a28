"""Pure-Python reference reader for the eagle-io dataset format, version 3 (docs/FORMAT.md).

Written from the specification alone, with numpy, zstandard and the standard library only; it never
touches ``eagle_io._native`` and also runs as a standalone file. It is slow on purpose: it exists to
document the format and to cross-check the Rust reader.

    ds = open_dataset("ROOT")          # or "ROOT/manifest.r00001.json"
    sample_id, n_tokens, key = ds.entry(0)
    arrays = ds.read(0)                # {"input_ids": int64 [L], "hidden_states": uint16 [L, H], ...}

Arrays have shape ``[L]`` (width null) or ``[L, width]`` and the schema dtype, little-endian, except
``bfloat16``, which numpy lacks: it is returned as ``numpy.uint16`` holding the raw bf16 bits
(``torch.from_numpy(a).view(torch.bfloat16)`` recovers the tensor). Tensors stored as FP8 (section 3.1) are
dequantised into their schema dtype, bit for bit as the Rust reader does; a sample referencing a prefix record
(section 4.7) is returned whole, the prefix's rows first. Every violation of the spec raises
:class:`ReferenceFormatError` naming the file, the sample id (or None) and a byte offset.
"""

from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np
import zstandard

FORMAT_VERSION = 3
HEADER = struct.Struct("<8sIII12s")  # magic, format_version, schema_len, schema_crc32, reserved (4.1)
FOOTER = struct.Struct("<QQQII8s")  # index_offset, index_len, n_records, index_crc32, reserved, magic (4.2)
ENTRY = struct.Struct("<QQQQII")  # sample_id, offset, length, n_tokens, crc32, key_len (4.3)
RECORD = struct.Struct("<4sIQQ")  # magic, n_tensors, sample_id, n_tokens (4.4)
PREFIX_REF = struct.Struct("<QQ32s")  # prefix_id, prefix_tokens, sha256 of its input_ids (4.7)
TENSOR = struct.Struct("<II")  # n_chunks, reserved (4.4)
CHUNK = struct.Struct("<BBBBI4I")  # codec, planes, plane_zstd, layout, rows, stored[4] (4.5)
RAW, ZSTD, PLANES = 0, 1, 2
LAYOUT_FP8 = 3  # 4.6
MAX_EXPANSION = 40000  # 4.3: decoded size may not exceed length x 40000
DTYPES = {  # 3: schema dtype -> numpy dtype of the returned array (bfloat16: raw bits)
    "bool": np.dtype(np.bool_), "uint8": np.dtype("u1"), "int8": np.dtype("i1"), "int16": np.dtype("<i2"),
    "int32": np.dtype("<i4"), "int64": np.dtype("<i8"), "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"), "float32": np.dtype("<f4"),
}  # fmt: skip


try:  # inside the package: under eagle_io's error hierarchy
    from ..errors import EagleIOError as _EagleIOError

    _EAGLE_IO: tuple[type, ...] = (_EagleIOError,)
except ImportError:  # loaded as a standalone file (no parent package): nothing of eagle_io is imported
    _EAGLE_IO = ()


class _Malformed(ValueError):
    """Internal: a chunk or frame that breaks the spec; caught below and raised as :class:`ReferenceFormatError`
    with the file, sample and offset."""


class ReferenceIndexError(*_EAGLE_IO, IndexError):  # type: ignore[misc]
    """A position past the end of the dataset."""


class ReferenceFormatError(*_EAGLE_IO, ValueError):  # type: ignore[misc]
    """The data violates docs/FORMAT.md, as the pure-Python reference reader sees it. ``path``: the file;
    ``sample_id``: the record's id or None; ``offset``: byte offset of the offending structure in that file (None
    for manifest fields)."""

    def __init__(self, message: str, path: str, sample_id: int | None = None, offset: int | None = None):
        self.path, self.sample_id, self.offset = path, sample_id, offset
        where = "".join([path, f" sample {sample_id}" if sample_id is not None else "",
                         f" at offset {offset}" if offset is not None else ""])  # fmt: skip
        super().__init__(f"{where}: {message}")


class ReferenceVersionError(ReferenceFormatError):
    """A format_version newer than the reference reader's (docs/FORMAT.md section 6)."""


def _check_version(version: object, path: str, offset: int | None) -> None:
    if type(version) is not int or version < 1:
        raise ReferenceFormatError(f"invalid format_version {version!r}", path, None, offset)
    if version > FORMAT_VERSION:
        raise ReferenceVersionError(f"format_version {version} is newer than {FORMAT_VERSION}", path, None, offset)


MAX_JSON_DEPTH = 127  # section 2: objects and arrays, the manifest's own object counting 1


def _not_json(name: str) -> None:
    raise _Malformed(f"{name} is not JSON")


def _depth(v: object) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


def _check_seal(data: bytes, checksum: object, path: str) -> None:
    """Section 2: ``checksum`` is the CRC-32 of the file with its 8 hex digits read as zeros."""
    digits = checksum[6:] if isinstance(checksum, str) and checksum.startswith("crc32:") else ""
    if len(digits) != 8 or any(c not in "0123456789abcdef" for c in digits):
        raise ReferenceFormatError(f"invalid checksum {checksum!r}", path)
    at = data.rfind(f'"{checksum}"'.encode()) + 7
    if at < 7:
        raise ReferenceFormatError("checksum string not found verbatim", path)
    actual = zlib.crc32(data[:at] + b"00000000" + data[at + 8 :])
    if actual != int(digits, 16):
        message = f"checksum mismatch: the file hashes to {actual:08x}, it says {digits}"
        raise ReferenceFormatError(message, path, None, at)


def _parse_schema(schema: object, path: str, offset: int | None) -> list[tuple[str, np.dtype, int | None, object]]:
    """Section 3: [(name, numpy dtype, width or None, FP8 storage)], FP8 storage being None (stored in the dtype)
    or the scale block (channels per scale; the width for one scale per token, section 3.1)."""
    try:
        specs = [(t["name"], t["dtype"], t["width"], t.get("precision")) for t in schema["tensors"]]  # type: ignore[index]
        ok = all(type(n) is str and d in DTYPES and (w is None or (type(w) is int and 1 <= w <= 1 << 24))
                 for n, d, w, _ in specs)  # fmt: skip
        for _, d, w, p in specs:
            if p is not None:
                block = p.get("block", w) if type(p) is dict else None
                ok = ok and set(p) <= {"storage", "block"} and p.get("storage") == "float8_e4m3fn"
                ok = ok and d in ("bfloat16", "float32") and w is not None and type(block) is int and block >= 1
    except (TypeError, KeyError, AttributeError):
        ok = False
    if not ok or len({n for n, _, _, _ in specs}) != len(specs):
        raise ReferenceFormatError(f"invalid schema {schema!r}", path, None, offset)
    return [(n, DTYPES[d], w, None if p is None else min(p.get("block", w), w)) for n, d, w, p in specs]


def _e4m3_values() -> np.ndarray:
    """Section 3.1: the float32 value of every float8_e4m3fn byte (0x7F, 0xFF: NaN)."""
    b = np.arange(256)
    e, m = (b >> 3) & 15, (b & 7).astype(np.float64)
    mag = np.where(e == 0, m / 512, (1 + m / 8) * 2.0 ** (e - 7))
    mag = np.where((b & 0x7F) == 0x7F, np.nan, mag)
    return np.where(b & 0x80, -mag, mag).astype(np.float32)


E4M3 = _e4m3_values()


def _dequantize(stored: bytes, n_tokens: int, width: int, block: int, dtype: np.dtype) -> bytes:
    """Section 3.1: rows of f32 scales then FP8 bytes -> ``e4m3(q) x scale`` in float32, rounded once to ``dtype``."""
    s = -(-width // block)
    rows = np.frombuffer(stored, np.uint8).reshape(n_tokens, 4 * s + width)
    scales = rows[:, : 4 * s].copy().view("<f4")
    values = E4M3[rows[:, 4 * s :]]
    x = values * np.repeat(scales, block, axis=1)[:, :width]
    if dtype == np.dtype("<f4"):
        return x.astype("<f4").tobytes()
    bits = x.astype("<f4").view("<u4").astype(np.uint64)
    bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")  # round to nearest even
    return np.where(np.isnan(x), ((bits >> 16) | 0x40).astype("<u2"), bf16).tobytes()


def _decode_fp8(desc: tuple, payload: bytes, size: int, width: int, n_scales: int) -> bytes:
    """Section 4.6: a layout-3 chunk -> rows of ``4 n_scales`` scale bytes then ``width`` FP8 bytes."""
    _, planes, plane_zstd, _, rows, *stored = desc
    if planes != 3 or plane_zstd & ~0b110 or stored[0] != 8 or stored[3]:
        raise _Malformed(f"FP8 chunk with planes={planes}, plane_zstd={plane_zstd:#x}, stored={stored}")
    w, s = struct.unpack_from("<II", payload, 0)
    s, flags = s & 0xFFFFFF, s >> 24  # model flags: 1 = residuals by channel class, 2 = scales as bf16 amax
    if (w, s) != (width, n_scales) or rows * (4 * s + w) != size or flags & ~3:
        raise _Malformed(
            f"FP8 chunk of {w} channels, {s} scales per row, flags {flags:#x}; the schema says {width} and {n_scales}"
        )
    elem = 2 if flags & 2 else 4
    streams, start = [], 8
    for p, length in ((1, rows * elem * s), (2, w + rows + rows * w)):
        data = payload[start : start + stored[p]]
        start += stored[p]
        if plane_zstd >> p & 1:
            data = _unzstd_classes(data, w, rows) if p == 2 and flags & 1 else _unzstd(data, length)
        if len(data) != length:
            raise _Malformed(f"FP8 stream {p} of {len(data)} bytes, expected {length}")
        streams.append(np.frombuffer(data, np.uint8))
    scales, modelled = streams
    base, offset = modelled[:w], modelled[w : w + rows]
    if flags & 1:  # channel by channel, channels stably sorted by class (base bits 5..7)
        d = np.empty((rows, w), np.uint8)
        d[:, np.argsort(base >> 5, kind="stable")] = modelled[w + rows :].reshape(w, rows).T
    else:
        d = modelled[w + rows :].reshape(rows, w)
    e = ((d >> 4) + ((base >> 1) & 15) + offset[:, None]) & 15
    q = (((d ^ base) & 1) << 7) | (e << 3) | ((d >> 1) & 7)
    if elem == 2:  # scale = f32(amax as bf16) / 448
        amax = scales.reshape(2, rows * s).T.copy().view("<u2").astype("<u4") << 16
        scales = (amax.view("<f4") / np.float32(448.0)).astype("<f4").view(np.uint8).reshape(rows, 4 * s)
    else:
        scales = scales.reshape(4, rows * s).T.reshape(rows, 4 * s)  # 4 byte planes -> little-endian f32 per row
    return np.concatenate([scales, q.astype(np.uint8)], axis=1).tobytes()


def _unzstd_classes(data: bytes, width: int, rows: int) -> bytes:
    """Stream 2 of a class-ordered FP8 chunk: zstd frames of the bases and offsets, then of each non-empty class's
    residuals (section 4.6)."""
    parts, out = [width + rows], []
    for size in parts:
        d = zstandard.ZstdDecompressor().decompressobj()
        out.append(d.decompress(data))
        if len(out[-1]) != size:
            raise _Malformed(f"FP8 stream 2 frame of {len(out[-1])} bytes, expected {size}")
        data = d.unused_data
        if len(parts) == 1:
            counts = np.bincount(np.frombuffer(out[0][:width], np.uint8) >> 5, minlength=8)
            parts.extend(int(n) * rows for n in counts if n)
    if data:
        raise _Malformed(f"FP8 stream 2: {len(data)} bytes follow its last frame")
    return b"".join(out)


def _unzstd(frame: bytes, size: int) -> bytes:
    """One complete zstd frame decoding to exactly ``size`` bytes (checked before allocating)."""
    declared = zstandard.get_frame_parameters(frame).content_size
    if declared not in (size, zstandard.CONTENTSIZE_UNKNOWN):
        raise _Malformed(f"zstd frame declares {declared} bytes, expected {size}")
    out = zstandard.ZstdDecompressor().decompress(frame, max_output_size=max(size, 1), allow_extra_data=False)
    if len(out) != size:
        raise _Malformed(f"zstd frame decoded to {len(out)} bytes, expected {size}")
    return out


def _decode_chunk(desc: tuple, payload: bytes, size: int, elem: int) -> bytes:
    """Section 4.5: a chunk's payload -> its ``size`` decoded bytes (raises ValueError)."""
    codec, planes, plane_zstd, layout, rows, *stored = desc
    if codec in (RAW, ZSTD):
        if planes != 1 or plane_zstd or layout or any(stored[1:]):
            raise _Malformed(f"codec {codec} needs planes 1, plane_zstd 0, layout 0, stored[1:] 0")
        if codec == ZSTD:
            return _unzstd(payload, size)
        if len(payload) != size:
            raise _Malformed(f"RAW chunk of {len(payload)} bytes, expected {size}")
        return payload
    if codec != PLANES:
        raise _Malformed(f"unknown codec {codec}")
    if (
        planes not in (2, 4)
        or planes != elem
        or plane_zstd >> planes
        or any(stored[planes:])
        or layout > 2
        or (layout == 2 and planes != 2)
    ):
        raise _Malformed(
            f"PLANES chunk with planes={planes}, plane_zstd={plane_zstd:#x}, layout={layout}, stored={stored}"
        )
    if rows == 0 and size == 0 == len(payload):
        return b""
    if rows == 0 or size % (planes * rows):
        raise _Malformed(f"{size} bytes do not split into {planes} planes of {rows} whole rows")
    out, start = np.empty((size // planes, planes), np.uint8), 0
    for p in range(planes):
        plane = payload[start : start + stored[p]]
        start += stored[p]
        zstd, channels = plane_zstd >> p & 1, size // planes // rows
        if zstd and layout in (1, 2):  # mode-delta: C channel bases, then plane - base (mod 256)
            frame = np.frombuffer(_unzstd(plane, channels + size // planes), np.uint8)
            base, delta = frame[:channels], frame[channels:].reshape(rows, channels)
            plane = (delta + base).astype(np.uint8).tobytes()  # uint8 addition wraps mod 256
        elif zstd:
            plane = _unzstd(plane, size // planes)
        if len(plane) != size // planes:
            raise _Malformed(f"plane {p} of {len(plane)} bytes, expected {size // planes}")
        out[:, p] = np.frombuffer(plane, np.uint8)  # decoded[i x n + p] = plane_p[i]
    if layout == 2:  # exponent split: plane 1 = bits 7..14, plane 0 = bit 15 (as its bit 7) and bits 0..6
        lo, hi = out[:, 0].astype(np.uint16), out[:, 1].astype(np.uint16)
        return (((lo & 0x80) << 8) | (hi << 7) | (lo & 0x7F)).astype("<u2").tobytes()
    return out.tobytes()


class _Shard:
    """One shard's header, footer and index (section 4), checked against its manifest entry."""

    def __init__(self, path: str, listed: dict, schema: list) -> None:
        self.path = path

        def fail(msg: str, offset: int | None) -> None:
            raise ReferenceFormatError(msg, path, None, offset)

        try:
            f = open(path, "rb")  # noqa: SIM115 (closed by the with below)
        except OSError as e:
            raise ReferenceFormatError(f"listed shard cannot be opened: {e.strerror or e}", path) from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if size != listed["bytes"]:
                fail(f"file is {size} bytes, the manifest lists {listed['bytes']}", None)
            if size < HEADER.size + FOOTER.size:
                fail(f"file of {size} bytes is shorter than header and footer", 0)
            magic, version, schema_len, schema_crc, reserved = HEADER.unpack(f.read(HEADER.size))
            if magic != b"EAGLEIO\0":
                fail(f"bad header magic {magic!r}", 0)
            if version != FORMAT_VERSION:
                _check_version(version, path, 8)
            self.version = version
            if any(reserved):
                fail("non-zero reserved header bytes", 20)
            if schema_len > 1 << 20 or 32 + schema_len > size - FOOTER.size:
                fail(f"schema_len {schema_len} out of bounds", 12)
            text = f.read(schema_len)
            footer_at = size - FOOTER.size
            f.seek(footer_at)
            index_offset, index_len, n_records, index_crc, reserved, magic = FOOTER.unpack(f.read(FOOTER.size))
            if magic != b"EIOINDX\0":
                fail(f"bad footer magic {magic!r}", footer_at + 32)
            if reserved:
                fail("non-zero reserved footer field", footer_at + 28)
            if index_offset < 32 + schema_len or index_offset + index_len != footer_at or n_records * 40 > index_len:
                fail(f"index_offset {index_offset} / index_len {index_len} / n_records {n_records} out of bounds",
                     footer_at)  # fmt: skip
            f.seek(index_offset)
            index = f.read(index_len)
        if zlib.crc32(text) != schema_crc:
            fail("schema_crc32 mismatch", 32)
        try:
            header_schema = _parse_schema(json.loads(text.decode("utf-8")), path, 32)
        except ValueError as e:  # JSON and UTF-8 errors
            raise ReferenceFormatError(f"schema JSON: {e}", path, None, 32) from None
        if header_schema != schema:
            fail("shard schema differs from the manifest's", 32)
        if zlib.crc32(index) != index_crc:
            fail("index_crc32 mismatch", index_offset)
        if index_crc != listed["index_crc32"] or n_records != listed["samples"]:
            fail(f"index_crc32 {index_crc} / n_records {n_records} disagree with the manifest entry {listed}",
                 footer_at)  # fmt: skip
        row_bytes = sum(dt.itemsize * (w or 1) for _, dt, w, _ in schema)
        self.entries: list[tuple[int, int, int, int, int, str]] = []
        expect, key_at = 32 + schema_len, 40 * n_records  # key_at: offset in the index
        for i in range(n_records):
            sample_id, offset, length, n_tokens, crc, key_len = ENTRY.unpack_from(index, 40 * i)
            at, what = index_offset + 40 * i, f"index entry {i} (sample {sample_id})"
            if offset != expect:
                fail(f"{what}: offset {offset}, records must be contiguous from {expect}", at)
            if n_tokens * row_bytes > length * MAX_EXPANSION:
                fail(f"{what}: {n_tokens} tokens cannot decode from {length} bytes", at)
            if key_at + key_len > index_len:
                fail(f"{what}: key_len {key_len} overruns the key blob", at)
            try:
                key = index[key_at : key_at + key_len].decode("utf-8")
            except UnicodeDecodeError:
                fail(f"{what}: key is not UTF-8", index_offset + key_at)
            self.entries.append((sample_id, offset, length, n_tokens, crc, key))
            expect, key_at = offset + length, key_at + key_len
        if expect != index_offset:
            fail(f"records end at {expect}, the index starts at {index_offset}", index_offset)
        if key_at != index_len:
            fail(f"key blob is {index_len - 40 * n_records} bytes, key_len sum to {key_at - 40 * n_records}",
                 index_offset + key_at)  # fmt: skip
        tokens = sum(e[3] for e in self.entries)
        if tokens != listed["tokens"] or tokens * row_bytes != listed["raw_bytes"]:
            fail(f"index holds {tokens} tokens, {tokens * row_bytes} raw bytes; the manifest lists {listed}",
                 index_offset)  # fmt: skip


class ReferenceDataset:
    """A dataset opened from its manifest and shard indexes (section 5); ``read`` decodes a record."""

    def __init__(self, manifest_path: str) -> None:
        self.path = manifest_path
        try:
            with open(manifest_path, "rb") as f:
                data = f.read()
            self.manifest: dict = json.loads(data.decode("utf-8"), parse_constant=_not_json)
            assert isinstance(self.manifest, dict)
            json.dumps(self.manifest, ensure_ascii=False).encode("utf-8")  # a lone surrogate escape is no text
        except (ValueError, AssertionError) as e:
            raise ReferenceFormatError(f"manifest is not a JSON object: {e}", manifest_path) from None
        if _depth(self.manifest) > MAX_JSON_DEPTH:
            raise ReferenceFormatError(f"manifest nests deeper than {MAX_JSON_DEPTH} levels", manifest_path)
        m = self.manifest
        if m.get("format") != "eagle-io/dataset":
            raise ReferenceFormatError(f"unknown format {m.get('format')!r}", manifest_path)
        _check_version(m.get("format_version"), manifest_path, None)
        _check_seal(data, m.get("checksum"), manifest_path)
        self.schema = _parse_schema(m.get("schema"), manifest_path, None)
        if bool(m.get("prefixes")) != (m["format_version"] >= 3):
            raise ReferenceFormatError(
                "format_version 3 is the version of manifests listing prefix shards, and only of them", manifest_path
            )
        self.shards, self._positions = self._open_listed("shards"), {}
        self._entries: list[tuple[_Shard, int]] = []  # position -> (shard, index entry)
        for shard in self.shards:
            for i, e in enumerate(shard.entries):
                if self._positions.setdefault(e[0], len(self._entries)) != len(self._entries):
                    raise ReferenceFormatError("duplicate sample id", shard.path, e[0], e[1])
                self._entries.append((shard, i))
        self._prefixes: dict[int, tuple[_Shard, tuple]] = {}  # prefix id -> (prefix shard, index entry) (4.7)
        for shard in self._open_listed("prefixes") if "prefixes" in m else []:
            for e in shard.entries:
                if self._prefixes.setdefault(e[0], (shard, e))[1] is not e:
                    raise ReferenceFormatError("duplicate prefix id", shard.path, e[0], e[1])

    def _open_listed(self, member: str) -> list[_Shard]:
        """The shards the manifest's list ``member`` (``shards`` or ``prefixes``) names, each checked (2)."""
        m, base, shards = self.manifest, os.path.dirname(self.path), []
        fields = {"file": str, "samples": int, "tokens": int, "bytes": int, "raw_bytes": int, "index_crc32": int}
        for listed in m.get(member) if isinstance(m.get(member), list) else [None]:
            if not isinstance(listed, dict) or any(type(listed.get(k)) is not t for k, t in fields.items()):
                raise ReferenceFormatError(f"invalid {member} entry {listed!r}", self.path)
            parts = listed["file"].split("/")
            if listed["file"].startswith("/") or parts[0] == "." or ".." in parts:
                raise ReferenceFormatError(f"shard path {listed['file']!r} is not relative to the dataset", self.path)
            shard = _Shard(os.path.join(base, listed["file"]), listed, self.schema)
            if shard.version > m["format_version"]:
                raise ReferenceFormatError(
                    f"shard version {shard.version} is newer than the manifest's", shard.path, None, 8
                )
            shards.append(shard)
        return shards

    def __len__(self) -> int:
        return len(self._entries)

    def _at(self, pos: int) -> tuple[_Shard, tuple]:
        if not 0 <= pos < len(self._entries):
            raise ReferenceIndexError(f"position {pos} out of range for {len(self._entries)} samples")
        shard, i = self._entries[pos]
        return shard, shard.entries[i]

    def entry(self, pos: int) -> tuple[int, int, str]:
        """``(sample_id, n_tokens, key)`` of the record at dataset position ``pos``."""
        _, (sample_id, _, _, n_tokens, _, key) = self._at(pos)
        return sample_id, n_tokens, key

    def position(self, sample_id: int) -> int | None:
        """The position of ``sample_id``, or None."""
        return self._positions.get(sample_id)

    def read(self, pos: int) -> dict[str, np.ndarray]:
        """Reads, checksums and decodes the record at ``pos`` (sections 4.4, 4.5), and the prefix record it
        references, if any, whose rows come first (4.7)."""
        return self._read(*self._at(pos), prefix_record=False)

    def _read(self, shard: _Shard, entry: tuple, prefix_record: bool) -> dict[str, np.ndarray]:
        sample_id, offset, length, n_tokens, crc, _ = entry

        def fail(msg: str) -> None:
            raise ReferenceFormatError(msg, shard.path, sample_id, offset)

        with open(shard.path, "rb") as f:
            f.seek(offset)
            rec = f.read(length)
        if len(rec) != length or zlib.crc32(rec) != crc:
            fail(f"record of {length} bytes fails its crc32")
        if length < RECORD.size:
            fail("record shorter than its header")
        magic, n_tensors, rec_id, rec_tokens = RECORD.unpack_from(rec, 0)
        referencing = magic == b"EREF" and shard.version >= 3 and not prefix_record
        if (
            not (magic == b"EREC" or referencing)
            or n_tensors != len(self.schema)
            or rec_id != sample_id
            or rec_tokens != n_tokens
        ):
            fail(f"record header {magic!r}, {n_tensors} tensors, sample {rec_id}, {rec_tokens} tokens disagrees")
        at, chunk_lists, prefix = RECORD.size, [], None
        if referencing:
            if length < at + PREFIX_REF.size:
                fail("prefix reference overruns the record")
            prefix_id, prefix_tokens, digest = PREFIX_REF.unpack_from(rec, at)
            at += PREFIX_REF.size
            if not 1 <= prefix_tokens <= n_tokens:
                fail(f"prefix reference of {prefix_tokens} tokens in a sample of {n_tokens}")
            if prefix_id not in self._prefixes:
                fail(f"references prefix record {prefix_id}, which the dataset does not hold")
            prefix = self._prefixes[prefix_id]
            if prefix[1][3] != prefix_tokens or prefix[1][5] != "sha256:" + digest.hex():
                fail(f"references prefix record {prefix_id} as {prefix_tokens} tokens with sha256:{digest.hex()}, "
                     f"but it holds {prefix[1][3]} tokens with {prefix[1][5]}")  # fmt: skip
            n_tokens -= prefix_tokens  # the rows this record stores
        for name, _, _, _ in self.schema:
            if at + TENSOR.size > length:
                fail(f"tensor {name!r}: chunk table overruns the record")
            n_chunks, reserved = TENSOR.unpack_from(rec, at)
            if reserved or at + TENSOR.size + CHUNK.size * n_chunks > length:
                fail(f"tensor {name!r}: {n_chunks} chunks / reserved {reserved} at record byte {at}")
            chunk_lists.append([CHUNK.unpack_from(rec, at + 8 + CHUNK.size * j) for j in range(n_chunks)])
            at += TENSOR.size + CHUNK.size * n_chunks
        out = {}
        for (name, dtype, width, block), chunks in zip(self.schema, chunk_lists, strict=True):
            n_scales = None if block is None else -(-width // block)
            row_bytes = dtype.itemsize * (width or 1) if block is None else 4 * n_scales + width
            buf, row = bytearray(n_tokens * row_bytes), 0
            for desc in chunks:
                rows, stored = desc[4], sum(desc[5:])
                if row + rows > n_tokens or at + stored > length:
                    fail(f"tensor {name!r}: chunk at record byte {at} overruns the rows or the record")
                fp8_chunk = desc[0] == PLANES and desc[3] == LAYOUT_FP8
                if fp8_chunk != (block is not None and desc[0] == PLANES):
                    fail(f"tensor {name!r}: chunk of layout {desc[3]} at record byte {at} for its storage")
                try:
                    payload, size = rec[at : at + stored], rows * row_bytes
                    buf[row * row_bytes : (row + rows) * row_bytes] = (
                        _decode_fp8(desc, payload, size, width, n_scales) if fp8_chunk
                        else _decode_chunk(desc, payload, size, dtype.itemsize)
                    )  # fmt: skip
                except (ValueError, zstandard.ZstdError) as e:  # _Malformed, and numpy's size errors
                    fail(f"tensor {name!r}: chunk at record byte {at}: {e}")
                row, at = row + rows, at + stored
            if row != n_tokens:
                fail(f"tensor {name!r}: chunks cover {row} rows, expected {n_tokens}")
            if block is not None:
                try:
                    buf = _dequantize(bytes(buf), n_tokens, width, block, dtype)
                except ValueError as e:
                    fail(f"tensor {name!r}: {e}")
            array = np.frombuffer(buf, dtype).reshape((n_tokens, width) if width else (n_tokens,))
            if dtype == np.bool_ and (array.view(np.uint8) > 1).any():
                fail(f"tensor {name!r}: bool value other than 0 or 1")
            out[name] = array
        if at != length:
            fail(f"payloads end at record byte {at}, the record is {length} bytes")
        if prefix is None:
            return out
        head = self._read(*prefix, prefix_record=True)
        return {name: np.concatenate([head[name], out[name]]) for name in out}


def open_dataset(path: str | os.PathLike[str]) -> ReferenceDataset:
    """Opens a dataset from a manifest file, or a directory holding ``manifest.json``."""
    path = os.fspath(path)
    return ReferenceDataset(os.path.join(path, "manifest.json") if os.path.isdir(path) else path)
