"""Modelling the bf16 high byte plane beyond order 0, on real states, chunked as the Rust writer does (1 MiB of
decoded bytes per chunk, whole rows). Prototype only: transforms in numpy, zstd through ctypes on the system libzstd
(python `zstandard` does not expose ZSTD_c_literalCompressionMode). Prints markdown tables and writes them to
benches/README.md under their own heading.

    .venv/bin/python benches/explore_codec.py [-n 44]
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np
import torch
from benchkit import write_section
from realdata import load_states

STATES = ("aux_hidden_states", "hidden_states")
CHUNK_BYTES = 1 << 20
LIB = ctypes.CDLL("libzstd.so.1")
_BUF = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
LIB.ZSTD_compress2.argtypes = LIB.ZSTD_decompressDCtx.argtypes = _BUF
LIB.ZSTD_CCtx_setParameter.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
LIB.ZSTD_compress2.restype = LIB.ZSTD_decompressDCtx.restype = LIB.ZSTD_CCtx_setParameter.restype = ctypes.c_size_t
LIB.ZSTD_createCCtx.restype = LIB.ZSTD_createDCtx.restype = ctypes.c_void_p
LIB.ZSTD_isError.argtypes = [ctypes.c_size_t]
ZSTD_C_LEVEL, ZSTD_C_MIN_MATCH, ZSTD_C_LITERAL_MODE, ZSTD_PS_ENABLE = 100, 105, 1002, 1


class Zstd:
    """One compression and one decompression context with fixed parameters (as the Rust per-thread contexts)."""

    def __init__(self, level: int, huffman: bool = False, min_match: int = 0):
        self.c, self.d = LIB.ZSTD_createCCtx(), LIB.ZSTD_createDCtx()
        self._set(ZSTD_C_LEVEL, level)
        if huffman:
            self._set(ZSTD_C_LITERAL_MODE, ZSTD_PS_ENABLE)
        if min_match:
            self._set(ZSTD_C_MIN_MATCH, min_match)
        self.buf = np.empty(2 * CHUNK_BYTES + 4096, np.uint8)

    def _set(self, p: int, v: int) -> None:
        if LIB.ZSTD_isError(LIB.ZSTD_CCtx_setParameter(self.c, p, v)):
            raise ValueError(f"zstd parameter {p}={v} rejected")

    def compress(self, a: np.ndarray) -> bytes:
        n = LIB.ZSTD_compress2(self.c, self.buf.ctypes.data, self.buf.size, a.ctypes.data, a.nbytes)
        assert not LIB.ZSTD_isError(n)
        return self.buf[:n].tobytes()

    def decompress(self, frame: bytes, out: np.ndarray) -> None:
        n = LIB.ZSTD_decompressDCtx(self.d, out.ctypes.data, out.nbytes, frame, len(frame))
        assert n == out.nbytes, n


def pays(stored: int, raw: int) -> bool:
    return stored + raw // 32 < raw


def chunks(samples):
    """(tensor name, uint16 [rows, W]) per chunk, as the writer cuts them."""
    for s in samples:
        for k in STATES:
            u = s[k].view(torch.int16).numpy().view(np.uint16)
            step = max(1, CHUNK_BYTES // (2 * u.shape[1]))
            for r in range(0, len(u), step):
                yield k, u[r : r + step]


# ---- entropies -----------------------------------------------------------------------------------------------
def entropy(counts: np.ndarray) -> float:
    """Plug-in entropy in bits per symbol of a count vector (or of rows of counts, summed)."""
    c = counts[counts > 0].astype(np.float64)
    n = c.sum()
    return float(-(c * np.log2(c / n)).sum() / n) if n else 0.0


def cond_entropy(x: np.ndarray, nbins: int) -> float:
    """H(x | channel) for x [rows, W]: per-channel histograms, in blocks of channels to bound memory."""
    total, rows, w = 0.0, *x.shape
    for c0 in range(0, w, 64):
        blk = x[:, c0 : c0 + 64].astype(np.int64)
        nb = blk.shape[1]
        h = np.bincount((blk + np.arange(nb) * nbins).ravel(), minlength=nb * nbins).reshape(nb, nbins)
        total += sum(entropy(h[j]) for j in range(nb)) * rows
    return total / (rows * w)


def entropy_table(full: dict[str, np.ndarray]) -> str:
    out = [
        "| tensor | symbol | H0 bits | H given channel | bound ratio (order 0 / per channel) |",
        "|---|---|---|---|---|",
    ]
    for k, u in full.items():
        syms = {
            "bf16 value (16 bit)": (u, 65536, 16),
            "high byte (sign + 7 exp bits)": (u >> 8, 256, 8),
            "low byte (exp lsb + 7 mantissa)": (u & 0xFF, 256, 8),
            "exponent (8 bits)": ((u >> 7) & 0xFF, 256, 8),
        }
        for name, (x, nb, bits) in syms.items():
            h0, hc = entropy(np.bincount(x.ravel(), minlength=nb)), cond_entropy(x, nb)
            out.append(f"| {k} | {name} | {h0:.3f} | {hc:.3f} | {bits / h0:.3f} / {bits / hc:.3f} |")
    return "\n".join(out) + "\n"


# ---- high-plane models: uint16 chunk [rows, W] -> (segments to zstd, one frame each; the byte plane stored raw) -----
def modes(x: np.ndarray, step: int = 1) -> np.ndarray:
    """Most frequent byte of each channel of x [rows, W], counted over every ``step``-th row."""
    x = x[::step]
    w = x.shape[1]
    h = np.bincount((x.astype(np.int32) + np.arange(w, dtype=np.int32) * 256).ravel(), minlength=w * 256)
    return h.reshape(w, 256).argmax(1).astype(np.uint8)


def planes(u):
    return (u >> 8).astype(np.uint8), (u & 0xFF).astype(np.uint8)


def exp_planes(u):
    """Exponent byte (modelled) and sign + 7 mantissa bits (the raw byte)."""
    return ((u >> 7) & 0xFF).astype(np.uint8), (((u >> 8) & 0x80) | (u & 0x7F)).astype(np.uint8)


def groups(m, x, g):
    """Channel-major rows of x cut into frames of ``g`` channels; the modes m (if any) lead the first frame."""
    t = np.ascontiguousarray(x.T)
    segs = [t[i : i + g].ravel() for i in range(0, len(t), g)]
    return [np.concatenate([m, segs[0]]), *segs[1:]] if m is not None else segs


def model(kind: str = "", step: int = 1, col: bool = False, group: int = 0, split=planes):
    """A high-plane model: ``kind`` "" (none) | xor | sub (per-channel mode, counted over every ``step``-th row) |
    prev (XOR previous token); ``col``: channel-major; ``group``: channel-major, one frame per ``group`` channels.
    The modes travel at the head of the (first) frame."""

    def f(u):
        hi, lo = split(u)
        if kind == "prev":
            d = hi.copy()
            d[1:] ^= hi[:-1]
            return [d.ravel()], lo
        m = modes(hi, step) if kind in ("xor", "sub") else None
        x = hi ^ m if kind == "xor" else hi - m if kind == "sub" else hi
        if group:
            return groups(m, x, group), lo
        x = np.ascontiguousarray(x.T) if col else x
        return [x.ravel() if m is None else np.concatenate([m, x.ravel()])], lo

    f.split = split.__name__
    return f


ROW, COL = "row-major high plane (format v1)", "channel-major high plane (transpose)"
SUB8 = "subtract per-channel mode of every 8th row"
COLSUB8 = "channel-major + subtract mode of every 8th row"
MODELS = {
    ROW: model(),
    COL: model(col=True),
    "channel-major, one frame per 64 channels": model(group=64),
    "XOR per-channel mode": model("xor"),
    "subtract per-channel mode (all rows)": model("sub"),
    SUB8: model("sub", step=8),
    COLSUB8: model("sub", step=8, col=True),
    "channel-major + subtract mode (all rows)": model("sub", col=True),
    "XOR previous token": model("prev"),
    "exponent byte modelled, sign+mantissa byte raw": model(split=exp_planes),
    "exponent byte, channel-major": model(col=True, split=exp_planes),
    "exponent byte - mode (every 8th row)": model("sub", step=8, split=exp_planes),
    "exponent byte - mode (every 8th row), channel-major": model("sub", step=8, col=True, split=exp_planes),
}


def check_inverse(chunk_list, z):
    """The channel-major + mode-subtraction model decodes back to the high plane (a few chunks)."""
    for _, u in chunk_list[:: max(1, len(chunk_list) // 8)]:
        (seg,), _ = MODELS[COLSUB8](u)
        out = np.empty(seg.nbytes, np.uint8)
        z.decompress(z.compress(seg), out)
        rows, w = u.shape
        hi = out[w:].reshape(w, rows).T + out[:w]
        assert np.array_equal(hi, (u >> 8).astype(np.uint8)), "model does not invert"


def best_cpu(fn, repeat):
    """(least CPU seconds of this thread over ``repeat`` calls, last result): robust to a shared machine."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.thread_time()
        out = fn()
        best = min(best, time.thread_time() - t0)
    return best, out


