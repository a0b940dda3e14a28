"""``speculation_profile.json``: what a draft is expected to achieve, kept next to its checkpoint, and
``training_samples.json``: which samples it was trained on.

The profile follows the shape NVIDIA ModelOpt's open proposal attaches to exported drafts (per-position conditional
and joint accept rates, the histogram, the mean accept length), in SGLang's convention (bonus token counted, counts
pooled: :mod:`eagle_io.draft.acceptance`). ``eagle-io eval-draft`` writes it from a live and an offline measurement,
``eagle-io train-draft`` from the held-out offline one; the SGLang plugin's acceptance watchdog reads it
(:func:`expected_accept_length`) to know what to expect from the served draft. Keys (version 1):

* ``format``: ``"eagle-io speculation profile"``, ``version``: 1, ``eagle_io_version``.
* ``num_steps``, ``topk`` (1), ``algorithm`` (``"EAGLE3"``): the launch the figures are for.
* ``accept_length``, ``per_position_accept_rate`` (joint), ``per_position_conditional``, ``correct_drafts_histogram``:
  from ``source`` (``"live"`` when a live measurement made a verify step, else ``"offline"``).
* ``live`` / ``offline``: each measurement's own figures, or null.
* ``data``: ``dataset_sha256`` (:func:`eagle_io.interop.vocab.dataset_fingerprint`), ``source_dataset``,
  ``samples``, ``sample_ids`` measured on; ``target``: the target's ``model_id``.
* ``definition``: the definition in words.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, InvalidArgumentError
from ..store import layout

__all__ = [
    "PROFILE_NAME",
    "PROFILE_VERSION",
    "TRAINING_SAMPLES_NAME",
    "build_profile",
    "expected_accept_length",
    "figure_problems",
    "read_profile",
    "read_training_samples",
    "write_json",
]

PROFILE_NAME = "speculation_profile.json"
PROFILE_VERSION = 1
TRAINING_SAMPLES_NAME = "training_samples.json"
_TOL = 1e-6  # how far figures read back from JSON may stray from their definition (float rounding only)
_FORMAT = "eagle-io speculation profile"
DEFINITION = (
    "accept length per verify step = accepted drafts + 1 (the bonus token), pooled over all verify steps "
    "(SGLang's accept_* metrics); per_position_accept_rate[k-1] = share of steps whose first k drafts were all "
    "accepted, so accept_length = 1 + sum(per_position_accept_rate); per_position_conditional[k-1] = the same among "
    "steps that accepted drafts 1..k-1"
)


def build_profile(
    *,
    num_steps: int,
    live: Mapping[str, Any] | None,
    offline: Mapping[str, Any] | None,
    data: Mapping[str, Any],
    target: Mapping[str, Any],
) -> dict[str, Any]:
    """The profile dict. ``live`` / ``offline``: :meth:`eagle_io.draft.AcceptHistogram.to_dict`-shaped figures
    (``accept_length``, ``per_position_accept_rate``, ``per_position_conditional``, ``correct_drafts_histogram``).
    The profile's figures are the live ones where the live run made a verify step, else the offline ones.

    Raises:
        InvalidArgumentError: neither measurement has an accept length (no verify step was counted).
    """
    from .._native import __version__

    has_live = bool(live) and live.get("accept_length") is not None
    main, source = (live, "live") if has_live else (offline, "offline")
    if not main or main.get("accept_length") is None:  # was a CheckpointError without its path: a TypeError
        raise InvalidArgumentError("a speculation profile needs a live or an offline measurement with an accept length")
    return {
        "format": _FORMAT,
        "version": PROFILE_VERSION,
        "eagle_io_version": __version__,
        "num_steps": int(num_steps),
        "topk": 1,
        "algorithm": "EAGLE3",
        "source": source,
        "accept_length": main["accept_length"],
        "per_position_accept_rate": list(main["per_position_accept_rate"]),
        "per_position_conditional": list(main["per_position_conditional"]),
        "correct_drafts_histogram": list(main["correct_drafts_histogram"]),
        "live": dict(live) if live else None,
        "offline": dict(offline) if offline else None,
        "data": dict(data),
        "target": dict(target),
        "definition": DEFINITION,
    }


def _integer(x: Any) -> bool:
    """A JSON integer (``true`` / ``false`` are Python ints too, and are not)."""
    return isinstance(x, int) and not isinstance(x, bool)


def write_json(path: str | os.PathLike[str], obj: Any) -> str:
    """Writes ``obj`` as indented JSON atomically (:func:`eagle_io.store.layout.write_atomic`); returns the path."""
    layout.write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())
    return os.fspath(path)


def _read(path: Path, what: str) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read the {what}: {e}", path) from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: the {what} is not a JSON object", path)
    return data


def _number(x: Any) -> bool:
    """A finite JSON number (not ``true`` / ``false``, not NaN or Infinity, which Python's json reads)."""
    return (_integer(x) or isinstance(x, float)) and math.isfinite(x)


def _rate(x: Any) -> bool:
    return _number(x) and 0.0 <= x <= 1.0


def figure_problems(fig: Mapping[str, Any], num_steps: int, *, measured: bool = True) -> list[str]:
    """Every way the figures of one measurement (``accept_length``, ``per_position_accept_rate``,
    ``per_position_conditional``, ``correct_drafts_histogram``: :meth:`eagle_io.draft.AcceptHistogram.to_dict`)
    cannot be true at ``num_steps`` drafts per verify, one sentence each naming the field, its value and why; empty
    when they hold together (the module's definition: joint rates in [0, 1] that never rise, ``accept_length = 1 +
    sum(rates)`` in ``[1, num_steps + 1]``, ``joint[k] = joint[k-1] x conditional[k]``, rates the histogram's tail
    shares). ``measured`` False: ``accept_length`` may be null (a measurement without a verify step)."""
    out = []
    rates = fig.get("per_position_accept_rate")
    rates_ok = isinstance(rates, list) and len(rates) == num_steps and all(_rate(r) for r in rates)
    if not rates_ok:
        out.append(f"per_position_accept_rate {rates!r} is not num_steps ({num_steps}) rates in [0, 1]")
    elif any(b > a + _TOL for a, b in itertools.pairwise(rates)):
        out.append(f"per_position_accept_rate {rates} rises: joint rates (the first k drafts all accepted) never do")
        rates_ok = False
    al = fig.get("accept_length")
    unmeasured = al is None and not measured  # no verify step: no conditional rate is defined
    if not unmeasured and (not _number(al) or not 1.0 <= al <= num_steps + 1):
        out.append(
            f"accept_length {al!r} is not a number in [1, num_steps + 1 = {num_steps + 1}]: a verify step accepts its "
            "bonus token and at most num_steps drafts"
        )
    elif not unmeasured and rates_ok and abs(al - (1.0 + sum(rates))) > _TOL:
        out.append(
            f"accept_length {al} contradicts per_position_accept_rate {rates}: it is 1 + their sum "
            f"= {1.0 + sum(rates):.6g}"
        )
    cond = fig.get("per_position_conditional")
    if cond is not None:
        if not isinstance(cond, list) or len(cond) != num_steps or not all(c is None or _rate(c) for c in cond):
            out.append(f"per_position_conditional {cond!r} is not num_steps ({num_steps}) rates in [0, 1] (or null)")
        elif rates_ok and not unmeasured:
            before = 1.0  # joint[k-1]; joint[k] = joint[k-1] * conditional[k] (null: no step got that far)
            for k, (c, joint) in enumerate(zip(cond, rates, strict=True)):
                if abs(joint - before * (0.0 if c is None else c)) > _TOL or (c is None and before > _TOL):
                    out.append(
                        f"per_position_conditional[{k}] {c} contradicts per_position_accept_rate[{k}] {joint}: the "
                        f"joint rate is the previous one ({before}) times the conditional one"
                    )
                    break
                before = joint
    counts = fig.get("correct_drafts_histogram")
    if counts is not None:
        if (
            not isinstance(counts, list)
            or len(counts) != num_steps + 1
            or not all(_integer(c) and c >= 0 for c in counts)
        ):
            out.append(
                f"correct_drafts_histogram {counts!r} is not num_steps + 1 ({num_steps + 1}) counts (integers >= 0)"
            )
        elif rates_ok and sum(counts):
            n = sum(counts)
            tail = [sum(counts[k:]) / n for k in range(1, num_steps + 1)]
            if any(abs(a - b) > _TOL for a, b in zip(rates, tail, strict=True)):
                out.append(
                    f"correct_drafts_histogram {counts} contradicts per_position_accept_rate {rates}: rate k is the "
                    f"share of steps accepting k drafts or more ({[round(t, 6) for t in tail]})"
                )
    return out


def read_profile(draft_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``draft_dir``'s profile, or None when it has none.

    Raises:
        CheckpointError: an unreadable file, another format, a newer version, ``num_steps`` not an integer >= 1,
            ``topk`` not 1, or figures that cannot be true (:func:`figure_problems`: the profile's own, and those of
            its ``live`` / ``offline`` measurements), every problem named with its field, in one line naming the
            file. The one check of a profile: the plugin's acceptance watchdog and check-serving (a
            ``speculation-profile`` finding) both run it.
    """
    path = Path(draft_dir) / PROFILE_NAME
    prof = _read(path, "speculation profile")
    if prof is None:
        return None

    if prof.get("format") != _FORMAT or not _integer(prof.get("version")) or prof["version"] > PROFILE_VERSION:
        raise CheckpointError(
            f"{path}: not an eagle-io speculation profile of version <= {PROFILE_VERSION} "
            f"(format {prof.get('format')!r}, version {prof.get('version')!r})",
            path,
        )
    steps = prof.get("num_steps")
    if not _integer(steps) or steps < 1:
        raise CheckpointError(f"{path}: num_steps {steps!r} is not an integer >= 1 (drafts per verify step)", path)
    problems = []
    if prof.get("topk", 1) != 1 or isinstance(prof.get("topk"), bool):
        problems.append(f"topk {prof.get('topk')!r} is not 1: the figures are those of a chain draft")
    problems += figure_problems(prof, steps)
    for key in ("live", "offline"):
        fig = prof.get(key)
        if fig is None:
            continue
        own = fig.get("num_steps", steps) if isinstance(fig, dict) else None
        if not isinstance(fig, dict) or not _integer(own) or own < 1:
            problems.append(f"{key} {fig!r} is not a measurement (an object with num_steps >= 1) or null")
        else:
            problems += [f"{key}.{p}" for p in figure_problems(fig, own, measured=False)]
    if problems:
        raise CheckpointError(f"{path}: " + "; ".join(problems), path)
    return prof


def expected_accept_length(profile: Mapping[str, Any], num_steps: int) -> float:
    """The accept length the profile predicts at ``num_steps`` drafts per verify: ``1 + sum`` of its first
    ``num_steps`` joint per-position rates (exact for fewer steps than profiled: a chain accepting ``j`` of ``S``
    accepts ``min(j, s)`` of ``s``). More steps than profiled: the profiled value, a lower bound."""
    rates: Sequence[float] = profile["per_position_accept_rate"]
    return 1.0 + float(sum(rates[: max(0, int(num_steps))]))


def read_training_samples(draft_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``draft_dir``'s ``training_samples.json`` (``train_sample_ids``, ``held_out_sample_ids``,
    ``dataset_sha256``, ``source_dataset``), or None when absent.

    Raises:
        CheckpointError: unreadable, or what cannot be true, every problem named: ``train_sample_ids`` (or
            ``held_out_sample_ids``) not a list of sample ids (integers in ``[0, 2**64)``), a sample both trained on
            and held out, ``dataset_sha256`` / ``source_dataset`` neither a string nor null.
    """
    path = Path(draft_dir) / TRAINING_SAMPLES_NAME
    rec = _read(path, "training sample record")
    if rec is None:
        return None
    problems = []
    for key in ("train_sample_ids", "held_out_sample_ids"):
        ids = rec.get(key, [] if key == "held_out_sample_ids" else None)
        if not isinstance(ids, list) or not all(_integer(i) and 0 <= i < 2**64 for i in ids):
            problems.append(f"{key} must be a list of sample ids (integers in [0, 2**64))")
    if not problems:
        both = sorted(set(rec["train_sample_ids"]) & set(rec.get("held_out_sample_ids", [])))
        if both:
            problems.append(f"sample ids {both[:5]} are both trained on and held out ({len(both)} in all)")
    for key in ("dataset_sha256", "source_dataset"):
        if rec.get(key) is not None and not isinstance(rec[key], str):
            problems.append(f"{key} {rec[key]!r} is neither a string nor null")
    if problems:
        raise CheckpointError(f"{path}: " + "; ".join(problems), path)
    return rec
