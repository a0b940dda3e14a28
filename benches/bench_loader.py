"""Training-feed benchmark, honest baselines: collated batches of the same real states from (a) eagle-io shards and
(b) SpecForge's per-sample ``.ckpt`` files read with ``torch.load(mmap=True)``, under the settings users run: in
process with torch at 1 intra-op thread (as DataLoader workers run) and at torch's default, ``DataLoader(workers=2,
persistent_workers=True)`` with the CPU of every process counted, and eagle-io's threaded ``Loader``; eagle-io's
decode alone (``Dataset.read_into`` into reused and into fresh buffers) and the entropy coder alone (``cargo bench
--bench codec``: zstd on the very planes the codec hands it) as the ceilings; warm and cold; then dataset
construction time and file opens at 10k and 100k samples.

    .venv/bin/python benches/bench_loader.py            # prints, and writes its section of benches/README.md
    .venv/bin/python benches/bench_loader.py --dataset runs/smollm2-sharegpt --limit 60   # the main job's data
    .venv/bin/python benches/bench_loader.py --quick    # smaller: no 100k construction, one round
    .venv/bin/python benches/bench_loader.py --smoke    # tiny synthetic data, every row once (CI)

Data for throughput: ``--dataset DIR`` (an eagle-io dataset, e.g. the main job's; its SpecForge files written by
``eagle_io.interop.specforge.export_specforge``), else ``benches/realdata.py``'s cached real SmolLM2 states
(``.bench-data/states-N.pt``) written in both formats, else synthetic bf16 ``torch.randn * scale`` of the same
shapes (said so in the output). Files are kept under ``.bench-data/loader/`` between runs, every one fsynced, so
eviction (``posix_fadvise(DONTNEED)`` per file, :func:`peers.evict`) leaves nothing of it in this machine's page
cache; residency after eviction is measured with ``mincore``. Construction is timed in a fresh child process, cold
under ``strace -f -e trace=open,openat,openat2`` (opens = those calls naming a path under the data directory), warm
without.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from benchkit import write_section
from peers import (
    AllProcesses,
    SpecForgeStyleDataset,
    evict,
    fsync_write,
    list_local_files,
    load_specforge,
    resident_fraction,
    specforge_bytes,
    specforge_path,
)

import eagle_io
from eagle_io.feed import Loader, PaddingCollator, ShardDataset
from eagle_io.interop.specforge import export_specforge
from eagle_io.interop.specforge import specforge_path as exported_path

HERE = Path(__file__).resolve().parent
WORK = HERE.parent / ".bench-data" / "loader"
STATES = ("aux_hidden_states", "hidden_states")

# ---------------------------------------------------------------------------------------------------- data


def synthetic(n: int, H: int, lo: int, hi: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    scale = torch.rand(4 * H, generator=g) * 4 + 0.1  # per-channel scales, like real residual streams
    samples = []
    for _ in range(n):
        L = int(torch.randint(lo, hi + 1, (1,), generator=g))
        x = (torch.randn(L, 4 * H, generator=g) * scale).to(torch.bfloat16)
        samples.append(
            {
                "input_ids": torch.randint(0, 49152, (L,), generator=g),
                "loss_mask": (torch.rand(L, generator=g) > 0.4).to(torch.uint8),
                "aux_hidden_states": x[:, : 3 * H].contiguous(),
                "hidden_states": x[:, 3 * H :].contiguous(),
            }
        )
    return samples


def load_real(n: int, copies: int) -> tuple[list[dict], str]:
    """Real states from realdata.py's cache (never generated here), else synthetic ones of the same shapes."""
    cache = HERE.parent / ".bench-data" / f"states-{n}.pt"
    if cache.exists() and (HERE / "realdata.py").exists():
        sys.path.insert(0, str(HERE))
        from realdata import load_states

        samples, desc = load_states(n)
    else:
        samples = synthetic(n, 576, 200, 1024)
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


