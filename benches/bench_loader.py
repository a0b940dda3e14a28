"""Training-feed benchmark: collated batches from (a) eagle-io shards, (b) SpecForge-style per-sample ``torch.save``
files read with ``torch.load(mmap=True)``, (c) their gzip-6 variant, on the same real states in one run, cold (files
evicted from the page cache) and warm; and dataset construction time and file opens at 10k and 100k samples.

    /work/venv/bin/python benches/bench_loader.py            # prints, and writes its section of benches/README.md
    /work/venv/bin/python benches/bench_loader.py --quick    # smaller: no 100k construction, one warm repeat

Data for throughput: ``benches/realdata.py``'s cached real SmolLM2 states (``.bench-data/states-N.pt``) when present,
else synthetic bf16 ``torch.randn * scale`` of the same shapes (said so in the output). Each sample is written once
per format under ``.bench-data/loader/`` (kept between runs) and every file is fsynced, so eviction
(``posix_fadvise(DONTNEED)`` on every file) leaves nothing of it in this machine's page cache; residency after
eviction is measured with ``mincore``. Construction is timed in a fresh child process, cold under
``strace -f -e trace=open,openat,openat2`` (opens = those calls naming a path under the data directory), warm without.
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import io
import json
import mmap
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from benchkit import write_section

import eagle_io
from eagle_io.feed import PaddingCollator, ShardDataset

HERE = Path(__file__).resolve().parent
WORK = HERE.parent / ".bench-data" / "loader"
STATES = ("aux_hidden_states", "hidden_states")

# ----------------------------------------------------------------------------------------------- page cache


def evict(paths) -> None:
    """Drops the files' pages from the page cache (clean pages only: every file here was fsynced when written)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def resident_fraction(paths) -> float:
    """Fraction of the files' pages in the page cache (``mincore`` on a read-only shared mapping)."""
    page, total, resident = mmap.PAGESIZE, 0, 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {p}")
            n = (size + page - 1) // page
            vec = (ctypes.c_ubyte * n)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {p}")
            _libc.munmap(addr, size)
            total += n
            resident += sum(v & 1 for v in vec)
        finally:
            os.close(fd)
    return resident / max(total, 1)


def fsync_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# ------------------------------------------------------------------------------------------------- formats


def specforge_bytes(s: dict, gz: bool) -> bytes:
    """SpecForge's per-sample file: ``torch.save`` of input_ids [L] int64, loss_mask [L] int64,
    aux_hidden_state [1, L, 3H], hidden_state [1, L, H] (scripts/prepare_hidden_states.py), optionally gzip-6."""
    buf = io.BytesIO()
    torch.save(
        {
            "input_ids": s["input_ids"],
            "loss_mask": s["loss_mask"].to(torch.int64),
            "aux_hidden_state": s["aux_hidden_states"][None],
            "hidden_state": s["hidden_states"][None],
        },
        buf,
    )
    return gzip.compress(buf.getvalue(), 6) if gz else buf.getvalue()


def specforge_path(root: Path, idx: int, gz: bool) -> Path:
    g = idx // 2000 * 2000
    return root / f"rows_{g}-{g + 2000}" / f"data_{idx}.ckpt{'.gz' if gz else ''}"


def list_local_files(root, suffixes) -> list[str]:
    """SpecForge's listing (``os.walk`` + suffix filter), then sorted by sample index so all formats share ids."""
    out = [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(suffixes)]
    return sorted(out, key=lambda p: int(os.path.basename(p).split("_")[1].split(".")[0]))