def run(chunk_list, fn, z: Zstd, low_sizes: dict, repeat: int = 3):
    """Stored bytes per tensor and CPU seconds: model (numpy), zstd of the segments, their decompression."""
    t0 = time.thread_time()
    modelled = [(k, fn(u), u.nbytes) for k, u in chunk_list]
    t_model = time.thread_time() - t0
    segs = [s for _, (ss, _), _ in modelled for s in ss]
    t_c, frames = best_cpu(lambda: [z.compress(s) for s in segs], repeat)
    outs = [np.empty(s.nbytes, np.uint8) for s in segs]
    t_d, _ = best_cpu(lambda: [z.decompress(f, o) for f, o in zip(frames, outs, strict=True)], repeat)
    key = fn.split
    if key not in low_sizes:  # the raw-ish byte plane: zstd-1 when it pays, else raw (the writer's rule)
        low = Zstd(1)
        low_sizes[key] = [min(len(low.compress(lo)), lo.nbytes) if lo.nbytes else 0 for _, (_, lo), _ in modelled]
    stored, raw, it = dict.fromkeys(STATES, 0), dict.fromkeys(STATES, 0), iter(frames)
    for (k, (ss, lo), nbytes), lz in zip(modelled, low_sizes[key], strict=True):
        hz, hraw = sum(len(next(it)) for _ in ss), sum(s.nbytes for s in ss)
        stored[k] += (hz if pays(hz, hraw) else hraw) + (lz if pays(lz, lo.nbytes) else lo.nbytes)
        raw[k] += nbytes
    return stored, raw, t_model, t_c, t_d