@dataclass
class Data:
    """One data set in both formats: the eagle-io dataset, the SpecForge file of each of its items (in item order),
    the items' token counts, and the bf16 state bytes per token (aux + final)."""

    eagleio: Path
    ckpt: list[str]
    lengths: list[int]
    token_bytes: int
    desc: str


def prepare_samples(samples: list[dict], tag: str, desc: str) -> Data:
    """Writes in-memory samples in both formats (reused on later runs; eagle-io's rewritten per build)."""
    base = WORK / tag
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
    write_eagleio(base / "eagleio", eagle_io.eagle3_schema(H), {"hidden_size": H}, batches)
    t1 = time.perf_counter()
    if not (base / "done").exists():
        shutil.rmtree(base / "ckpt", ignore_errors=True)
        for i, s in enumerate(samples):
            fsync_write(specforge_path(base / "ckpt", i, False), specforge_bytes(s, False))
        (base / "done").touch()
    print(f"data {tag}: eagle-io {t1 - t0:.1f} s, torch.save {time.perf_counter() - t1:.1f} s", flush=True)
    lengths = [int(s["input_ids"].shape[0]) for s in samples]
    paths = [str(specforge_path(base / "ckpt", i, False)) for i in range(len(samples))]
    return Data(base / "eagleio", paths, lengths, 2 * 4 * H, desc)


def prepare_dataset(path: str, limit: int | None) -> Data:
    """An existing eagle-io dataset (its first ``limit`` samples: a copy of them under .bench-data, so that eviction
    and the build marker touch only bench files), and its SpecForge files by ``export_specforge``."""
    src = eagle_io.Dataset(path)
    n = len(src) if limit is None else min(limit, len(src))
    base = WORK / f"dataset-{Path(path).name}-{n}"
    H = src.metadata.get("hidden_size") or next(s.width for s in src.schema if s.name == "hidden_states")
    rows = ((src.entry(p).sample_id, {k: v for k, v in src.read(p).items() if k != "sample_id"}, src.entry(p).key)
            for p in range(n))  # fmt: skip
    t0 = time.perf_counter()
    write_eagleio(base / "eagleio", src.schema, src.metadata, ([r] for r in rows))
    t1 = time.perf_counter()
    ds = eagle_io.Dataset(base / "eagleio")
    if not (base / "done").exists():
        shutil.rmtree(base / "ckpt", ignore_errors=True)
        export_specforge(ds, base / "ckpt")  # each file written atomically and fsynced
        (base / "done").touch()
    print(f"data {base.name}: eagle-io {t1 - t0:.1f} s, export-specforge {time.perf_counter() - t1:.1f} s", flush=True)
    ids = [ds.entry(p).sample_id for p in range(len(ds))]
    tokens, mb = sum(ds.lengths()), sum(ds.lengths()) * 8 * H / 1e6
    target = src.metadata.get("target_model", "?")
    target = target.get("model_id", "?") if isinstance(target, dict) else target
    desc = f"the first {n} samples of {path} ({target}), {tokens} tokens, {mb:.1f} MB of bf16 aux + final states"
    return Data(base / "eagleio", [exported_path(base / "ckpt", i) for i in ids], ds.lengths(), 8 * H, desc)


def eagleio_files(root: Path) -> list[str]:
    """The dataset's files (manifest, shards), not the bench's build marker."""
    return [str(p) for p in root.rglob("*") if p.is_file() and p.name != "build"]


# ----------------------------------------------------------------------------------------------- throughput


class Batches:
    """A batch sampler whose batch list can be swapped (a persistent-worker DataLoader's warm-up pass)."""

    def __init__(self, batches: list[list[int]]) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


@dataclass(frozen=True)
class Row:
    """One way to get the batches: ``path`` (what runs), ``fmt`` (which files), ``settings`` (say so in the table)."""

    key: str
    fmt: str
    path: str
    settings: str
    torch_threads: int = 1
    workers: int = 0
    decode_threads: int = 1