def load_specforge(path: str):
    """SpecForge's ``OfflineEagle3Dataset._open_file``: gzip fully inflated, else ``torch.load(mmap=True)``."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=False)
    return torch.load(path, weights_only=False, mmap=True)


class SpecForgeStyleDataset(torch.utils.data.Dataset):
    """Per-sample files -> the same items as ``eagle_io.feed.ShardDataset`` (so both feed the same collator)."""

    def __init__(self, root, gz: bool) -> None:
        self.paths = list_local_files(root, (".ckpt.gz",) if gz else (".ckpt",))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        d = load_specforge(self.paths[i])
        return {
            "input_ids": d["input_ids"],
            "loss_mask": d["loss_mask"],
            "aux_hidden_states": d["aux_hidden_state"][0],
            "hidden_states": d["hidden_state"][0],
            "sample_id": i,
            "dataset_index": 0,
        }


# ---------------------------------------------------------------------------------------------------- data


def load_real(n: int, copies: int) -> tuple[list[dict], str]:
    """Real states from realdata.py's cache (never generated here), else synthetic ones of the same shapes."""
    cache = HERE.parent / ".bench-data" / f"states-{n}.pt"
    if cache.exists() and (HERE / "realdata.py").exists():
        sys.path.insert(0, str(HERE))
        from realdata import load_states

        samples, desc = load_states(n)
    else:
        g = torch.Generator().manual_seed(0)
        H, samples = 576, []
        scale = torch.rand(4 * H, generator=g) * 4 + 0.1  # per-channel scales, like real residual streams
        for _ in range(n):
            L = int(torch.randint(200, 1025, (1,), generator=g))
            x = (torch.randn(L, 4 * H, generator=g) * scale).to(torch.bfloat16)
            samples.append(
                {
                    "input_ids": torch.randint(0, 49152, (L,), generator=g),
                    "loss_mask": (torch.rand(L, generator=g) > 0.4).to(torch.uint8),
                    "aux_hidden_states": x[:, : 3 * H].contiguous(),
                    "hidden_states": x[:, 3 * H :].contiguous(),
                }
            )
        desc = f"SYNTHETIC (no {cache.name}): {n} samples of torch.randn * per-channel scale, H=576, L in 200..1024"
    if copies > 1:
        desc += f"; each sample stored {copies} times under distinct ids ({n * copies} samples)"
    return [samples[i % len(samples)] for i in range(len(samples) * copies)], desc


def native_build() -> str:
    """Identity of the eagle-io build in use: eagle-io data on disk is rewritten when it changes (the SpecForge-style
    files, slow to write, are kept)."""
    so = next(Path(eagle_io.__file__).parent.glob("_native*.so"))
    st = so.stat()
    return f"{eagle_io.__version__} {so.name} {st.st_size} {st.st_mtime_ns}"


def describe_build(start: str) -> str:
    """Which eagle-io build was measured, and whether it changed during the run (other engineers rebuild it)."""
    so = next(Path(eagle_io.__file__).parent.glob("_native*.so"))
    when = lambda ns: time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(int(ns) / 1e9))  # noqa: E731
    git = ["git", "-C", str(HERE.parent)]
    dirty = subprocess.run([*git, "status", "--porcelain", "src"], capture_output=True, text=True).stdout.strip()
    text = f"eagle-io build: `{so.name}` built {when(start.split()[-1])}" + (
        " from a working tree with uncommitted changes under src/" if dirty else ""
    )
    end = native_build()
    if end != start:
        text += f"; rebuilt during the run ({when(end.split()[-1])}): child processes started after that used it"
    return text + "."


def write_eagleio(root: Path, schema, metadata, samples_iter, **kw) -> None:
    """(Re)writes an eagle-io dataset unless ``root/build`` names the build in use."""
    marker = root / "build"
    if marker.exists() and marker.read_text() == native_build():
        return
    shutil.rmtree(root, ignore_errors=True)
    with eagle_io.ShardWriter(root, schema, metadata, threads=2, **kw) as w:
        for batch in samples_iter:
            w.write_batch(batch)
    marker.write_text(native_build())


