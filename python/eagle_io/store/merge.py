"""Merging the per-rank manifests of a root that several writers shared into one ``manifest.json``,
with an audit of sample ids: duplicates across ranks, and (given the expected ids, e.g. from the
source dataset) missing and unexpected ids.

Ranks write ``manifest.r{rank:05}.json`` and ``shards/r{rank:05}-*.eio`` into one root
(docs/FORMAT.md, section 1). :func:`merge_ranks` opens every rank manifest (each shard it lists is
validated as by :class:`eagle_io.Dataset`), refuses ranks whose schema or metadata disagree (naming
the key), and writes a manifest listing every rank's shards and shared-prefix shards (docs/FORMAT.md 4.7), in rank
order, atomically (temporary
name, fsync, rename, directory fsync), after checking that it opens. It never writes a manifest
that holds a sample id twice: a reader would refuse it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from itertools import takewhile
from pathlib import Path
from typing import Any

from .. import _native
from .._native import __version__
from ..errors import CorruptRecordError, EagleIOError, IncompatibleDatasetError, InvalidArgumentError
from . import layout
from .manifest import manifest_bytes, read_manifest
from .reader import Dataset


@dataclass
class MergeReport:
    """What :func:`merge_ranks` found and did.

    Attributes:
        root: the dataset root.
        manifest: the manifest written (or audited, for a single-writer root); None when not written.
        written: whether ``manifest`` was (re)written by this merge.
        ranks: the rank manifests merged, in rank order.
        shards, samples, tokens: totals over all ranks.
        prefix_records: the shared-prefix records carried (docs/FORMAT.md 4.7), of every rank.
        complete: every rank's writer closed (its manifest says ``complete``).
        incomplete_ranks: rank manifests whose writer did not close (crashed or still running).
        duplicates: sample id -> every ``"shard file (rank manifest)"`` holding it (two or more).
        expected: size of the expected id set, None when none was given.
        missing: expected ids no rank holds, sorted.
        skipped_by_source: record indices the source dataset yields no sample for -> the reason
            (e.g. ``no_assistant_turn``, ``invalid_json``), as generate counted them; not expected.
        unexpected: ids held that are not expected, sorted.
        unlisted_shards: committed shard files in ``shards/`` no manifest lists (a crashed rank's
            last shard: resuming that rank adopts it).
        temp_files: uncommitted temporary shards in ``shards/`` (removed by resuming their rank).
        warnings: facts worth a look that do not fail the merge.
    """

    root: str
    manifest: str | None = None
    written: bool = False
    ranks: list[str] = field(default_factory=list)
    shards: int = 0
    samples: int = 0
    tokens: int = 0
    prefix_records: int = 0
    complete: bool = True
    incomplete_ranks: list[str] = field(default_factory=list)
    duplicates: dict[int, list[str]] = field(default_factory=dict)
    expected: int | None = None
    missing: list[int] = field(default_factory=list)
    skipped_by_source: dict[int, str] = field(default_factory=dict)
    unexpected: list[int] = field(default_factory=list)
    unlisted_shards: list[str] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No duplicate id, and no missing id (when an expected set was given)."""
        return not self.duplicates and not self.missing

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["duplicates"] = {str(k): v for k, v in self.duplicates.items()}
        out["skipped_by_source"] = {str(k): v for k, v in self.skipped_by_source.items()}
        out["ok"] = self.ok
        return out


def _differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k, _ABSENT) != b.get(k, _ABSENT))


_ABSENT = object()


def _schema_difference(a: dict, b: dict) -> str:
    ta, tb = a.get("tensors", []), b.get("tensors", [])
    if len(ta) != len(tb):
        return f"{len(ta)} tensors vs {len(tb)}"
    for x, y in zip(ta, tb, strict=True):
        keys = _differing_keys(x, y)
        if keys:
            return f"tensor {x.get('name')!r}: " + ", ".join(f"{k} {x.get(k)!r} vs {y.get(k)!r}" for k in keys)
    return "differs"


def _scan_shards(names: Iterable[str], listed: set[str], report: MergeReport) -> None:
    """Sorts the file names found in ``shards/`` into unlisted committed shards and temporary files."""
    for name in sorted(names):
        rel = f"{layout.SHARD_DIR}/{name}"
        if layout.SHARD_FILE.match(name) and rel not in listed:
            report.unlisted_shards.append(rel)
        elif layout.is_shard_temp(name):
            report.temp_files.append(rel)