def line(name, res, total_raw):
    stored, raw, t_model, t_c, t_d = res
    r = {k: raw[k] / stored[k] for k in STATES}
    mb, tot = total_raw / 1e6, total_raw / sum(stored.values())
    return (
        f"| {name} | {r['aux_hidden_states']:.3f} | {r['hidden_states']:.3f} | **{tot:.3f}**"
        f" | {mb / t_c:.0f} | {mb / t_d:.0f} | {mb / t_model:.0f} |"
    )


HEAD = (
    "| {what} | ratio aux | ratio final | ratio total | zstd enc MB/CPU-s | zstd dec MB/CPU-s | numpy model MB/CPU-s"
    " |\n"
    "|---|---|---|---|---|---|---|"
)
CURRENT, HUF = (1, False), (-1000, True)
SETTINGS = [(3, False), (2, False), CURRENT, (-1, False), (-5, False), (1, True), (-5, True), (-20, True), (-100, True)]
SETTINGS += [HUF, (-131072, True)]


def setting(lvl, huf):
    return f"level {lvl}" + (" + Huffman literals forced" if huf else "")


def table(rows, what, print_=print):
    lines = [HEAD.format(what=what)]
    for name, res, total_raw in rows:
        lines.append(line(name, res, total_raw))
        print_(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=44)
    args = ap.parse_args()
    t_start = time.perf_counter()
    samples, desc = load_states(args.n)
    chunk_list = list(chunks(samples))
    total = sum(u.nbytes for _, u in chunk_list)
    full = {k: np.concatenate([s[k].view(torch.int16).numpy().view(np.uint16) for s in samples]) for k in STATES}
    ent = entropy_table(full)
    del full
    print(ent, flush=True)
    low: dict = {}
    check_inverse(chunk_list, Zstd(*HUF))

    def rows_for(items):
        for name, fn, (lvl, huf) in items:
            yield name, run(chunk_list, fn, Zstd(lvl, huf), low), total

    models = {
        s: table(rows_for((n, f, s) for n, f in MODELS.items()), f"high-plane model, {setting(*s)}")
        for s in (CURRENT, HUF)
    }
    settings = table(
        rows_for((f"{n.split(' (')[0]}, {setting(*s)}", MODELS[n], s) for n in (ROW, COL, COLSUB8) for s in SETTINGS),
        "model, zstd setting",
    )
    body = (
        f"Command: `.venv/bin/python benches/explore_codec.py -n {args.n}` "
        f"(run {time.strftime('%Y-%m-%d %H:%M %Z')}, {time.perf_counter() - t_start:.0f} s wall; 2 cores shared with "
        f"other jobs). Data: {desc}; {len(chunk_list)} chunks of <= 1 MiB.\n\n"
        f"### Entropies (whole data set, plug-in estimates, bits per element)\n\n{ent}\n"
        f"### High-plane models at {setting(*CURRENT)} (the committed v1 writer's setting)\n\n{models[CURRENT]}\n"
        f"### High-plane models at {setting(*HUF)}\n\n{models[HUF]}\n"
        f"### zstd settings\n\n{settings}\n{EXPLAIN}"
    )
    write_section("explore_codec", "## Beyond order 0: modelling the high byte plane (explore_codec.py)", body)


EXPLAIN = """\
Columns: ratio = bf16 bytes / stored bytes (modelled plane zstd-compressed, kept only when it saves >= 1/32, else
raw; the other byte plane zstd-1 under the same rule, i.e. raw in practice; the per-channel modes (W bytes per
chunk) travel at the head of the compressed plane and are counted; chunk descriptors and record headers are not).
Speeds are MB of raw bf16 bytes (both planes) per CPU-second of this thread (`time.thread_time`, least of 3 runs,
so other jobs on the shared cores do not count) spent in the zstd calls on the modelled plane alone (system libzstd
1.5.4 through ctypes): an upper bound for a one-core Rust encode, which also splits the planes, computes the model
and copies the raw plane. "numpy model" is the Python prototype's transform speed, not what Rust would do.
"""


if __name__ == "__main__":
    main()