def prepare_real(samples: list[dict], tag: str) -> dict[str, Path]:
    """Writes the samples in the three formats (reused on later runs; eagle-io's per build); {format: root}."""
    base = WORK / tag
    roots = {"eagle-io": base / "eagleio", "ckpt": base / "ckpt", "ckpt.gz": base / "ckptgz"}
    H = samples[0]["hidden_states"].shape[1]
    names = [t.name for t in eagle_io.eagle3_schema(H)]
    batches = (
        [
            (i, {k: samples[i][k] for k in names}, str(samples[i].get("key", "")))
            for i in range(s, min(s + 8, len(samples)))
        ]
        for s in range(0, len(samples), 8)
    )
    t0 = time.perf_counter()
    write_eagleio(roots["eagle-io"], eagle_io.eagle3_schema(H), {"hidden_size": H}, batches)
    t1 = time.perf_counter()
    if not (base / "done").exists():
        for gz in (False, True):
            shutil.rmtree(roots["ckpt.gz" if gz else "ckpt"], ignore_errors=True)
            for i, s in enumerate(samples):
                fsync_write(specforge_path(roots["ckpt.gz" if gz else "ckpt"], i, gz), specforge_bytes(s, gz))
        (base / "done").touch()
    print(f"data {tag}: eagle-io {t1 - t0:.1f} s, torch.save + gzip-6 {time.perf_counter() - t1:.1f} s", flush=True)
    return roots


def files_of(kind: str, root: Path) -> list[str]:
    if kind == "eagle-io":
        return [str(p) for p in root.rglob("*") if p.is_file()]
    return list_local_files(root, (".ckpt.gz",) if kind == "ckpt.gz" else (".ckpt",))


class ItemByItem(torch.utils.data.Dataset):
    """A ShardDataset without ``__getitems__``: items are decoded one by one, then copied into the batch (the path
    any third-party collate_fn takes)."""

    def __init__(self, ds: ShardDataset) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        return self.ds[i]


def open_dataset(kind: str, root: Path, threads: int):
    if kind == "eagle-io":
        return ShardDataset(root, threads=threads)
    if kind == "eagle-io-items":
        return ItemByItem(ShardDataset(root, threads=threads))
    return SpecForgeStyleDataset(root, kind == "ckpt.gz")


def cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children (DataLoader workers, once shut down)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_pass(ds, batches, workers: int, state_bytes: np.ndarray) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds, samples, bf16 state bytes) to deliver all batches as PaddingCollator batches."""
    loader = torch.utils.data.DataLoader(
        ds,
        batch_sampler=batches,
        collate_fn=PaddingCollator(),
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
    )
    t0, c0 = time.perf_counter(), cpu_seconds()
    n = nbytes = 0
    for b in loader:  # non-persistent workers are shut down (and reaped) when the pass ends
        n += len(b["sample_ids"])
        nbytes += int(state_bytes[b["sample_ids"]].sum())
    return time.perf_counter() - t0, cpu_seconds() - c0, n, nbytes


def throughput(roots, samples, batch_size: int, workers_list, rounds: int, threads: int) -> list[dict]:
    """Per DataLoader worker setting: ``rounds`` rounds, each running every reader once cold then once warm, in
    turn (so that changes in the load of the shared machine hit all readers alike); medians over the rounds."""
    state_bytes = np.array([sum(s[k].nbytes for k in STATES) for s in samples], dtype=np.int64)
    order = np.random.default_rng(0).permutation(len(samples)).tolist()
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    kinds = ("eagle-io", "eagle-io-items", "ckpt", "ckpt.gz")
    rows = []
    for workers in workers_list:
        runs: dict[str, list[dict]] = {k: [] for k in kinds}
        for _ in range(rounds):
            for kind in kinds:
                root = roots[kind.removesuffix("-items")]
                ds = open_dataset(kind, root, threads)
                files = files_of(kind.removesuffix("-items"), root)
                evict(files)
                resident = resident_fraction(files)
                cold, _, n, nbytes = run_pass(ds, batches, workers, state_bytes)
                warm, warm_cpu, _, _ = run_pass(ds, batches, workers, state_bytes)
                disk = sum(os.path.getsize(f) for f in files)
                runs[kind].append(dict(cold=cold, warm=warm, warm_cpu=warm_cpu, n=n, bytes=nbytes, disk=disk))
                runs[kind][-1]["resident"] = resident
                print(
                    f"{kind:14} workers={workers} cold {n / cold:6.1f} samples/s {nbytes / cold / 1e9:.3f} GB/s "
                    f"(resident after eviction {resident:.1%})  warm {n / warm:6.1f} samples/s "
                    f"{nbytes / warm / 1e9:.3f} GB/s ({nbytes / warm_cpu / 1e9:.3f} GB/CPU-s)",
                    flush=True,
                )
        b = runs["ckpt"]
        for kind in kinds:
            rs = runs[kind]
            med = lambda xs: float(np.median(xs))  # noqa: E731
            rows.append(
                dict(
                    kind=kind,
                    workers=workers,
                    rounds=rounds,
                    n=rs[0]["n"],
                    bytes=rs[0]["bytes"],
                    disk=rs[0]["disk"],
                    resident=max(r["resident"] for r in rs),
                    cold=med([r["cold"] for r in rs]),
                    warm=med([r["warm"] for r in rs]),
                    warm_cpu=med([r["warm_cpu"] for r in rs]),
                    x_cold=med([bb["cold"] / r["cold"] for bb, r in zip(b, rs, strict=True)]),
                    x_warm=med([bb["warm"] / r["warm"] for bb, r in zip(b, rs, strict=True)]),
                    x_cpu=med([bb["warm_cpu"] / r["warm_cpu"] for bb, r in zip(b, rs, strict=True)]),
                    x_cold_range=(
                        min(bb["cold"] / r["cold"] for bb, r in zip(b, rs, strict=True)),
                        max(bb["cold"] / r["cold"] for bb, r in zip(b, rs, strict=True)),
                    ),
                )
            )
    return rows


# ------------------------------------------------------------------------------------------- construction

CONSTRUCT_H = 8


def prepare_construction(n: int, with_gz: bool) -> dict[str, Path]:
    """Tiny synthetic samples (L = 4..19 tokens, H = 8): eagle-io in 4 MiB shards, and SpecForge-style files."""
    base = WORK / f"construct-{n}"
    roots = {"eagle-io": base / "eagleio", "ckpt": base / "ckpt"}
    if with_gz:
        roots["ckpt.gz"] = base / "ckptgz"
    t0 = time.perf_counter()
    H = CONSTRUCT_H
    g = torch.Generator().manual_seed(0)
    templates = {}
    for L in range(4, 20):
        templates[L] = {
            "input_ids": torch.arange(L, dtype=torch.int64),
            "loss_mask": torch.ones(L, dtype=torch.uint8),
            "aux_hidden_states": torch.randn(L, 3 * H, generator=g).to(torch.bfloat16),
            "hidden_states": torch.randn(L, H, generator=g).to(torch.bfloat16),
        }
    length = [4 + (i * 7) % 16 for i in range(n)]
    batches = ([(i, templates[length[i]], "") for i in range(s, min(n, s + 2000))] for s in range(0, n, 2000))
    write_eagleio(roots["eagle-io"], eagle_io.eagle3_schema(H), {}, batches, shard_bytes=4 << 20)
    blobs = {(L, gz): specforge_bytes(t, gz) for L, t in templates.items() for gz in (False, True)}
    for gz in (False, True) if with_gz else (False,):
        root = roots["ckpt.gz" if gz else "ckpt"]
        if (root / "done").exists():
            continue
        shutil.rmtree(root, ignore_errors=True)
        for i in range(n):
            p = specforge_path(root, i, gz)
            if i % 2000 == 0:
                p.parent.mkdir(parents=True, exist_ok=True)
            with open(p, "wb") as f:
                f.write(blobs[length[i], gz])
        (root / "done").touch()
    os.sync()  # clean pages, so that eviction works
    print(f"construction data ({n} samples): {time.perf_counter() - t0:.1f} s", flush=True)
    return roots


def construct(kind: str, root: str) -> dict:
    """Child process: builds a length-aware dataset (or only lists files) and times it."""
    t0 = time.perf_counter()
    if kind == "eagle-io":
        ds = ShardDataset(root)
        lengths = ds.lengths()
        n, extra = len(ds), {"shards": sum(len(d.manifest["shards"]) for d in ds.datasets)}
    elif kind.endswith("-list"):
        paths = list_local_files(root, (".ckpt.gz",) if kind.startswith("ckpt.gz") else (".ckpt",))
        n, lengths, extra = len(paths), None, {}
    else:  # SpecForge's offline length indexing: load every file once (specforge/data/offline_lengths.py)
        paths = list_local_files(root, (".ckpt.gz",) if kind.startswith("ckpt.gz") else (".ckpt",))
        lengths = [int(load_specforge(p)["input_ids"].shape[-1]) for p in paths]
        n, extra = len(paths), {}
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "n": n, "tokens": sum(lengths) if lengths else None, **extra}


def run_child(kind: str, root: Path, strace_log: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, str(root)]
    if strace_log is not None:
        trace = ["strace", "-f", "-qq", "--seccomp-bpf", "-s", "4096", "-e", "trace=open,openat,openat2"]
        cmd = [*trace, "-o", str(strace_log), *cmd]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def count_opens(log: Path, root: Path) -> int:
    prefix = f'"{root}'
    with open(log) as f:
        return sum(1 for line in f if prefix in line)


def construction(sizes, with_gz_at, use_strace: bool, full_lengths: bool) -> list[dict]:
    """Per size and reader: a cold run (files evicted first; under strace when available, which counts the opens
    in that same run) and a warm run without strace. Per-file loads above 10k samples (minutes) run only with
    ``full_lengths``, and then cold only."""
    rows = []
    for n in sizes:
        roots = prepare_construction(n, with_gz=n in with_gz_at)
        kinds = [("eagle-io", roots["eagle-io"]), ("ckpt-list", roots["ckpt"])]
        if n <= 10_000 or full_lengths:
            kinds.append(("ckpt-lengths", roots["ckpt"]))
        if "ckpt.gz" in roots:
            kinds.append(("ckpt.gz-lengths", roots["ckpt.gz"]))
        for kind, root in kinds:
            evict(files_of("eagle-io" if kind == "eagle-io" else kind.rsplit("-", 1)[0], root))
            log = WORK / "strace.log" if use_strace else None
            cold = run_child(kind, root, log)
            opens = count_opens(log, root) if log else None
            if log:
                log.unlink()
            warm = run_child(kind, root) if n <= 10_000 or not kind.endswith("-lengths") else None
            row = dict(n=n, kind=kind, cold=cold["seconds"], warm=warm and warm["seconds"], opens=opens)
            row["shards"] = cold.get("shards")
            rows.append(row)
            print(
                f"construct {kind:16} n={n:6} cold {cold['seconds']:7.3f} s  warm "
                f"{'-' if warm is None else format(warm['seconds'], '.3f')} s  opens {opens}  "
                f"{'shards ' + str(row['shards']) if row['shards'] else ''}",
                flush=True,
            )
    return rows


# ---------------------------------------------------------------------------------------------------- report

NAMES = {
    "eagle-io": "(a) eagle-io `ShardDataset` (decoded straight into the batch)",
    "eagle-io-items": "(a) eagle-io, item by item (any collate_fn's path)",
    "ckpt": "(b) SpecForge `.ckpt`, `torch.load(mmap=True)`",
    "ckpt.gz": "(c) SpecForge `.ckpt.gz` (gzip-6)",
}
CNAMES = {
    "eagle-io": "(a) eagle-io `ShardDataset` + `lengths()`",
    "ckpt-list": "(b) SpecForge listing only (`os.walk`; no lengths)",
    "ckpt-lengths": "(b) SpecForge listing + lengths (`torch.load(mmap=True)` per file)",
    "ckpt.gz-lengths": "(c) SpecForge `.ckpt.gz` listing + lengths (gunzip per file)",
}


def render(rows, crows) -> str:
    out = [
        "| reader | workers | cold samples/s | cold GB/s | cold x (b) (range) | warm samples/s | warm GB/s "
        "| warm x (b) | warm GB/CPU-s | x (b) | on disk GB | resident after eviction |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["x_cold_range"]
        out.append(
            f"| {NAMES[r['kind']]} | {r['workers']} | {r['n'] / r['cold']:.1f} | {r['bytes'] / r['cold'] / 1e9:.3f} | "
            f"{r['x_cold']:.2f} ({lo:.2f}-{hi:.2f}) | {r['n'] / r['warm']:.1f} | {r['bytes'] / r['warm'] / 1e9:.3f} | "
            f"{r['x_warm']:.2f} | {r['bytes'] / r['warm_cpu'] / 1e9:.3f} | {r['x_cpu']:.2f} | {r['disk'] / 1e9:.3f} | "
            f"{r['resident']:.1%} |"
        )
    if crows:
        out += ["", "| construction | samples | cold s | warm s | file opens |", "|---|---|---|---|---|"]
        for r in crows:
            opens = "n/a" if r["opens"] is None else str(r["opens"])
            if r["shards"]:
                opens += f" ({r['shards']} shards)"
            warm = "(not run)" if r["warm"] is None else f"{r['warm']:.3f}"
            out.append(f"| {CNAMES[r['kind']]} | {r['n']} | {r['cold']:.3f} | {warm} | {opens} |")
    return "\n".join(out) + "\n"


def verdict(rows, crows) -> str:
    """The issue's targets against this run's figures (medians; a (a)/(b) "x" below 1 means eagle-io was slower)."""
    out = ["Against the targets of issue 4 (this run):", ""]
    for r in (r for r in rows if r["kind"] == "eagle-io"):
        c = next(x for x in rows if x["kind"] == "ckpt.gz" and x["workers"] == r["workers"])
        x_c_cold, x_c_warm = c["cold"] / r["cold"], c["warm"] / r["warm"]
        out.append(
            f"- workers={r['workers']}: cold >= 3x (b): {r['x_cold']:.2f}x, "
            f"{'met' if r['x_cold'] >= 3 else 'NOT met'}; >= 50x (c): {x_c_cold:.1f}x cold, {x_c_warm:.1f}x warm, "
            f"{'met' if min(x_c_cold, x_c_warm) >= 50 else 'NOT met'}."
        )
    for r in (r for r in crows if r["kind"] == "eagle-io"):
        ok = r["cold"] < 1 and r["opens"] is not None and r["opens"] <= 2 * (r["shards"] or 0) + 2
        out.append(
            f"- construction at {r['n']}: {r['cold']:.3f} s cold with {r['opens']} opens for {r['shards']} shards "
            f"(< 1 s, O(shards)): {'met' if ok else 'NOT met'}."
        )
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=44, help="real conversations (realdata.py's cache states-N.pt)")
    ap.add_argument("--copies", type=int, default=1, help="store each real sample this many times (distinct ids)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--workers", default="0,2", help="DataLoader num_workers settings, comma-separated")
    ap.add_argument("--threads", type=int, default=1, help="eagle-io decode threads per process")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (cold, warm) passes per reader; medians")
    ap.add_argument("--sizes", default="10000,100000", help="construction sizes")
    ap.add_argument("--full-lengths", action="store_true", help="also per-file length loads above 10k (minutes)")
    ap.add_argument("--quick", action="store_true", help="--sizes 10000 --rounds 1 --workers 0")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(construct(*args.child)))
        return
    if args.quick:
        args.sizes, args.rounds, args.workers = "10000", 1, "0"
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    build0 = native_build()
    samples, desc = load_real(args.n, args.copies)
    tokens = sum(s["input_ids"].shape[0] for s in samples)
    state_gb = sum(s[k].nbytes for s in samples for k in STATES) / 1e9
    roots = prepare_real(samples, f"real-{args.n}x{args.copies}" + ("" if "SYNTHETIC" not in desc else "-syn"))
    workers = [int(w) for w in args.workers.split(",")]
    rows = throughput(roots, samples, args.batch_size, workers, args.rounds, args.threads)
    use_strace = shutil.which("strace") is not None
    sizes = [int(s) for s in args.sizes.split(",") if s]
    crows = construction(sizes, with_gz_at=sizes[:1], use_strace=use_strace, full_lengths=args.full_lengths)
    table = render(rows, crows) + "\n" + verdict(rows, crows)
    print(table)
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    head = subprocess.run(["git", "-C", str(HERE.parent), "log", "-1", "--format=%h"], capture_output=True, text=True)
    cmd = " ".join(["/work/venv/bin/python", "benches/bench_loader.py", *sys.argv[1:]])
    body = (
        f"Command: `cd /work/main && {cmd}` (run {time.strftime('%Y-%m-%d %H:%M %Z')}, HEAD {head.stdout.strip()}, "
        f"{time.perf_counter() - t_start:.0f} s wall)\n\n"
        f"Machine: {os.cpu_count()} cores ({cpu}), ext4 on a virtio disk, shared with other engineers' jobs (load "
        f"average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at the end). {describe_build(build0)}\n\n"
        f"Data (throughput): {desc}; {len(samples)} samples, {tokens} tokens, {state_gb:.3f} GB of bf16 states. "
        f"Batches of {args.batch_size} samples in one fixed shuffled order, the same for every reader, collated by "
        f"`eagle_io.feed.PaddingCollator`; eagle-io `threads={args.threads}` per process.\n\n{table}\n{NOTES}"
    )
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "results.json").write_text(json.dumps({"rows": rows, "construction": crows, "readme": body}, indent=1))
    if not args.no_readme:
        write_section("bench_loader", "## Training feed: loader throughput and construction (bench_loader.py)", body)


NOTES = """\
- samples/s and GB/s: samples, and GB (1e9 bytes) of bf16 states (aux + final, unpadded), delivered as collated
  batches per second of wall time over one full pass. Each figure is the median over `--rounds` rounds; a round
  runs every reader once cold then once warm, reader after reader; "x (b)" = (b)'s time / this reader's time,
  taken within each round (range = lowest-highest round). GB/CPU-s: the same bytes per CPU-second of the main
  process and its DataLoader workers (user + system, `getrusage`) in the warm pass: the per-core cost, much less
  sensitive than wall time to the other jobs on the shared cores.