ROWS = [
    Row("read_into-reused", "eagle-io", "decode alone: `Dataset.read_into`, reused buffers",
        "in process, 1 decode thread, every sample into its own buffers allocated (and touched) once"),
    Row("read_into-fresh", "eagle-io", "decode alone: `Dataset.read_into`, fresh tensors",
        "in process, 1 decode thread, a new `torch.empty` per sample and tensor"),
    Row("loader-1", "eagle-io", "**`eagle_io.feed.Loader`**, prefetch 2",
        "threads: 1 producer + 1 decode thread, batch buffers reused, no worker process"),
    Row("loader-2", "eagle-io", "**`eagle_io.feed.Loader`**, prefetch 2",
        "threads: 1 producer + 2 decode threads, batch buffers reused, no worker process", decode_threads=2),
    Row("dl0-t1", "eagle-io", "`DataLoader(workers=0)`", "in process, torch intra-op threads 1, 1 decode thread"),
    Row("dl0-t2", "eagle-io", "`DataLoader(workers=0)`", "in process, torch's default 2 intra-op threads",
        torch_threads=2),
    Row("dl2", "eagle-io", "`DataLoader(workers=2, persistent)`",
        "2 forked workers (torch 1 thread each, 1 decode thread), CPU of all processes", workers=2),
    Row("sf-dl0-t1", "SpecForge", "`DataLoader(workers=0)`", "in process, torch intra-op threads 1"),
    Row("sf-dl0-t2", "SpecForge", "`DataLoader(workers=0)`", "in process, torch's default 2 intra-op threads",
        torch_threads=2),
    Row("sf-dl2", "SpecForge", "`DataLoader(workers=2, persistent)`",
        "2 forked workers (torch 1 thread each), CPU of all processes", workers=2),
]  # fmt: skip


class Runner:
    """One row's reader, kept across its cold and warm passes; ``__call__`` runs one pass and returns its tokens."""

    def __init__(self, row: Row, data: Data, batches: list[list[int]], batch_size: int) -> None:
        self.row, self.data, self.batches = row, data, batches
        self.sampler = Batches(batches)
        self.loader = None
        if row.key.startswith("read_into"):
            self.ds = eagle_io.Dataset(data.eagleio, threads=row.decode_threads)
            self.bufs = None
            if row.key == "read_into-reused":
                self.bufs = [self._alloc(n) for n in data.lengths]
                for b in self.bufs:
                    for t in b.values():
                        t.view(torch.uint8).numpy().fill(1)
            return
        if row.fmt == "eagle-io":
            ds = ShardDataset(data.eagleio, threads=row.decode_threads)
        else:
            ds = SpecForgeStyleDataset(data.ckpt)
        if row.key.startswith("loader"):
            self.loader = Loader(ds, batch_sampler=self.sampler, collate_fn=PaddingCollator(), prefetch=2)
        else:
            w = row.workers
            self.loader = torch.utils.data.DataLoader(
                ds, batch_sampler=self.sampler, collate_fn=PaddingCollator(), num_workers=w,
                persistent_workers=w > 0, multiprocessing_context="fork" if w else None, timeout=600 if w else 0,
            )  # fmt: skip
            if w:  # start the workers on the shortest sample, so that the cold pass is a pass, not a start-up
                self.sampler.batches = [[int(np.argmin(data.lengths))]]
                for _ in self.loader:
                    pass
                self.sampler.batches = batches

    def _alloc(self, n: int) -> dict[str, torch.Tensor]:
        return {s.name: torch.empty((n, s.width) if s.width else (n,), dtype=getattr(torch, s.dtype))
                for s in self.ds.schema}  # fmt: skip

    def __call__(self) -> int:
        if self.loader is None:
            for b in self.batches:
                for p in b:
                    self.ds.read_into(p, self.bufs[p] if self.bufs else self._alloc(self.data.lengths[p]))
            return sum(self.data.lengths[p] for b in self.batches for p in b)
        return sum(int(b["lengths"].sum()) for b in self.loader)

    def files(self) -> list[str]:
        return eagleio_files(self.data.eagleio) if self.row.fmt == "eagle-io" else self.data.ckpt

    def close(self) -> None:
        self.loader = None  # persistent workers shut down with their DataLoader


