"""One target identity: what a dataset records of the target it was captured from, and the one comparison every
command makes where a target meets a dataset (``train-draft``'s ``--target-model``, ``eval-draft``'s ``--target``).

The record (docs/FORMAT.md 2.1, written by :func:`eagle_io.store.metadata.eagle3_metadata`): ``architecture``,
``num_layers``, ``hidden_size``, ``vocab_size`` and, where the capture hashed them, the sha256 of the target's
files (``target_model.files``). A target whose shape differs is another model (its teacher head and embedding are
not the ones the states came from); one of the same shape whose files hash differently has other weights. The
refusal names each difference; ``--allow-other-target`` is the explicit way past the files' sha256 (and a
``model_id``, the directory or file name, that differs), never past the shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import IncompatibleDatasetError

__all__ = ["SHAPE_KEYS", "dataset_target", "require_same_target", "target_differences"]

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


def _hashes(record: Mapping[str, Any]) -> dict[str, str]:
    files = record.get("files") if isinstance(record.get("files"), list) else []
    return {
        str(f["name"]): str(f["sha256"])
        for f in files
        if isinstance(f, Mapping) and f.get("name") is not None and f.get("sha256")
    }


def target_differences(
    recorded: Mapping[str, Any], actual: Mapping[str, Any], *, allow_other_target: bool = False
) -> list[str]:
    """Each way ``actual`` (a loaded target's ``load_target`` info) is not the ``recorded`` target, one phrase
    each (``"num_layers 10 recorded, 8 here"``); a fact either side lacks is not compared. With
    ``allow_other_target``, the files' sha256 and the ``model_id`` are not compared."""
    out = []
    for key in SHAPE_KEYS:
        want, got = recorded.get(key), actual.get(key)
        if want is not None and got is not None and want != got:
            out.append(f"{key} {want!r} recorded, {got!r} here")
    if allow_other_target:
        return out
    want_files, got_files = _hashes(recorded), _hashes(actual)
    if want_files and got_files and want_files != got_files:
        changed = sorted(n for n in want_files.keys() & got_files.keys() if want_files[n] != got_files[n])
        if changed:
            shown = ", ".join(f"{n} ({want_files[n][:12]}... recorded, {got_files[n][:12]}... here)" for n in changed)
            out.append(f"the files' sha256 differ: {shown}")
        else:
            out.append(f"other files: {sorted(want_files)} recorded, {sorted(got_files)} here")
    want_id, got_id = recorded.get("model_id"), actual.get("model_id")
    if want_id and got_id and want_id != got_id and not (want_files and want_files == got_files):
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