class _Local:
    """A root on the local filesystem: the merged manifest is written atomically, once it opens."""

    def __init__(self, root: Path) -> None:
        self.root, self.merged = root, str(root / layout.MANIFEST)

    def at(self, name: str) -> str:
        return str(self.root / name)

    def shard_names(self) -> list[str]:
        shard_dir = self.root / layout.SHARD_DIR
        return [p.name for p in shard_dir.iterdir()] if shard_dir.is_dir() else []

    def previous_shards(self) -> list[str] | None:
        """The shard files the existing merged manifest lists; None when there is none."""
        path = Path(self.merged)
        if not path.exists():
            return None
        try:
            return [s.get("file") for s in json.loads(path.read_text()).get("shards", [])]
        except (ValueError, AttributeError, TypeError, KeyError):
            return ["(unreadable manifest)"]

    def write(self, data: bytes) -> None:
        # Written only once it opens (shard paths are relative to the manifest's directory: the same for the temp).
        layout.write_atomic(self.merged, data, check=lambda tmp: Dataset(tmp, threads=1))


class _Remote:
    """A dataset prefix on object storage: the merged manifest is put with a conditional PUT (create-only, or
    if-match on the ETag of the one read), so a concurrent writer is never overwritten."""

    def __init__(self, url: str) -> None:
        self.root = url.rstrip("/")
        self.merged = f"{self.root}/{layout.MANIFEST}"
        self.objects = [u[len(self.root) + 1 :] for u, _ in _native.list_objects(self.root, [layout.SHARD_DIR])]

    def at(self, name: str) -> str:
        return f"{self.root}/{name}"

    def rank_manifests(self) -> list[str]:
        return sorted(n for n in self.objects if layout.RANK_MANIFEST.match(n))

    def shard_names(self) -> list[str]:
        return [n.split("/", 1)[1] for n in self.objects if n.startswith(layout.SHARD_DIR + "/")]

    def previous_shards(self) -> list[str] | None:
        if layout.MANIFEST not in self.objects:
            return None
        try:
            return [s["file"] for s in read_manifest(self.merged)["shards"]]
        except CorruptRecordError:
            return ["(unreadable manifest)"]

    def write(self, data: bytes) -> None:
        _native.put_manifest(data, self.merged)


def _audit_rank_numbers(ranks: list[str], metadata: Any, report: MergeReport) -> None:
    """Warns about absent ranks (below the highest present one, or below the metadata's ``world_size``, also when a
    single rank manifest is present) and ranks at or beyond ``world_size``."""
    present = {int(layout.RANK_MANIFEST.match(name).group(1)) for name in ranks}
    world = metadata.get("world_size") if isinstance(metadata, dict) else None
    world = world if isinstance(world, int) and not isinstance(world, bool) and world >= 1 else None
    expected = set(range(world if world is not None else max(present) + 1))
    absent, beyond = sorted(expected - present), sorted(r for r in present if world is not None and r >= world)
    said = f"metadata says world_size {world}" if world is not None else f"rank {max(present)} is present"
    if absent:
        names = ", ".join(layout.manifest_name(r, 2) for r in absent[:5]) + (", ..." if len(absent) > 5 else "")
        report.warnings.append(f"{said} but {len(absent)} rank manifest(s) are absent ({names}): their ids are missing")
    if beyond:
        report.warnings.append(f"{said} but rank(s) {beyond} are present")