def timed(run, cpu: AllProcesses) -> tuple[float, float, int]:
    t0, c0 = time.perf_counter(), cpu.seconds()
    tokens = run()
    return time.perf_counter() - t0, max(cpu.seconds() - c0, 0.01), tokens  # psutil counts 10 ms clock ticks


def throughput(data: Data, batch_size: int, rounds: int, rows: list[Row]) -> list[dict]:
    """Per round, every row in turn: its reader is built (workers started), the files evicted, one cold pass, two
    warm passes (the faster counts). Returns per row the per-round figures."""
    order = np.random.default_rng(0).permutation(len(data.lengths)).tolist()
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    total = sum(data.lengths)
    cpu = AllProcesses()
    out = {r.key: [] for r in rows}
    for rnd in range(rounds):
        for row in rows:
            torch.set_num_threads(row.torch_threads)
            try:
                runner = Runner(row, data, batches, batch_size)
                files = runner.files()
                evict(files)
                resident = resident_fraction(files)
                cold = timed(runner, cpu)
                warm = min((timed(runner, cpu) for _ in range(2)), key=lambda t: t[0])
                runner.close()
            finally:
                torch.set_num_threads(1)
            assert cold[2] == warm[2] == total, (row.key, cold[2], warm[2], total)
            gb = total * data.token_bytes / 1e9
            r = dict(cold=gb / cold[0], cold_cpu=gb / cold[1], warm=gb / warm[0], warm_cpu=gb / warm[1],
                     resident=resident)  # fmt: skip
            out[row.key].append(r)
            print(
                f"round {rnd} {row.fmt:9} {row.key:17} cold {r['cold']:.3f} GB/s {r['cold_cpu']:.3f} GB/CPU-s "
                f"(resident {resident:.0%})  warm {r['warm']:.3f} GB/s {r['warm_cpu']:.3f} GB/CPU-s",
                flush=True,
            )
    return [{"row": row, "rounds": out[row.key]} for row in rows]


def coder_alone(data: Data) -> dict | None:
    """MB of bf16 per CPU-second of the chunk codec alone and of zstd alone on the very planes it hands zstd
    (``cargo bench --bench codec``, one thread, no I/O, no CRC), over this run's aux and final states; None
    without cargo (a machine with the wheel only)."""
    if shutil.which("cargo") is None:
        return None
    ds = eagle_io.Dataset(data.eagleio)
    speeds, mb = {}, {}
    for name in STATES:
        path = WORK / f"{name}.bin"
        with open(path, "wb") as f:
            for p in range(len(ds)):
                f.write(ds.read(p)[name].view(torch.uint8).numpy().tobytes())
        mb[name] = path.stat().st_size / 1e6
        width = next(s.width for s in ds.schema if s.name == name)
        cmd = ["cargo", "bench", "-q", "--features", "python", "--bench", "codec", "--", str(path), str(width), "-1000"]
        run = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True)
        path.unlink()
        m = re.search(r"decode (\d+) MB/CPU-s \(one thread\); zstd alone .* decode (\d+) MB", run.stdout)
        if run.returncode != 0 or m is None:
            print(f"cargo bench --bench codec failed: {run.stdout[-500:]} {run.stderr[-1500:]}", flush=True)
            return None
        speeds[name] = (float(m.group(1)), float(m.group(2)))
    total = sum(mb.values())
    return {
        "codec": total / sum(mb[n] / speeds[n][0] for n in STATES),
        "zstd": total / sum(mb[n] / speeds[n][1] for n in STATES),
        "per_tensor": speeds,
    }


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
            evict(
                eagleio_files(root)
                if kind == "eagle-io"
                else list_local_files(root, (".ckpt.gz",) if kind.startswith("ckpt.gz") else (".ckpt",))
            )
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

