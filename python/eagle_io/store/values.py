"""Whether captured states can be real: the one value checker of the capture core
(:class:`eagle_io.capturing.store.SampleStore`, HF and SGLang paths alike), ``eagle-io verify`` and the run report.

Kinds (:data:`KINDS`), per sample, checked on the aux states ``[L, k*H]`` (``k`` blocks of ``H``, one per captured
layer) and the final states ``[L, H]``:

* ``nonfinite``: a NaN or Inf value, or (at capture) a finite value the storage dtype cannot hold, which the cast
  for storage would turn into Inf (|x| >= 65520 for float16);
* ``zero_sample``: every value of the sample is exactly 0;
* ``zero_rows``: a token row where one captured layer's ``H`` values (or the final state's) are all exactly 0;
* ``copied_layers``: a token row where two captured layers' blocks are equal bit for bit (the capture wrote one
  layer twice: two hooks on the same layer, a slot filled from the wrong layer); different layers' inputs differ by
  the layers between them, so real states never do this;
* ``copied_rows``: a token row whose aux (or final) states equal bit for bit a row of an earlier sample of the same
  forward (capture) or of the samples stored near it (``verify``), although the two rows' token prefixes differ
  (a row of states depends on the whole prefix, so only a shared prefix at the same position gives equal rows).

The last four are the symptoms of broken capture wiring (a hook that never fired, a buffer read before it was
written, per-request offsets that point into another request); real states never show them.

Cost at capture: :func:`row_stats` reads the states once on their device (per-row max |x| per layer block, from
the bits, and a hash of up to :data:`HASH_COLUMNS` columns of each layer block and of the final state) and brings
``[N, 2k + 3]`` numbers to the host in one copy: one host sync per forward. Only rows whose hashes collide are
compared in full (for copied layers, the first such row of a sample).

Beside it: :mod:`eagle_io.store.value_stats` (the per-layer max |x| file a capture leaves, and the float16 range
warning) and :mod:`eagle_io.store.value_scan` (every sample of a dataset, for ``eagle-io verify`` and the report).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import SchemaError

__all__ = [
    "HASH_COLUMNS",
    "IMPLAUSIBLE",
    "KINDS",
    "RowStats",
    "SampleRows",
    "block_names",
    "find_problems",
    "overflow_limit",
    "row_stats",
    "sample_absmax",
]

KINDS = ("nonfinite", "zero_sample", "zero_rows", "copied_layers", "copied_rows")
"""Problem kinds, most severe first (a sample with several is reported under the first)."""
IMPLAUSIBLE = ("zero_sample", "zero_rows", "copied_layers", "copied_rows")
"""The finite kinds: states that are numbers but cannot come from a real forward."""
HASH_COLUMNS = 64
"""Columns per row (evenly spaced over the row) hashed to find candidate copies; candidates are compared in full."""

_CHUNK_ELEMENTS = 1 << 24  # bounds the hash's int64 temporary (128 MiB)
_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}


def block_names(k: int, aux_layer_ids: Sequence[int] | None = None) -> list[str]:
    """Names of the ``k + 1`` blocks of a row: ``"aux layer {id}"`` (or ``"aux block {j}"`` without ids), then
    ``"hidden_states"``."""
    ids = list(aux_layer_ids) if aux_layer_ids is not None and len(aux_layer_ids) == k else None
    return [f"aux layer {ids[j]}" if ids else f"aux block {j}" for j in range(k)] + ["hidden_states"]


def overflow_limit(dtype: torch.dtype) -> float:
    """The smallest |x| that rounds to Inf when cast to floating ``dtype`` (round to nearest even): the largest
    finite value plus half its spacing (65520.0 for float16)."""
    info = torch.finfo(dtype)
    top = float(info.max)
    return top + 2.0 ** math.floor(math.log2(top)) * float(info.eps) / 2


@dataclass(frozen=True)
class RowStats:
    """Per-row summaries of ``N`` rows of states, on the CPU.

    Attributes:
        absmax: ``[N, k + 1]`` float32: max |x| of each aux layer block, then of the final state (NaN when the
            block holds a NaN, Inf when it holds an Inf; 0 exactly when the block is all zeros).
        aux_hash, final_hash: ``[N]`` int64 hashes of the rows' bits (equal rows, equal hashes).
        block_hash: ``[N, k]`` int64 hashes of each aux layer block's bits (equal blocks, equal hashes).
    """

    absmax: torch.Tensor
    aux_hash: torch.Tensor
    final_hash: torch.Tensor
    block_hash: torch.Tensor

    def __len__(self) -> int:
        return int(self.absmax.shape[0])

    def rows(self, start: int, length: int) -> RowStats:
        """The stats of rows ``[start, start + length)``."""
        end = start + length
        return RowStats(*(getattr(self, f)[start:end] for f in FIELDS))


def _bits(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bits as signed integers of its element size (a view: same-size dtype views keep any strides)."""
    return x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def _block_hashes(x: torch.Tensor, k: int) -> torch.Tensor:
    """``[N, k]`` int64: for each of the ``k`` blocks of ``H = width // k`` columns of each row, a weighted sum (mod
    2^64) of the bits of up to :data:`HASH_COLUMNS` evenly spaced columns (every ``H // HASH_COLUMNS``-th, a strided
    view: no gather; the same offsets and weights in every block, so equal blocks hash equal)."""
    n, width = x.shape
    h = width // k
    step = max(1, h // HASH_COLUMNS)
    cols = min(h, HASH_COLUMNS)
    key = (h, str(x.device))
    if key not in _WEIGHTS:
        g = torch.Generator().manual_seed(0x5EED + h)
        _WEIGHTS[key] = (torch.randint(-(2**62), 2**62, (cols,), generator=g, dtype=torch.int64) | 1).to(x.device)
    w = _WEIGHTS[key]
    picked = _bits(x if x.stride(-1) == 1 else x.contiguous()).unflatten(1, (k, h))[:, :, ::step][:, :, :cols]
    out = torch.empty(n, k, dtype=torch.int64, device=x.device)
    rows = max(1, _CHUNK_ELEMENTS // (k * cols))
    for i in range(0, n, rows):
        out[i : i + rows] = (picked[i : i + rows].to(torch.int64) * w).sum(-1)
    return out


_SIGN_OFF = {2: 0x7FFF, 4: 0x7FFF_FFFF, 8: 0x7FFF_FFFF_FFFF_FFFF}


def _absmax(x: torch.Tensor, k: int) -> torch.Tensor:
    """``[N, k]`` float32: max |x| of each of the ``k`` blocks of each row. Computed on the bits with the sign bit
    cleared (for IEEE floats their integer order is the order of |x|, Inf above the finite values and NaN above Inf):
    one integer reduction, in row chunks that bound the temporary; NaN and Inf come out as themselves."""
    n, width = x.shape
    as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    mask = _SIGN_OFF[x.element_size()]
    out = torch.empty(n, k, dtype=as_int, device=x.device)
    step = max(1, _CHUNK_ELEMENTS // width)
    for i in range(0, n, step):
        bits = x[i : i + step].contiguous().view(as_int) & mask
        out[i : i + step] = bits.view(-1, k, width // k).amax(-1)
    return out.view(x.dtype).float()


def row_stats(aux: torch.Tensor, final: torch.Tensor) -> RowStats:
    """Summarises ``N`` rows: ``aux [N, k*H]`` and ``final [N, H]`` (same device, any floating dtype), on their
    device, then copies ``[N, 2k + 3]`` numbers to the host at once (the only host sync).

    Raises:
        SchemaError: (a ``ValueError``) shapes that are not ``[N, k*H]`` / ``[N, H]`` with ``k >= 1``.
    """
    if aux.dim() != 2 or final.dim() != 2 or aux.shape[0] != final.shape[0]:
        raise SchemaError(f"row_stats needs aux [N, k*H] and final [N, H], got {list(aux.shape)}, {list(final.shape)}")
    n, width = aux.shape
    hidden = final.shape[1]
    if hidden == 0 or width % hidden or width == 0:
        raise SchemaError(f"aux width {width} is not a multiple of the final states' width {hidden}")
    k = width // hidden
    if n == 0:
        empty = torch.empty(0, dtype=torch.int64)
        return RowStats(torch.empty(0, k + 1), empty, empty, torch.empty(0, k, dtype=torch.int64))
    absmax = torch.cat([_absmax(aux, k), _absmax(final, 1)], dim=1)
    blocks = _block_hashes(aux, k)
    # The whole row's hash from its blocks' (equal rows have equal blocks); odd weights per block position.
    aux_hash = (blocks * _block_weights(k, blocks.device)).sum(-1, keepdim=True)
    packed = torch.cat([absmax.view(torch.int32).to(torch.int64), aux_hash, _block_hashes(final, 1), blocks], 1)
    host = packed.cpu()
    absmax_host = host[:, : k + 1].to(torch.int32).view(torch.float32)
    return RowStats(absmax_host, host[:, k + 1], host[:, k + 2], host[:, k + 3 :])


def _block_weights(k: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0xB10C + k)
    return (torch.randint(-(2**62), 2**62, (k,), generator=g, dtype=torch.int64) | 1).to(device)


FIELDS = ("absmax", "aux_hash", "final_hash", "block_hash")
"""The :class:`RowStats` fields, each with one row per state row (``torch.cat`` them to join two stats)."""


@dataclass(frozen=True)
class SampleRows:
    """A sample's place in a :class:`RowStats`: rows ``[start, start + length)``; ``input_ids [L]`` (any int
    sequence) tells shared prefixes from copies."""

    sample_id: Any
    input_ids: Any
    start: int
    length: int


def _row_list(mask: torch.Tensor, limit: int = 8) -> list[int]:
    return mask.nonzero().flatten()[:limit].tolist()


def _lcp(a: torch.Tensor, b: torch.Tensor) -> int:
    m = min(a.shape[0], b.shape[0])
    diff = (a[:m] != b[:m]).nonzero()
    return int(diff[0, 0]) if diff.numel() else m


def _copies(
    stats: RowStats,
    samples: Sequence[SampleRows],
    valid: torch.Tensor,
    same_rows: Callable[[str, int, int], bool] | None,
) -> dict[int, dict[str, Any]]:
    """``{sample index: its first copied row (and ``rows``, how many)}`` for samples holding a row equal to an earlier
    sample's row whose token prefix differs. ``valid [N]`` marks the rows to compare (finite, no zero block)."""
    owner = torch.full((len(stats),), -1, dtype=torch.int64)
    for i, s in enumerate(samples):
        owner[s.start : s.start + s.length] = i
    rows = (valid & (owner >= 0)).nonzero().flatten()  # in sample order, then row order
    if rows.numel() < 2:
        return {}
    ids = [torch.as_tensor(s.input_ids, dtype=torch.int64).flatten() for s in samples]
    lcp: dict[tuple[int, int], int] = {}
    hits: dict[int, dict[int, dict[str, Any]]] = {}  # sample index -> row -> the first copy found of it
    for tensor, hashes in (("aux_hidden_states", stats.aux_hash), ("hidden_states", stats.final_hash)):
        h = hashes[rows]
        order = torch.sort(h, stable=True).indices
        hs = h[order]
        same = hs[1:] == hs[:-1]
        if not bool(same.any()):
            continue
        in_group = torch.zeros(len(hs), dtype=torch.bool)
        in_group[1:] |= same
        in_group[:-1] |= same
        ref: tuple[int, int, int] | None = None  # (hash, global row, sample index) of the group's first row
        for j in in_group.nonzero().flatten().tolist():
            g = int(rows[order[j]])
            hv, si = int(hs[j]), int(owner[g])
            if ref is None or ref[0] != hv:
                ref = (hv, g, si)
                continue
            _, rg, ri = ref
            row, ref_row = g - samples[si].start, rg - samples[ri].start
            if si == ri or row in hits.get(si, {}):
                continue
            if row == ref_row:
                pair = (ri, si)
                if pair not in lcp:
                    lcp[pair] = _lcp(ids[ri], ids[si])
                if row < lcp[pair]:
                    continue  # a shared token prefix at the same position: equal states are expected
            if same_rows is not None and not same_rows(tensor, rg, g):
                continue  # a hash collision, not a copy
            copy = {"row": row, "tensor": tensor, "source_sample_id": samples[ri].sample_id, "source_row": ref_row}
            hits.setdefault(si, {})[row] = copy
    return {si: {**by_row[min(by_row)], "rows": len(by_row)} for si, by_row in hits.items()}


def _copied_layers(
    stats: RowStats,
    samples: Sequence[SampleRows],
    valid: torch.Tensor,
    same_blocks: Callable[[int, int, int], bool] | None,
) -> dict[int, dict[str, Any]]:
    """``{sample index: its first row whose aux blocks a < b are equal (``row``, ``rows`` with such a pair,
    ``blocks``)}``; the first candidate row of a sample is compared in full (``same_blocks``)."""
    bh = stats.block_hash
    k = int(bh.shape[1]) if bh.dim() == 2 else 0
    pairs = [(a, b) for a in range(k) for b in range(a + 1, k)]
    equal = {(a, b): (bh[:, a] == bh[:, b]) & valid for a, b in pairs}
    equal = {ab: eq for ab, eq in equal.items() if bool(eq.any())}
    if not equal:
        return {}
    any_pair = torch.stack(list(equal.values())).any(0)
    out: dict[int, dict[str, Any]] = {}
    for i, s in enumerate(samples):
        lo, hi = s.start, s.start + s.length
        if not bool(any_pair[lo:hi].any()):
            continue
        for (a, b), eq in equal.items():
            rows = eq[lo:hi]
            if not bool(rows.any()):
                continue
            row = int(rows.nonzero()[0, 0])
            if same_blocks is None or same_blocks(lo + row, a, b):
                out[i] = {"row": row, "rows": int(any_pair[lo:hi].sum()), "blocks": (a, b)}
                break
    return out


def find_problems(
    stats: RowStats,
    samples: Sequence[SampleRows],
    *,
    names: Sequence[str] | None = None,
    source_dtype: torch.dtype | None = None,
    held_dtype: torch.dtype | None = None,
    store_dtype: torch.dtype | None = None,
    same_rows: Callable[[str, int, int], bool] | None = None,
    same_blocks: Callable[[int, int, int], bool] | None = None,
) -> list[list[dict[str, Any]]]:
    """The problems of each sample of one forward (or one window of a dataset), most severe first.

    Args:
        stats: :func:`row_stats` of the rows of every sample.
        samples: where each sample's rows are; copies are looked for across these samples only.
        names: the ``k + 1`` block names (:func:`block_names`); default ``aux block j`` / ``hidden_states``.
        source_dtype: the dtype the target's forward computed in (named when it is float16).
        held_dtype: the dtype of the checked states (default ``source_dtype``; float16 when a capture cast them).
        store_dtype: the dtype they will be stored in; when it differs from ``held_dtype``, finite values at or
            above :func:`overflow_limit` of ``store_dtype`` are ``nonfinite`` (the cast for storage makes them Inf).
        same_rows: ``same_rows(tensor, row_a, row_b)`` compares two rows in full (global row numbers; ``tensor`` is
            ``"aux_hidden_states"`` or ``"hidden_states"``); None trusts the hash.
        same_blocks: ``same_blocks(row, a, b)`` compares aux blocks ``a`` and ``b`` of one (global) row in full; None
            trusts the hash.

    Returns:
        Per sample (in order), a list of plain dicts, empty when the sample is plausible: ``kind`` (one of
        :data:`KINDS`), ``sample_id``, ``row`` (first token row), ``rows`` (how many rows), ``tensor``, ``where``
        (block name), ``message`` (one line naming sample, tensor, layer and row); ``copied_layers`` adds ``layers``
        (the two block names); ``copied_rows`` adds ``source_sample_id`` and ``source_row``; ``nonfinite`` adds
        ``overflow`` (True for a storage-cast overflow) and ``value`` (the offending |x| when finite).
    """
    k1 = int(stats.absmax.shape[1]) if len(stats) else (len(names) if names else 1)
    names = list(names) if names is not None else block_names(k1 - 1)
    absmax = stats.absmax
    nonfinite = ~torch.isfinite(absmax)
    overflow = torch.zeros_like(nonfinite)
    limit = None
    held_dtype = held_dtype or source_dtype
    if held_dtype is not None and store_dtype is not None and held_dtype != store_dtype:
        limit = overflow_limit(store_dtype)
        overflow = ~nonfinite & (absmax >= limit)
    zero = absmax == 0
    bad_rows = (nonfinite | overflow).any(1)
    valid = ~bad_rows & ~zero.any(1)
    copies = _copies(stats, samples, valid, same_rows)
    layer_copies = _copied_layers(stats, samples, valid, same_blocks)
    out: list[list[dict[str, Any]]] = []
    for i, s in enumerate(samples):
        lo, hi = s.start, s.start + s.length
        found: list[dict[str, Any]] = []
        sid = s.sample_id
        nf, ov = nonfinite[lo:hi], overflow[lo:hi]
        if bool((nf | ov).any()):
            rows = (nf | ov).any(1)
            row = int(rows.nonzero()[0, 0])
            block = int((nf[row] | ov[row]).nonzero()[0, 0])
            tensor = "hidden_states" if block == len(names) - 1 else "aux_hidden_states"
            where = f"{tensor}" if tensor == "hidden_states" else f"{tensor} ({names[block]})"
            is_overflow = not bool(nf[row, block])
            p = {"kind": "nonfinite", "sample_id": sid, "row": row, "rows": int(rows.sum()), "tensor": tensor}
            p.update(where=names[block], overflow=is_overflow, value=float(absmax[lo + row, block]))
            if is_overflow:
                msg = (
                    f"value {p['value']:.4g} in {where} at token row {row} overflows the {_dt(store_dtype)} cast for "
                    f"storage ({_dt(store_dtype)} holds |x| < {limit:.6g}; {p['rows']} such rows); store bfloat16"
                )
            else:
                msg = f"NaN/Inf in captured {where} at token row {row} ({p['rows']} bad rows)"
                if source_dtype == torch.float16:
                    msg += ": an fp16 overflow in the target's float16 forward (|x| > 65504); run it in bfloat16"
                elif held_dtype == torch.float16:
                    msg += (
                        f": the states were cast from {_dt(source_dtype)} to float16 for capture, and the float16 cast "
                        "overflows at |x| >= 65520; store bfloat16"
                    )
            found.append({**p, "message": f"sample {sid}: {msg}"})
        z = zero[lo:hi]
        if s.length and bool(z.all()):
            msg = f"sample {sid}: every captured state is exactly 0 ({s.length} rows)"
            p = {"kind": "zero_sample", "sample_id": sid, "row": 0, "rows": s.length, "tensor": "aux_hidden_states"}
            found.append({**p, "where": "all", "message": msg})
        elif bool(z.any()):
            rows = z.any(1)
            row = int(rows.nonzero()[0, 0])
            block = int(z[row].nonzero()[0, 0])
            tensor = "hidden_states" if block == len(names) - 1 else "aux_hidden_states"
            msg = (
                f"sample {sid}: all-zero {names[block]} states at token row {row} ({int(rows.sum())} of {s.length} "
                f"rows have an all-zero layer; rows {_row_list(rows)}...)"
            )
            p = {"kind": "zero_rows", "sample_id": sid, "row": row, "rows": int(rows.sum()), "tensor": tensor}
            found.append({**p, "where": names[block], "message": msg})
        if i in layer_copies:
            c = layer_copies[i]
            a, b = (names[j] for j in c["blocks"])
            msg = (
                f"sample {sid}: {a} and {b} states are equal bit for bit at token row {c['row']} ({c['rows']} of "
                f"{s.length} rows have two equal layers): the capture wrote one layer twice (two hooks on one layer, "
                "or a slot filled from the wrong layer)"
            )
            p = {"kind": "copied_layers", "sample_id": sid, "row": c["row"], "rows": c["rows"]}
            found.append({**p, "tensor": "aux_hidden_states", "where": f"{a} = {b}", "layers": [a, b], "message": msg})
        if i in copies:
            c = copies[i]
            msg = (
                f"sample {sid}: {c['tensor']} at token row {c['row']} equal bit for bit those of sample "
                f"{c['source_sample_id']} at row {c['source_row']}, whose token prefix differs ({c['rows']} such rows; "
                "rows copied from another request?)"
            )
            p = {"kind": "copied_rows", "sample_id": sid, "row": c["row"], "rows": c["rows"], "tensor": c["tensor"]}
            found.append({**p, "where": c["tensor"], **c, "message": msg})
        out.append(found)
    return out


def _dt(dtype: torch.dtype | None) -> str:
    return str(dtype).removeprefix("torch.")


def sample_absmax(stats: RowStats, start: int, length: int) -> list[float]:
    """Max |x| per block (``k + 1`` floats) over the finite values of rows ``[start, start + length)``; 0.0 for
    no rows."""
    a = stats.absmax[start : start + length]
    if a.numel() == 0:
        return [0.0] * int(stats.absmax.shape[1])
    return torch.where(torch.isfinite(a), a, 0.0).amax(0).tolist()