def merge_ranks(
    root: str | os.PathLike[str],
    expected_ids: Iterable[int] | None = None,
    *,
    skipped: Mapping[int, str] | None = None,
    write: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> MergeReport:
    """Merges the rank manifests of ``root`` into ``root/manifest.json`` and audits sample ids.

    Args:
        root: a directory holding ``manifest.r00000.json``... (several writers), or only
            ``manifest.json`` (one writer: audited, nothing to write); or such an object-storage prefix
            (``s3://bucket/run``, docs/STORAGE.md), where the merged manifest is put with a conditional PUT
            (no writer lock exists there: merge once every rank's upload finished).
        expected_ids: the sample ids the run should hold (e.g. ``range(n_records)``, or
            :func:`expected_from_source`); missing and unexpected ids are reported.
        skipped: record indices the source yields no sample for -> why (reported as such).
        write: write the merged manifest (False: audit only).
        progress: called as ``progress(samples_done, samples_total)`` after each rank manifest is audited.

    Returns:
        A :class:`MergeReport`. No manifest is written when a sample id is held twice.

    Raises:
        IncompatibleDatasetError: ranks disagree on the schema or metadata (naming the key), two ranks hold a
            prefix record of the same id (naming both files; ids the writers number themselves never collide), or
            ``manifest.json`` lists shards no rank lists (a single-writer dataset shares the root).
        InvalidArgumentError: no manifest in ``root``, or a writer still holds one of them.
        ObjectStorageError: a request for a remote ``root`` failed (names the URL and the HTTP status);
            IncompatibleDatasetError too when another writer changed its ``manifest.json`` meanwhile.
        CorruptRecordError, FormatVersionError, StorageError: a rank's manifest or a shard it
            lists cannot be trusted (as :class:`eagle_io.Dataset` raises); StorageError also when
            the merged manifest or a lock file cannot be written.
    """
    if layout.is_url(root):
        remote = _Remote(os.fspath(root))
        report = MergeReport(root=remote.root)
        ranks = remote.rank_manifests()
        if not ranks and layout.MANIFEST not in remote.objects:
            raise InvalidArgumentError(
                f"{remote.root} holds no manifest.json and no rank manifest (manifest.rNNNNN.json)"
            )
        names = ranks or [layout.MANIFEST]
        return _merge(remote, ranks, names, expected_ids, skipped, write, report, progress)
    root = Path(root)
    report = MergeReport(root=str(root))
    if not root.is_dir():
        raise InvalidArgumentError(f"{root} is not a directory")
    ranks = [p.name for p in layout.rank_manifests(root)]
    merged_path = root / layout.MANIFEST
    if not ranks:
        if not merged_path.exists():
            raise InvalidArgumentError(f"{root} holds no manifest.json and no rank manifest (manifest.rNNNNN.json)")
        names = [layout.MANIFEST]  # a single writer's dataset: audit it
    else:
        names = ranks
    # The writers' own locks: no rank writer runs while its manifest is read, no writer of manifest.json is live.
    locked = names + ([layout.MANIFEST] if ranks else [])
    with layout.lock_writers(root, locked, busy="merge once every rank has finished"):
        return _merge(_Local(root), ranks, names, expected_ids, skipped, write, report, progress)


def _merge(where, ranks, names, expected_ids, skipped, write, report: MergeReport, progress) -> MergeReport:
    root = where.root
    report.ranks = names if ranks else []
    total = sum(s["samples"] for name in names for s in _listed_shards(where.at(name))) if progress else 0
    done = 0
    first: dict | None = None
    holders: dict[int, list[str]] = {}
    shards: list[dict] = []
    prefixes: list[dict] = []  # every rank's prefix shards (docs/FORMAT.md 4.7)
    prefix_ids: dict[int, tuple[str, str]] = {}  # prefix id -> (its key, "file (rank manifest)")
    listed_by: dict[str, str] = {}
    version = 1
    for name in names:
        ds = Dataset(where.at(name), threads=1)
        m = ds.manifest
        if first is None:
            first = m
        else:
            if m["schema"] != first["schema"]:
                raise IncompatibleDatasetError(
                    f"{root}: cannot merge {name} with {names[0]}: schema "
                    + _schema_difference(first["schema"], m["schema"])
                )
            keys = _differing_keys(first["metadata"], m["metadata"])
            if keys:
                raise IncompatibleDatasetError(
                    f"{root}: cannot merge {name} with {names[0]}: metadata differs in "
                    + ", ".join(f"{k!r} ({first['metadata'].get(k)!r} vs {m['metadata'].get(k)!r})" for k in keys)
                )
            if m["codec"] != first["codec"]:
                report.warnings.append(f"{name} was written with codec {m['codec']}, {names[0]} with {first['codec']}")
        for pid, _, key, file in ds.prefix_records():
            held = f"{file} ({name})"
            if pid in prefix_ids:
                other_key, other = prefix_ids[pid]
                same = (
                    "the same token ids, stored apart (their states may differ)"
                    if key == other_key
                    else (f"different token ids ({other_key} vs {key})")
                )
                raise IncompatibleDatasetError(
                    f"{root}: cannot merge {name}: prefix record {pid} is held by both {other} and {held}, with "
                    f"{same}; a merged manifest would resolve one rank's references to the other's prefix (prefix "
                    "records the writers number themselves never collide: rank * 2**40 on)"
                )
            prefix_ids[pid] = (key, held)
        for s in m.get("prefixes", []):
            if s["file"] in listed_by:
                report.warnings.append(f"{s['file']} is listed by both {listed_by[s['file']]} and {name}")
            listed_by[s["file"]] = name
            prefixes.append(s)
        version = max(version, m["format_version"])
        if not m["complete"]:
            report.complete = False
            report.incomplete_ranks.append(name)
        pos = 0
        for s in m["shards"]:
            if s["file"] in listed_by:
                report.warnings.append(f"{s['file']} is listed by both {listed_by[s['file']]} and {name}")
            listed_by[s["file"]] = name
            for _ in range(s["samples"]):
                holders.setdefault(ds.entry(pos).sample_id, []).append(f"{s['file']} ({name})")
                pos += 1
            shards.append(s)
        assert pos == len(ds)
        world = m["metadata"].get("world_size") if isinstance(m["metadata"], dict) else None
        rank_no = int(layout.RANK_MANIFEST.match(name).group(1)) if ranks else None
        if isinstance(world, int) and world > 1 and rank_no is not None:
            misplaced = [ds.entry(p).sample_id for p in range(len(ds)) if ds.entry(p).sample_id % world != rank_no]
            if misplaced:
                report.warnings.append(
                    f"{name} holds {len(misplaced)} ids that are not its share (id % {world} != {rank_no}), "
                    f"e.g. {misplaced[:5]}"
                )
        done += len(ds)
        if progress:
            progress(done, max(total, done))
    assert first is not None
    report.shards = len(shards)
    report.samples = sum(len(v) for v in holders.values())
    report.tokens = sum(s["tokens"] for s in shards)
    report.prefix_records = len(prefix_ids)
    report.duplicates = {sid: h for sid, h in sorted(holders.items()) if len(h) > 1}
    if ranks:
        _audit_rank_numbers(ranks, first["metadata"], report)
    if expected_ids is not None:
        expected = set(expected_ids)
        report.expected = len(expected)
        report.missing = sorted(expected - holders.keys())
        report.unexpected = sorted(holders.keys() - expected)
    report.skipped_by_source = dict(sorted((skipped or {}).items()))
    _scan_shards(where.shard_names(), set(listed_by), report)
    if not ranks:
        report.manifest = where.merged
        return report
    previous = where.previous_shards()
    if previous is not None:
        foreign = [f for f in previous if f not in listed_by]
        if foreign:
            raise IncompatibleDatasetError(
                f"{where.merged} lists {', '.join(foreign[:3])}, which no rank manifest lists: a single-writer "
                "dataset shares this root; refusing to overwrite its manifest"
            )
    if write and not report.duplicates:
        merged = {
            "format": "eagle-io/dataset",
            "format_version": version,  # the ranks' own (a version-2 reader reads a merge of version-2 ranks)
            "writer": f"eagle-io {__version__}",
            "schema": first["schema"],
            "metadata": first["metadata"],
            "codec": first["codec"],
            "shards": shards,
            **({"prefixes": prefixes} if prefixes else {}),
            "complete": report.complete,
        }
        where.write(manifest_bytes(merged))
        report.manifest = where.merged
        report.written = True
    return report


def _listed_shards(path: str) -> list[dict]:
    """The shard entries a manifest lists, for a progress total (empty when it cannot be read: the merge itself
    reports that)."""
    try:
        return read_manifest(path)["shards"]
    except EagleIOError:
        return []


def expected_from_source(
    dataset: str | os.PathLike[str],
    *,
    limit: int | None = None,
    tokenizer: Any = None,
    max_length: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[set[int], dict[int, str]]:
    """The sample ids ``eagle-io generate --dataset DATASET [--limit N]`` should produce, and why the
    other record indices produce none.

    Every record the source parser accepts (index below ``limit``) is expected; with ``tokenizer``
    (and ``max_length``, ``template_kwargs`` such as the run's ``enable_thinking``) the chat-template tokenization
    runs as in ``generate``, so records it rejects (no assistant turn, empty loss mask...) are explained rather
    than expected.

    ``progress(records_done, records_total)`` is called after each record (the total is counted first, by one
    streaming pass over the file up to ``limit``).

    Returns:
        ``(expected ids, {record index: reason})`` for the records that yield no sample.

    Raises:
        DatasetFormatError: the file is unreadable past some point (as ``generate`` would fail).
    """
    from ..data import SkipStats, iter_conversations, iter_tokenized

    stats = SkipStats(max_examples=1 << 62)
    convs = iter_conversations(os.fspath(dataset), on_error="skip", stats=stats)
    kept = convs if limit is None else takewhile(lambda c: c.index < limit, convs)  # as generate reads it
    if progress:
        from ..data.sources import count_records

        total = count_records(dataset, limit)

        def reported(items: Iterable[Any]) -> Iterable[Any]:
            for c in items:
                progress(min(c.index + 1, total), total)
                yield c

        kept = reported(kept)
    if tokenizer is not None:
        tokenized = iter_tokenized(kept, tokenizer, stats=stats, max_length=max_length, template_kwargs=template_kwargs)
        ids = {s.index for s in tokenized}
    else:
        ids = {c.index for c in kept}
    why = {
        i: reason
        for reason, indices in stats.examples.items()
        for i in indices
        if i is not None and (limit is None or i < limit)
    }
    return ids, why