CNAMES = {
    "eagle-io": "(a) eagle-io `ShardDataset` + `lengths()`",
    "ckpt-list": "(b) SpecForge listing only (`os.walk`; no lengths)",
    "ckpt-lengths": "(b) SpecForge listing + lengths (`torch.load(mmap=True)` per file)",
    "ckpt.gz-lengths": "(c) SpecForge `.ckpt.gz` listing + lengths (gunzip per file)",
}


def _med(xs) -> float:
    return float(np.median(xs))


def ratios(results: list[dict], num: str, den: str | tuple[str, ...], metric: str, den_metric: str | None = None):
    """Per round ``num``'s metric / the best of ``den``'s rows' metric in the same round -> (median, lo, hi)."""
    by = {r["row"].key: r["rounds"] for r in results}
    den = (den,) if isinstance(den, str) else den
    xs = [by[num][i][metric] / max(by[d][i][den_metric or metric] for d in den) for i in range(len(by[num]))]
    return _med(xs), min(xs), max(xs)


def render(results: list[dict], coder: dict | None, crows: list[dict]) -> str:
    out = [
        "| path | files | settings | cold GB/s | cold GB/CPU-s | warm GB/s | warm GB/CPU-s "
        "| warm per CPU-s x SpecForge 1-thread (range) | resident after eviction |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        row, rs = r["row"], r["rounds"]
        x, lo, hi = ratios(results, row.key, "sf-dl0-t1", "warm_cpu")
        out.append(
            f"| {row.path} | {row.fmt} | {row.settings} | {_med([q['cold'] for q in rs]):.3f} | "
            f"{_med([q['cold_cpu'] for q in rs]):.3f} | {_med([q['warm'] for q in rs]):.3f} | "
            f"{_med([q['warm_cpu'] for q in rs]):.3f} | {x:.2f} ({lo:.2f}-{hi:.2f}) | "
            f"{max(q['resident'] for q in rs):.1%} |"
        )
    if coder:
        out.append(
            f"| the entropy coder alone: zstd on the planes the codec hands it (`cargo bench --bench codec`, same "
            f"states) | eagle-io | one thread, no I/O, no CRC, one reused output buffer (the whole chunk codec "
            f"alone: {coder['codec'] / 1e3:.3f}) | | | | {coder['zstd'] / 1e3:.3f} | | |"
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


def verdict(results: list[dict], coder: dict | None, crows: list[dict]) -> str:
    """The feed's targets (and the construction target) against this run: medians of per-round ratios."""
    loaders, dl2s, sfs = ("loader-1", "loader-2"), ("dl2", "sf-dl2"), ("sf-dl0-t1", "sf-dl0-t2", "sf-dl2")

    def line(text, got, target):
        x, lo, hi = got
        return f"- {text}: {x:.2f}x ({lo:.2f}-{hi:.2f} over the rounds), target >= {target}: " + (
            "met." if x >= target else "NOT met."
        )

    out = ["Against the feed's targets (this run; ratios taken within each round):", ""]
    out.append(line("Loader (1 decode thread) per CPU-second vs the better `DataLoader(workers=2)` of the two formats",
                    ratios(results, "loader-1", dl2s, "warm_cpu"), 3))  # fmt: skip
    out.append(line("Loader (1 decode thread) per CPU-second vs SpecForge in process, torch 1 thread",
                    ratios(results, "loader-1", "sf-dl0-t1", "warm_cpu"), 1.0))  # fmt: skip
    best = max(loaders, key=lambda k: ratios(results, k, dl2s, "warm")[0])
    out.append(line(f"Loader wall throughput warm ({best}) vs the faster `DataLoader(workers=2)`",
                    ratios(results, best, dl2s, "warm"), 1.0))  # fmt: skip
    best = max(loaders, key=lambda k: ratios(results, k, sfs, "cold")[0])
    out.append(line(f"Loader wall throughput cold ({best}) vs SpecForge's fastest cold row",
                    ratios(results, best, sfs, "cold"), 1.5))  # fmt: skip
    out.append(line("Loader (1 decode thread) per CPU-second vs `read_into` into reused buffers (item 2)",
                    ratios(results, "loader-1", "read_into-reused", "warm_cpu"), 0.9))  # fmt: skip
    x, lo, hi = ratios(results, "read_into-fresh", "read_into-reused", "warm_cpu")
    out.append(f"- `read_into` into fresh tensors vs reused buffers, per CPU-second: {x:.2f}x ({lo:.2f}-{hi:.2f}).")
    if coder:
        dec = _med([q["warm_cpu"] for q in next(r for r in results if r["row"].key == "read_into-reused")["rounds"]])
        out.append(
            f"- The ceiling: zstd alone decodes these states' planes at {coder['zstd'] / 1e3:.2f} GB/CPU-s and the "
            f"codec alone at {coder['codec'] / 1e3:.2f}; `read_into` into reused buffers (record checksum and the "
            f"writes of the output included) runs at {dec:.2f} = {dec / (coder['zstd'] / 1e3):.0%} of zstd alone."
        )
    for r in (r for r in crows if r["kind"] == "eagle-io"):
        ok = r["cold"] < 1 and r["opens"] is not None and r["opens"] <= 2 * (r["shards"] or 0) + 2
        out.append(
            f"- construction at {r['n']}: {r['cold']:.3f} s cold with {r['opens']} opens for {r['shards']} shards "
            f"(< 1 s, O(shards)): {'met' if ok else 'NOT met'}."
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    global WORK
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=44, help="real conversations (realdata.py's cache states-N.pt)")
    ap.add_argument("--copies", type=int, default=1, help="store each real sample this many times (distinct ids)")
    ap.add_argument("--dataset", help="an eagle-io dataset to read instead (e.g. the main job's)")
    ap.add_argument("--limit", type=int, help="with --dataset: its first LIMIT samples")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every row (cold + 2 warm passes); medians")
    ap.add_argument("--sizes", default="10000,100000", help="construction sizes")
    ap.add_argument("--full-lengths", action="store_true", help="also per-file length loads above 10k (minutes)")
    ap.add_argument("--quick", action="store_true", help="--sizes 10000 --rounds 1")
    ap.add_argument("--smoke", action="store_true", help="tiny synthetic data, one round, no construction, no coder")
    ap.add_argument("--work", type=Path, help="data and results folder (default .bench-data/loader)")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--no-coder", action="store_true", help="skip the `cargo bench --bench codec` ceiling")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "ROOT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(construct(*args.child)))
        return
    WORK = args.work or WORK
    if args.quick:
        args.sizes, args.rounds = "10000", 1
    if args.smoke:
        args.sizes, args.rounds, args.no_readme, args.no_coder = "", 1, True, True
    torch.set_num_threads(1)  # every row sets its own; the rest of this process runs as DataLoader workers do
    t_start, load0, build0 = time.perf_counter(), os.getloadavg()[0], native_build()
    if args.smoke:
        data = prepare_samples(synthetic(16, 8, 4, 40), "smoke", "SMOKE: 16 synthetic samples, H=8")
    elif args.dataset:
        data = prepare_dataset(args.dataset, args.limit)
    else:
        samples, desc = load_real(args.n, args.copies)
        tag = f"real-{args.n}x{args.copies}" + ("" if "SYNTHETIC" not in desc else "-syn")
        tokens = sum(s["input_ids"].shape[0] for s in samples)
        desc += f"; {len(samples)} samples, {tokens} tokens"
        data = prepare_samples(samples, tag, desc)
    results = throughput(data, args.batch_size, args.rounds, ROWS)
    coder = None if args.no_coder else coder_alone(data)
    use_strace = shutil.which("strace") is not None
    sizes = [int(s) for s in args.sizes.split(",") if s]
    crows = construction(sizes, with_gz_at=sizes[:1], use_strace=use_strace, full_lengths=args.full_lengths)
    table = render(results, coder, crows) + "\n" + verdict(results, coder, crows)
    print(table)
    plain = [{"key": r["row"].key, "fmt": r["row"].fmt, "rounds": r["rounds"]} for r in results]
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "results.json").write_text(json.dumps({"rows": plain, "coder": coder, "construction": crows}, indent=1))
    if args.no_readme:
        return
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    head = subprocess.run(["git", "-C", str(HERE.parent), "log", "-1", "--format=%h"], capture_output=True, text=True)
    cmd = " ".join([".venv/bin/python", "benches/bench_loader.py", *(argv if argv is not None else sys.argv[1:])])
    body = (
        f"Command: `{cmd}` (run {time.strftime('%Y-%m-%d %H:%M %Z')}, HEAD {head.stdout.strip()}, "
        f"{time.perf_counter() - t_start:.0f} s wall)\n\n"
        f"Machine: {os.cpu_count()} cores ({cpu}), ext4 on a virtio disk, shared with other engineers' jobs (load "
        f"average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at the end). {describe_build(build0)}\n\n"
        f"Data (throughput): {data.desc}. Batches of {args.batch_size} samples in one fixed shuffled order, the same "
        f"for every row, collated by `eagle_io.feed.PaddingCollator` (the decode-alone rows: the same samples, no "
        f"batch). GB = 1e9 bytes of bf16 states (aux + final, unpadded).\n\n{table}\n{NOTES}"
    )
    write_section("bench_loader", "## Training feed: honest baselines, loader throughput, construction "
                  "(bench_loader.py)", body)  # fmt: skip