- Cold = right after `posix_fadvise(DONTNEED)` on every file of that reader (all written with fsync, so the pages
  are clean and dropped; "resident after eviction" is `mincore`'s count just before the pass, the highest over the
  rounds); warm = the pass right after it. The virtio disk may itself be cached by the host: "cold" means not in
  this machine's page cache. Directory entries and inodes stay cached (dropping them needs `drop_caches`).
- (a) "decoded straight into the batch" is the default DataLoader path (`ShardDataset.__getitems__` + an eagle-io
  collator: `read_into` rows of the batch tensors); "item by item" is what any other collate_fn gets (a tensor per
  sample, then copied). (b)/(c) read exactly as SpecForge's `OfflineEagle3Dataset._open_file` (v0.2.0):
  `torch.load(path, weights_only=False, mmap=True)`, or gunzip of the whole file then `torch.load`; the item is the
  same dict eagle-io yields and the same collator copies it into the batch (which is where mmap'd pages are read).
  SpecForge's own `process_data` adds a `torch.cat` copy of the target per sample, not counted here.
- Where the time goes: an eagle-io read costs CPU to decode (zstd of the high byte plane, plane interleave, CRC-32;
  see bench_codec), while (b) costs a copy of mmap'd pages, read on a cold pass from a virtio disk that the host
  may serve from its own cache. With 2 cores shared by several jobs each process gets a fraction of a core, so
  decode CPU, not the disk, bounds (a): compare the GB/CPU-s columns, less sensitive than wall time to the load. The
  1.42x smaller files pay off where the disk is the limit (network or busy storage, data larger than RAM), not
  here. (c) is bound by gunzip.
- Construction: a fresh process builds the dataset a trainer needs before step 1, timed from the first call to the
  last (imports excluded); cold = after evicting every data file (manifest, shards / every `.ckpt`), and run under
  `strace -f --seccomp-bpf -e trace=open,openat,openat2` (only those calls stop, a few us each) to count the opens
  in the same run; warm = run again at once without strace. Per-file length loads run at 100k only with
  `--full-lengths` (minutes; cold only). (a) is `ShardDataset(root)` + `lengths()` (manifest + shard indexes).
  (b) listing only is SpecForge's `list_local_files` (enough for random batches, not for length grouping);
  (b)/(c) + lengths is what SpecForge's length bucketing does for feature files without length metadata
  (`specforge/data/offline_lengths.py`: load every file once, then cache the lengths for later runs). Samples are
  tiny (4-19 tokens, H = 8) so that file-system work dominates. File opens = `open`/`openat`/`openat2` calls naming
  a path under the data directory (directories included).
"""

if __name__ == "__main__":
    main()
