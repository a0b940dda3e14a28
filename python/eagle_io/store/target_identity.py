"""One target identity: what a dataset records of the target it was captured from, and the one comparison every
command makes where a target meets a dataset (``train-draft``'s ``--target-model``, ``eval-draft``'s ``--target``).

The record (docs/FORMAT.md 2.1, written by :func:`eagle_io.store.metadata.eagle3_metadata`): ``architecture``,
``num_layers``, ``hidden_size``, ``vocab_size`` and the target's files (``target_model.files``: each one's size,
sha256 and, for a large one, ``sampled_sha256``: :func:`eagle_io.capturing.weights.target_files`). A target whose
shape differs is another model (its teacher head and embedding are not the ones the states came from); one of the
same shape whose files differ has other weights. A file is compared by the strongest fact both sides hold: its
sha256, else its sampled sha256, else its size (a dataset written before the sampled identity records the sha256 of
every file, or sizes only; the sha256 of a large file is compared when the target's is asked for in full). The
refusal names each difference; ``--allow-other-target`` is the explicit way past the files (and a ``model_id``, the
directory or file name, that differs), never past the shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import IncompatibleDatasetError

__all__ = ["FILE_FACTS", "SHAPE_KEYS", "dataset_target", "require_same_target", "target_differences"]

#: The facts of a target that decide what its states are: a difference is never passed.
SHAPE_KEYS = ("architecture", "num_layers", "hidden_size", "vocab_size")


def dataset_target(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The target record of a dataset's metadata: ``model_id``, ``architecture``, ``files`` (from
    ``target_model``) and ``num_layers``, ``hidden_size``, ``vocab_size``; keys the dataset does not record are
    left out."""
    tm = metadata.get("target_model") if isinstance(metadata.get("target_model"), Mapping) else {}
    out: dict[str, Any] = {k: tm[k] for k in ("model_id", "architecture", "files") if tm.get(k) is not None}
    out |= {k: metadata[k] for k in ("num_layers", "hidden_size", "vocab_size") if metadata.get(k) is not None}
    return out


#: A file's facts, strongest first: the first both records hold is compared.
FILE_FACTS = ("sha256", "sampled_sha256", "size")


def _files(record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    files = record.get("files") if isinstance(record.get("files"), list) else []
    return {
        str(f["name"]): {k: f[k] for k in FILE_FACTS if f.get(k) is not None}
        for f in files
        if isinstance(f, Mapping) and f.get("name") is not None
    }


def _short(value: Any) -> str:
    return f"{value[:12]}..." if isinstance(value, str) else f"{value}"


def target_differences(
    recorded: Mapping[str, Any], actual: Mapping[str, Any], *, allow_other_target: bool = False
) -> list[str]:
    """Each way ``actual`` (a target's identity: ``load_target``'s info, ``TargetHead.identity``) is not the
    ``recorded`` target, one phrase each (``"num_layers 10 recorded, 8 here"``); a fact either side lacks is not
    compared. Files (module docstring): ``"the files' sha256 differ: model.safetensors (ab12... recorded, cd34...
    here)"``, or ``"other files: [...] recorded, [...] here"`` when none in common differs but the names do. With
    ``allow_other_target``, the files and the ``model_id`` are not compared."""
    out = []
    for key in SHAPE_KEYS:
        want, got = recorded.get(key), actual.get(key)
        if want is not None and got is not None and want != got:
            out.append(f"{key} {want!r} recorded, {got!r} here")
    if allow_other_target:
        return out
    want_files, got_files = _files(recorded), _files(actual)
    want_files = {n: f for n, f in want_files.items() if f}
    got_files = {n: f for n, f in got_files.items() if f}
    changed: dict[str, list[str]] = {}
    for name in sorted(want_files.keys() & got_files.keys()):
        fact = next((k for k in FILE_FACTS if k in want_files[name] and k in got_files[name]), None)
        want, got = want_files[name].get(fact), got_files[name].get(fact)
        if fact is not None and want != got:
            changed.setdefault(fact, []).append(f"{name} ({_short(want)} recorded, {_short(got)} here)")
    for fact, shown in changed.items():
        out.append(f"the files' {fact.replace('_', ' ')} differ: {', '.join(shown)}")
    if want_files and got_files and not changed and want_files.keys() != got_files.keys():
        out.append(f"other files: {sorted(want_files)} recorded, {sorted(got_files)} here")
    want_id, got_id = recorded.get("model_id"), actual.get("model_id")
    same_files = want_files and want_files.keys() == got_files.keys() and not changed
    if want_id and got_id and want_id != got_id and not same_files:
        out.append(f"model_id {want_id!r} recorded, {got_id!r} here")
    return out


def require_same_target(
    recorded: Mapping[str, Any], actual: Mapping[str, Any], *, where: str, option: str, allow_other_target: bool
) -> None:
    """Refuses ``actual`` when it is not the ``recorded`` target (:func:`target_differences`).

    Args:
        where: what recorded it (the dataset's manifest).
        option: the option that named the target (``--target-model``), for the message.

    Raises:
        IncompatibleDatasetError: names every difference, and ``--allow-other-target`` when only the files or the
            name differ.
    """
    diffs = target_differences(recorded, actual, allow_other_target=allow_other_target)
    if not diffs:
        return
    shape = any(d.split(" ", 1)[0] in SHAPE_KEYS for d in diffs)
    way = (
        "pass the target the data was captured from"
        if shape
        else "pass the target the data was captured from, or --allow-other-target if these are the same weights "
        "(re-saved, renamed)"
    )
    raise IncompatibleDatasetError(
        f"{option} {actual.get('model_id')!r} is not the target {where} was captured from: {'; '.join(diffs)}: {way}"
    )