NOTES = """\
- Every row runs the same batches; a round runs every row once (its reader built, DataLoader workers started on
  one batch, then its files evicted, one cold pass, two warm passes of which the faster counts), row after row, so
  that the shared machine's load hits all rows alike; the figures are medians over `--rounds` rounds, ratios are
  taken within each round (range = lowest-highest round).
- GB/CPU-s: the same bytes per CPU-second of every process involved (user + system, `psutil`: this process with
  all its threads, and the live DataLoader worker processes). It is the per-core cost, much less sensitive than
  wall time to the other jobs on the shared cores. In-process peer rows run torch at 1 intra-op thread, as
  DataLoader workers do (`torch.set_num_threads(1)`); the "torch's default" rows show what 2 threads on 2 shared
  cores cost (`tensor.clone()` of an mmap'd 3.5 MB tensor: 17 ms with 2 threads, 2 ms with 1).
- Cold = right after `posix_fadvise(DONTNEED)` on every file of that row (all written with fsync, so the pages are
  clean and dropped; "resident after eviction" is `mincore`'s count just before the pass, the highest over the
  rounds). `echo 1 > /proc/sys/vm/drop_caches` is permitted on this machine but not used: it would drop the other
  developers' caches too, and dentries and inodes, which a training job keeps. The virtio disk may itself be
  cached by the host: "cold" means not in this machine's page cache.
- SpecForge rows read exactly as its `OfflineEagle3Dataset._open_file` (v0.2.0): `torch.load(path,
  weights_only=False, mmap=True)`; the item is the same dict eagle-io yields and the same collator copies it into
  the batch (which is where mmap'd pages are read). SpecForge's own `process_data` and collator add copies
  (`torch.cat` padding), not counted here: the peer is given its cheapest path.
- The Loader yields the same batch dicts as `DataLoader(ShardDataset, collate_fn=PaddingCollator())`
  (tests/test_feed_threaded.py), decoded by eagle-io's native threads with the GIL released into a ring of reused
  batch buffers: no fresh-tensor page faults, no worker process, no shared-memory hand-off.
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
