"""Draft vocabulary mapping (``d2t`` / ``t2d``) from loss-masked token counts, keyed to its dataset.

SpecForge's convention (``specforge/data/preprocessing.py``: ``generate_vocab_mapping_file`` and
``process_token_dict_to_mappings``), which SGLang's EAGLE-3 loader consumes
(``sglang/srt/models/llama_eagle3.py``: ``LlamaForCausalLMEagle3.load_weights``, ``hot_token_id = d2t + arange``):

* count every ``input_ids[t]`` with ``loss_mask[t] == 1`` over the dataset;
* keep the ``draft_vocab_size`` most frequent target ids and sort them ascending: ``used``;
* ``d2t[i] = used[i] - i`` (int64 offsets, so ``target_id = i + d2t[i]``); ``t2d[v] = v in used``
  (bool over the target vocabulary), hence ``t2d.sum() == len(d2t) == draft_vocab_size``.

Where eagle-io is stricter than SpecForge (documented, tested):

* **Ties** at the cut-off: SpecForge keeps the tokens ``Counter.most_common`` returns first, i.e. first
  *seen* (depends on dataset order). eagle-io ranks by ``(-count, token_id)``: the lower id wins, so the map
  depends only on the counts.
* **Padding** when fewer than ``draft_vocab_size`` distinct tokens were counted: SpecForge adds missing ids from
  ``range(draft_vocab_size)`` with count 0 in set order (ascending for small ints in CPython). eagle-io adds the
  lowest target ids not already chosen, ascending: the same set, made explicit. The number added is recorded
  (``key["padded"]``).
* **Keying**: the mapping records the dataset (SHA-256 over its manifest's schema, metadata and shard index
  checksums), ``target_vocab_size`` and ``draft_vocab_size``; :func:`load_vocab_mapping` refuses a mapping whose
  key differs from what the caller expects, naming both values, so a cached map is never reused for another
  vocabulary size or dataset (SpecForge's cache is keyed by a file name only).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CheckpointError, CorruptRecordError, InvalidArgumentError, VocabMappingMismatchError
from ..store import layout

logger = logging.getLogger("eagle_io.interop.vocab")

__all__ = [
    "VOCAB_MAP_FORMAT",
    "VocabMapping",
    "VocabMappingMismatchError",
    "build_vocab_mapping",
    "check_sizes",
    "count_loss_masked_tokens",
    "dataset_fingerprint",
    "load_vocab_mapping",
    "mapping_from_counts",
    "mapping_problems",
    "validate_mapping",
]

VOCAB_MAP_FORMAT = "eagle-io/vocab-map"
VOCAB_MAP_VERSION = 1
_META_KEY = "eagle_io_vocab_map"


def dataset_fingerprint(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> str:
    """SHA-256 (hex) identifying the data of one or several datasets, from their manifests alone
    (:func:`eagle_io.store.manifest.data_fingerprint`, in the given order).
    """
    from ..store.manifest import data_fingerprint
    from ..store.reader import Dataset

    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    return data_fingerprint([Dataset(p).manifest for p in items])


def count_loss_masked_tokens(
    datasets: Any | Sequence[Any],
    target_vocab_size: int,
    *,
    progress: Callable[[int, int], None] | None = None,
    on_corrupt: str = "raise",
    skipped: list[int] | None = None,
) -> tuple[torch.Tensor, int]:
    """Counts ``input_ids[t]`` over positions with ``loss_mask[t] == 1`` (SpecForge's ``loss_mask == 1``).

    Args:
        datasets: :class:`eagle_io.Dataset` objects or paths (one or a list).
        target_vocab_size: length of the count vector.
        on_corrupt: ``"raise"`` (default) or ``"skip"``: leave a record that fails its checks out of the counts,
            log it and append its sample id to ``skipped``.

    Returns:
        ``(counts [target_vocab_size] int64, samples_read)`` (skipped records are not read).

    Raises:
        InvalidArgumentError: a masked token id outside ``[0, target_vocab_size)``, naming the sample.
        CorruptRecordError: a bad record, unless ``on_corrupt="skip"``.
    """
    from ..store.reader import Dataset

    if on_corrupt not in ("raise", "skip"):
        raise InvalidArgumentError(f"on_corrupt must be 'raise' or 'skip', got {on_corrupt!r}")

    items = [datasets] if isinstance(datasets, (str, os.PathLike, Dataset)) else list(datasets)
    dss = [d if isinstance(d, Dataset) else Dataset(d) for d in items]
    total = sum(len(d) for d in dss)
    counts = torch.zeros(target_vocab_size, dtype=torch.int64)
    done = 0
    for ds in dss:
        for pos in range(len(ds)):
            try:
                item = ds[pos]
            except CorruptRecordError as e:
                if on_corrupt == "raise":
                    raise
                logger.warning("on_corrupt='skip': sample id %d left out of the token counts: %s", e.sample_id, e)
                if skipped is not None:
                    skipped.append(ds.entry(pos).sample_id)
                continue
            ids = item["input_ids"][item["loss_mask"] == 1]
            if ids.numel():
                lo, hi = int(ids.min()), int(ids.max())
                if lo < 0 or hi >= target_vocab_size:
                    raise InvalidArgumentError(
                        f"{ds.manifest_path}: sample {item['sample_id']} has token id {hi if hi >= 0 else lo} "
                        f"outside the target vocabulary [0, {target_vocab_size})"
                    )
                counts += torch.bincount(ids, minlength=target_vocab_size)
            done += 1
            if progress:
                progress(done, total)
    return counts, done


def mapping_problems(
    d2t: torch.Tensor,
    t2d: torch.Tensor | None,
    draft_vocab_size: int | None,
    target_vocab_size: int | None,
) -> list[str]:
    """Every problem of a vocab map's *values*, one sentence each; empty = consistent. The one value checker
    (:func:`validate_mapping` for eagle-io's own maps, ``eagle-io check-serving`` for a draft checkpoint's).

    What SGLang does with them (``srt/models/llama_eagle3.py``, ``LlamaForCausalLMEagle3.load_weights``):
    ``hot_token_id = d2t + arange(len(d2t))``, then ``EAGLEWorkerV2`` maps each draft token index through
    ``hot_token_id[topk_index]`` to a target token id; ``t2d`` is skipped (SpecForge uses it). Checks: ``d2t`` is
    1-D and integer; ``t2d`` (when given) is 1-D bool with ``target_vocab_size`` entries; ``t2d.sum()``,
    ``len(d2t)`` and ``draft_vocab_size`` agree; every ``d2t[i] + i`` is a target id in ``[0, target_vocab_size)``
    and ``t2d`` is True there; no two draft ids reach the same target id (a map that is not one-to-one drafts one
    target token from two draft logits, splitting its probability, and never drafts the target ids it leaves out).
    ``None`` sizes are not checked.
    """
    problems: list[str] = []
    d2t_ok = d2t.dim() == 1 and not d2t.is_floating_point() and d2t.dtype != torch.bool
    if not d2t_ok:
        problems.append(
            f"d2t must be a 1-D integer tensor (SGLang indexes with d2t + arange), got {str(d2t.dtype)[6:]} "
            f"{list(d2t.shape)}"
        )
    t2d_ok = t2d is not None and t2d.dim() == 1 and t2d.dtype == torch.bool
    if t2d is not None and not t2d_ok:
        problems.append(f"t2d must be a 1-D bool tensor, got {str(t2d.dtype)[6:]} {list(t2d.shape)}")
    if t2d_ok and target_vocab_size is not None and t2d.shape[0] != target_vocab_size:
        problems.append(f"t2d has {t2d.shape[0]} entries, target_vocab_size is {target_vocab_size}")
    counts = {"len(d2t)": int(d2t.shape[0]) if d2t.dim() == 1 else None}
    if t2d_ok:
        counts = {"t2d.sum()": int(t2d.sum()), **counts}
    if draft_vocab_size is not None:
        counts["draft_vocab_size"] = int(draft_vocab_size)
    if len({v for v in counts.values() if v is not None}) > 1:
        problems.append(", ".join(f"{k} = {v}" for k, v in counts.items()) + ": must be equal")
    if d2t_ok and d2t.shape[0]:
        target_ids = d2t.to(torch.int64) + torch.arange(d2t.shape[0])
        hi = target_vocab_size if target_vocab_size is not None else None
        bad = (target_ids < 0) | (target_ids >= hi) if hi is not None else target_ids < 0
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            problems.append(
                f"d2t maps draft ids outside the target vocabulary [0, {hi}): {int(bad.sum())} of {d2t.shape[0]}, "
                f"first draft id {i} -> target id {int(target_ids[i])}"
            )
        else:
            if t2d_ok and (hi is None or t2d.shape[0] == hi) and not bool(t2d[target_ids].all()):
                problems.append("t2d is False at some target id that d2t maps to")
            dup = _first_duplicate(target_ids)
            if dup is not None:
                (a, b), n_dup = dup
                problems.append(
                    f"d2t is not one-to-one: draft ids {a} and {b} both map to target id {int(target_ids[a])} "
                    f"({n_dup} of {d2t.shape[0]} draft ids repeat a target id already named; SGLang's hot_token_id "
                    "= d2t + arange must name each target id once)"
                )
    return problems


def _first_duplicate(target_ids: torch.Tensor) -> tuple[tuple[int, int], int] | None:
    """``((a, b), repeats)``: the first draft id ``b`` whose target id an earlier draft id ``a`` already names, and
    how many draft ids repeat one; None when every target id is named once."""
    order = torch.sort(target_ids, stable=True).indices
    ids = target_ids[order]
    repeat = ids[1:] == ids[:-1]
    if not bool(repeat.any()):
        return None
    later = order[1:][repeat]  # draft ids naming a target id an earlier one (in id order within a run) names
    b = int(later.min())
    a = int((target_ids == target_ids[b]).nonzero()[0, 0])
    return (a, b), int(repeat.sum())


def validate_mapping(d2t: torch.Tensor, t2d: torch.Tensor, draft_vocab_size: int, target_vocab_size: int) -> None:
    """Checks a mapping: ``d2t [draft_vocab_size]`` int64, ``t2d [target_vocab_size]`` bool,
    ``t2d.sum() == len(d2t) == draft_vocab_size``, draft ids map to strictly ascending target ids
    (SpecForge sorts ``used``), and ``t2d`` is True exactly at ``d2t + arange`` (:func:`mapping_problems`).

    Raises:
        InvalidArgumentError: (a ``ValueError``) naming the first invariant that fails and the values found.
    """
    if d2t.dtype != torch.int64 or d2t.dim() != 1:
        raise InvalidArgumentError(f"d2t must be a 1-D int64 tensor, got {d2t.dtype} {list(d2t.shape)}")
    if t2d.dtype != torch.bool or t2d.dim() != 1:
        raise InvalidArgumentError(f"t2d must be a 1-D bool tensor, got {t2d.dtype} {list(t2d.shape)}")
    problems = mapping_problems(d2t, t2d, draft_vocab_size, target_vocab_size)
    if problems:
        raise InvalidArgumentError(problems[0])
    target_ids = d2t + torch.arange(draft_vocab_size)
    if draft_vocab_size > 1 and not bool((target_ids[1:] > target_ids[:-1]).all()):
        raise InvalidArgumentError("d2t + arange is not strictly ascending (SpecForge's d2t lists target ids sorted)")


@dataclass(frozen=True)
class VocabMapping:
    """A draft vocabulary mapping and its key.

    Attributes:
        d2t: ``[draft_vocab_size]`` int64, ``target_id = draft_id + d2t[draft_id]``.
        t2d: ``[target_vocab_size]`` bool, True for target ids in the draft vocabulary.
        key: ``format``, ``version``, ``dataset_sha256`` (:func:`dataset_fingerprint`), ``target_vocab_size``,
            ``draft_vocab_size``, plus facts: ``counted_tokens``, ``distinct_tokens``, ``padded`` (ids added
            with count 0), ``coverage`` (share of counted tokens inside the draft vocabulary), ``tie_break``.
    """

    d2t: torch.Tensor
    t2d: torch.Tensor
    key: Mapping[str, Any]

    @property
    def draft_vocab_size(self) -> int:
        return int(self.d2t.shape[0])

    @property
    def target_vocab_size(self) -> int:
        return int(self.t2d.shape[0])

    def target_ids(self) -> torch.Tensor:
        """``[draft_vocab_size]`` int64 target ids, ascending (``d2t + arange``; SGLang's ``hot_token_id``)."""
        return self.d2t + torch.arange(self.draft_vocab_size)

    def check(
        self,
        *,
        dataset_sha256: str | None = None,
        target_vocab_size: int | None = None,
        draft_vocab_size: int | None = None,
        source: str = "vocab mapping",
    ) -> None:
        """Raises :class:`VocabMappingMismatchError` when any given expectation differs from the key,
        naming every differing field with both values; then re-validates the tensors."""
        expected = {
            "dataset_sha256": dataset_sha256,
            "target_vocab_size": target_vocab_size,
            "draft_vocab_size": draft_vocab_size,
        }
        bad = [
            f"{k}: mapping has {self.key.get(k)!r}, expected {v!r}"
            for k, v in expected.items()
            if v is not None and self.key.get(k) != v
        ]
        if bad:
            raise VocabMappingMismatchError(f"{source} does not match: " + "; ".join(bad))
        sizes = (self.key.get("draft_vocab_size", self.draft_vocab_size),
                 self.key.get("target_vocab_size", self.target_vocab_size))  # fmt: skip
        if not all(type(s) is int and s >= 1 for s in sizes):  # a string here was a ValueError from int()
            raise InvalidArgumentError(
                f"{source}: its key's (draft_vocab_size, target_vocab_size) {sizes} are not sizes (integers >= 1)"
            )
        try:
            validate_mapping(self.d2t, self.t2d, *sizes)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"{source}: {e}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the mapping atomically.

        ``*.safetensors``: tensors ``d2t`` and ``t2d`` with the key as JSON in the header metadata
        (``eagle_io_vocab_map``). Any other suffix (e.g. ``.pt``): ``torch.save({"d2t", "t2d",
        "eagle_io_key"})``, which SpecForge's trainer loads as its ``vocab_mapping.pt`` (it reads only ``d2t``
        and ``t2d``; ``torch.load(weights_only=True)`` accepts the key dict).
        """
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with layout.atomic_file(path) as f:
            if path.endswith(".safetensors"):
                from safetensors.torch import save

                meta = {_META_KEY: json.dumps(dict(self.key), sort_keys=True)}
                f.write(save({"d2t": self.d2t.contiguous(), "t2d": self.t2d.contiguous()}, metadata=meta))
            else:
                torch.save({"d2t": self.d2t, "t2d": self.t2d, "eagle_io_key": dict(self.key)}, f)


def mapping_from_counts(
    counts: torch.Tensor, draft_vocab_size: int, *, key: Mapping[str, Any] | None = None
) -> VocabMapping:
    """Builds ``d2t`` / ``t2d`` from per-target-id counts (``[target_vocab_size]``).

    Ranking: ``(-count, token_id)``, top ``draft_vocab_size`` among ids with count > 0; if fewer than
    ``draft_vocab_size`` ids were counted, the lowest unused target ids (ascending) fill the rest
    (see the module docstring for how this relates to SpecForge). The result is validated.

    Raises:
        InvalidArgumentError: ``draft_vocab_size`` not in ``[1, target_vocab_size]``.
    """
    target_vocab_size = int(counts.shape[0])
    _check_draft_size(draft_vocab_size, target_vocab_size)
    counts = counts.to(torch.int64)
    seen = torch.nonzero(counts > 0).flatten()  # ascending ids
    # Stable sort of ascending ids by descending count: ties keep the lower id first.
    order = torch.sort(counts[seen], descending=True, stable=True).indices
    chosen = seen[order[:draft_vocab_size]]
    padded = draft_vocab_size - int(chosen.numel())
    if padded:
        unused = torch.ones(target_vocab_size, dtype=torch.bool)
        unused[chosen] = False
        chosen = torch.cat([chosen, torch.nonzero(unused).flatten()[:padded]])
    used = torch.sort(chosen).values
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[used] = True
    total = int(counts.sum())
    full_key = {
        "format": VOCAB_MAP_FORMAT,
        "version": VOCAB_MAP_VERSION,
        "target_vocab_size": target_vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "counted_tokens": total,
        "distinct_tokens": int(seen.numel()),
        "padded": padded,
        "coverage": (int(counts[used].sum()) / total) if total else 0.0,
        "tie_break": "count descending, then token id ascending",
        "padding": "lowest unused target ids, ascending",
    }
    full_key.update(key or {})
    validate_mapping(d2t, t2d, draft_vocab_size, target_vocab_size)
    return VocabMapping(d2t=d2t, t2d=t2d, key=full_key)


def _check_draft_size(draft_vocab_size: int, target_vocab_size: int) -> None:
    if not 1 <= draft_vocab_size <= target_vocab_size:
        raise InvalidArgumentError(
            f"draft_vocab_size {draft_vocab_size} must be in [1, target_vocab_size = {target_vocab_size}]"
        )


def check_sizes(datasets: Sequence[Any], draft_vocab_size: int, target_vocab_size: int | None = None) -> int:
    """The target vocabulary size of ``datasets`` (``target_vocab_size``, else their metadata ``vocab_size``), with
    ``draft_vocab_size`` checked against it: what a mapping of those sizes needs, known before any token is counted
    or file written.

    Raises:
        InvalidArgumentError: sizes unknown or inconsistent, or ``draft_vocab_size`` not in ``[1, target vocab]``.
    """
    vocab = _target_vocab_size(datasets, target_vocab_size)
    _check_draft_size(draft_vocab_size, vocab)
    return vocab


def _target_vocab_size(dss: Sequence[Any], given: int | None) -> int:
    sizes = {d.metadata.get("vocab_size") for d in dss}
    sizes.discard(None)
    if given is not None:
        if sizes and sizes != {given}:
            raise InvalidArgumentError(
                f"target_vocab_size {given} disagrees with the datasets' metadata vocab_size {sorted(sizes)}"
            )
        return given
    if len(sizes) != 1:
        raise InvalidArgumentError(
            f"cannot tell the target vocabulary size (metadata vocab_size: {sorted(sizes) or 'absent'}); pass it"
        )
    return int(sizes.pop())


def build_vocab_mapping(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    draft_vocab_size: int,
    *,
    target_vocab_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_corrupt: str = "raise",
) -> VocabMapping:
    """Counts loss-masked tokens over the dataset(s) at ``paths`` and builds the keyed mapping.

    Args:
        paths: one dataset (directory or manifest) or several (e.g. per-rank outputs), in a fixed order.
        draft_vocab_size: size of the draft vocabulary (SpecForge's default is 32000).
        target_vocab_size: the target's vocabulary size; default the datasets' ``metadata["vocab_size"]``.
        on_corrupt: ``"skip"`` leaves bad records out of the counts (see :func:`count_loss_masked_tokens`); the
            key then lists them in ``skipped_corrupt_sample_ids``.

    Raises:
        InvalidArgumentError: sizes unknown or inconsistent, or a token id out of range (names the sample).
        CorruptRecordError: a bad record, unless ``on_corrupt="skip"``.
    """
    from ..store.eagle3 import require_tensors
    from ..store.reader import Dataset

    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    dss = [Dataset(p) for p in items]
    for ds in dss:
        require_tensors(ds, ("input_ids", "loss_mask"), "a draft vocabulary mapping")
    vocab = check_sizes(dss, draft_vocab_size, target_vocab_size)  # before the counting pass
    skipped: list[int] = []
    counts, samples = count_loss_masked_tokens(dss, vocab, progress=progress, on_corrupt=on_corrupt, skipped=skipped)
    key: dict[str, Any] = {
        "dataset_sha256": dataset_fingerprint(items),
        "dataset_samples": samples,
        "count_rule": "input_ids where loss_mask == 1 (SpecForge generate_vocab_mapping_file)",
    }
    if skipped:
        key["skipped_corrupt_sample_ids"] = sorted(skipped)
    return mapping_from_counts(counts, draft_vocab_size, key=key)


def _read_map(path: str) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``(d2t, t2d, key)`` of the vocab map file at ``path``, as stored (``key`` {} when it has none).

    Raises:
        CheckpointError: a file that cannot be read as a vocab map (missing, not safetensors / torch, no ``d2t`` or
            ``t2d`` tensor, a key that is not a JSON object), naming it.
    """
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
                stored = set(f.keys())  # (a safe_open handle has no `in`)
                obj: Any = {name: f.get_tensor(name) for name in ("d2t", "t2d") if name in stored}
            key = json.loads(meta[_META_KEY]) if _META_KEY in meta else {}
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
            key = dict(obj.get("eagle_io_key") or {}) if isinstance(obj, dict) else {}
    except Exception as e:  # each loader's own errors (OSError, SafetensorError, UnpicklingError, JSON...)
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path}: cannot read a vocab map: {why}", path) from e
    if not isinstance(obj, dict) or not isinstance(key, dict):
        raise CheckpointError(f"{path}: not a vocab map (a dict of d2t and t2d, and the eagle-io key)", path)
    for name in ("d2t", "t2d"):
        if not isinstance(obj.get(name), torch.Tensor):
            raise CheckpointError(
                f"{path}: holds no {name} tensor: a vocab map holds d2t [draft vocab] and t2d [target vocab] "
                "(`eagle-io vocab-map` writes one)",
                path,
            )
    return obj["d2t"], obj["t2d"], key


def load_vocab_mapping(
    path: str | os.PathLike[str],
    *,
    dataset: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    dataset_sha256: str | None = None,
    target_vocab_size: int | None = None,
    draft_vocab_size: int | None = None,
) -> VocabMapping:
    """Loads a mapping written by :meth:`VocabMapping.save` and checks its key against the expectations given.

    Args:
        dataset: path(s) whose :func:`dataset_fingerprint` the mapping must carry (or pass ``dataset_sha256``).
        target_vocab_size, draft_vocab_size: sizes it must have.

    Raises:
        VocabMappingMismatchError: the key differs (names the file and both values of each field), or the file
            has no eagle-io key (e.g. a bare SpecForge ``vocab_mapping.pt``) while an expectation was given.
        CheckpointError: (an ``InvalidArgumentError``) a file that is not a vocab map, or whose tensors break an
            invariant as stored (:func:`mapping_problems`: every problem, naming the file).
        InvalidArgumentError: the tensors break an invariant against the key (:func:`validate_mapping`), naming it.
    """
    path = os.fspath(path)
    d2t, t2d, key = _read_map(path)
    # The values first, as stored: a float d2t was cast to integers, an integer t2d to bool, before they were checked.
    problems = mapping_problems(d2t, t2d, None, int(t2d.shape[0]) if t2d.dim() == 1 else None)
    if problems:
        raise CheckpointError(f"{path}: " + "; ".join(problems), path)
    if dataset is not None:
        dataset_sha256 = dataset_fingerprint(dataset)
    if not key and any(v is not None for v in (dataset_sha256, target_vocab_size, draft_vocab_size)):
        raise VocabMappingMismatchError(f"{path} carries no eagle-io key: cannot prove it fits this dataset")
    key.setdefault("draft_vocab_size", int(d2t.shape[0]))
    key.setdefault("target_vocab_size", int(t2d.shape[0]))
    mapping = VocabMapping(d2t=d2t.to(torch.int64), t2d=t2d, key=key)
    mapping.check(
        dataset_sha256=dataset_sha256,
        target_vocab_size=target_vocab_size,
        draft_vocab_size=draft_vocab_size,
        source=path,
    )
    return mapping


def draft_vocab_mapping(draft_dir: str | os.PathLike[str], *, target_vocab_size: int | None = None) -> VocabMapping:
    """The vocabulary map an exported draft serves with (its ``d2t`` and ``t2d`` tensors), to train a successor on
    exactly that map (``train-draft --keep-vocab-map``): SGLang's worker copies a draft's map once at start, so a
    draft swapped in place (``swap-draft``) must carry the served one. The key is the one the draft records
    (``config.json`` ``eagle_io.vocab_map``), plus ``kept_from`` (the directory).

    Raises:
        CheckpointError: a directory without a ``d2t`` / ``t2d`` tensor, or whose tensors break the map's invariants
            (:func:`mapping_problems`), naming it.
        VocabMappingMismatchError: its target vocabulary is not ``target_vocab_size``.
    """
    from ..sglang.checkpoint import read_draft, read_tensor_values

    info = read_draft(draft_dir)
    if info.d2t is None or info.t2d is None:
        raise CheckpointError(
            f"{info.path}: holds no d2t / t2d tensor: not an EAGLE-3 draft with a vocab map", info.path
        )
    d2t = read_tensor_values(info.path, info.d2t).to(torch.int64)
    t2d = read_tensor_values(info.path, info.t2d).to(torch.bool)
    problems = mapping_problems(d2t, t2d, None, int(t2d.shape[0]))
    if problems:
        raise CheckpointError(f"{info.path}: " + "; ".join(problems), info.path)
    recorded = (info.eagle_io_record or {}).get("vocab_map")
    key = {**(recorded if isinstance(recorded, dict) else {}), "kept_from": str(info.path)}
    key.update(draft_vocab_size=int(d2t.shape[0]), target_vocab_size=int(t2d.shape[0]))
    mapping = VocabMapping(d2t=d2t, t2d=t2d, key=key)
    mapping.check(target_vocab_size=target_vocab_size, source=f"the vocab map of {info.path}")
    return mapping
