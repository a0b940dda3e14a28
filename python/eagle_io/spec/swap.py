"""``swap-draft``: an exported EAGLE-3 draft loaded into a running SGLang 0.5.23 server in place, then proven.

The flow (:func:`swap_draft`), over a per-worker transport ``call(route, body, control)`` (:func:`http_call`: one
server, or one worker behind SGLang's gateway through its control plane):

1. **Preflight, nothing sent.** ``GET /server_info`` names the served target and draft (``model_path``,
   ``speculative_draft_model_path``, on this host). The new draft must pass ``check-serving``'s checks against the
   served target (:func:`eagle_io.serving.preflight.check_serving`) and equal the served draft in architecture,
   every tensor's name and shape, layer ids, target record and vocabulary map (SGLang's worker copies the map once at
   start); its tensors must read whole (a truncated file) and be finite. Each difference is one line of the
   :class:`~eagle_io.errors.DraftSwapError` (``sent=False``).
2. **The update**, each call naming ``selector: "draft"`` (SGLang's default ``"all"`` would load the draft's tensors
   into the target): ``POST /begin_weight_update``, ``/update_weights_from_tensor`` (``weight_version`` naming the
   draft, ``flush_cache``), ``/end_weight_update`` (``srt/managers/scheduler_components/weight_updater.py``). The
   tokenizer manager takes its model-update writer lock for each: requests in flight finish on the old draft first
   (speculative decoding is lossless either way), new ones wait for the update. The shared embedding and the
   vocabulary map are never sent (:mod:`eagle_io.sglang.draft_weights`).
3. **Read back**: ``/weights_checker`` (``action: checksum``, ``selector: draft``) against the checksums the new
   tensors give (:func:`eagle_io.sglang.draft_weights.served_checksums`; a CPU server's hash convention).
4. **Served accept length**: greedy ``/generate`` on fixed prompts, SGLang's pooled count (sum
   ``completion_tokens`` / sum ``spec_verify_ct``, :mod:`eagle_io.spec.served`) at least
   :data:`~eagle_io.defaults.SWAP_ACCEPT_FLOOR` and :data:`~eagle_io.defaults.SWAP_ACCEPT_FRACTION` of what the new
   draft's ``speculation_profile.json`` predicts: the failures reported on this path were silent, accept length
   about 1.0 with every call answering 200.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import defaults
from ..errors import CheckpointError, DraftSwapError, EagleIOError, SGLangError
from ..interop.speculation_profile import expected_accept_length, read_profile
from ..serving.preflight import ERROR, check_serving
from ..sglang.checkpoint import DraftInfo, read_draft, read_tensor_values
from ..sglang.draft_weights import (
    nonfinite_problems,
    read_draft_tensors,
    sent_tensors,
    serialized_tensors,
    served_checksums,
)
from ..sglang.gateway import Route
from ..sglang.servers import ServerKeys
from .served import ServedRun, decode_prompts

__all__ = ["Call", "SwapResult", "http_call", "swap_draft", "weight_version_of"]

Call = Callable[[str, "Mapping[str, Any] | None", bool], Any]
"""``call(route, body, control)``: ``body`` POSTed as JSON to one worker's ``route`` (None: a GET), ``control`` for the
routes SGLang's admin key guards; returns the decoded JSON answer, raises :class:`~eagle_io.errors.SGLangError`."""


def http_call(server: str | Route, keys: ServerKeys | None = None,
              timeout_s: float = defaults.SERVER_REQUEST_TIMEOUT_S) -> Call:  # fmt: skip
    """The transport to one SGLang worker: a server's URL, or a :class:`~eagle_io.sglang.gateway.Route` (a worker
    behind SGLang's gateway, reached through its control plane: ``keys`` the gateway's inference and control-plane
    keys), through :meth:`Route.call <eagle_io.sglang.gateway.Route.call>`."""
    route = server if isinstance(server, Route) else Route.direct(server)

    def call(path: str, body: Mapping[str, Any] | None, control: bool) -> Any:
        return route.call(path.lstrip("/"), body, keys=keys, control=control, timeout_s=timeout_s)

    return call


@dataclass
class SwapResult:
    """A swap that was proven: ``weight_version`` the version sent, ``sent`` the tensors sent, ``checked`` the
    checksums read back equal to the new draft's (0 where the server's hash convention is not the CPU one: ``why``
    says so), ``run`` the check prompts as SGLang served them after the swap, ``threshold`` the accept length it had
    to reach and ``expected`` the profile's prediction (None without one), ``seconds`` the update's wall time."""

    weight_version: str
    sent: int
    checked: int
    why_unchecked: str | None
    run: ServedRun
    threshold: float
    expected: float | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "weight_version": self.weight_version,
            "tensors_sent": self.sent,
            "checksums_matched": self.checked,
            "checksums_unchecked": self.why_unchecked,
            "sglang_accept_length": self.run.sglang_accept_length,
            "accept_length": self.run.histogram.accept_length,
            "request_verify_ct": list(self.run.verify_ct),
            "accept_threshold": self.threshold,
            "profile_accept_length": self.expected,
            "update_seconds": self.seconds,
        }


def weight_version_of(draft: str | os.PathLike[str]) -> str:
    """``DIRNAME@SHA`` naming an exported draft: its directory's name and the first 12 hex digits of the SHA-256 over
    its ``*.safetensors`` files' bytes (sorted by name)."""
    d = Path(draft).resolve()
    h = hashlib.sha256()
    for f in sorted(d.glob("*.safetensors")):
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return f"{d.name}@{h.hexdigest()[:12]}"


def _refuse(lines: Sequence[str], what: str, *, sent: bool) -> DraftSwapError:
    return DraftSwapError(f"{what}:\n" + "\n".join(f"  {line}" for line in lines), sent=sent)


def _served(info: Mapping[str, Any], where: str) -> tuple[str, Path, Path]:
    """``(algorithm, target dir, served draft dir)`` of ``/server_info``; refuses a server without a draft or whose
    directories are not on this host."""
    algo, draft, target = (info.get(k) for k in ("speculative_algorithm", "speculative_draft_model_path", "model_path"))
    if not algo or not draft:
        raise DraftSwapError(
            f"{where} serves no draft (speculative_algorithm {algo!r}, speculative_draft_model_path {draft!r}): "
            "nothing to swap; launch it with --speculative-algorithm EAGLE3 --speculative-draft-model-path DIR",
            sent=False,
        )
    missing = [str(p) for p in (target, draft) if not Path(str(p)).is_dir()]
    if missing:
        raise DraftSwapError(
            f"{where} serves {', '.join(missing)}, not a directory on this host: swap-draft passes tensors through "
            "shared memory to a server on this host only (docs/SERVING.md, 'Swapping the draft in place')",
            sent=False,
        )
    return str(algo), Path(str(target)), Path(str(draft))


def _differences(new: DraftInfo, old: DraftInfo) -> list[str]:
    """What the new draft must share with the served one for SGLang to take it in place, one line each."""
    out = []
    if new.architectures != old.architectures:
        out.append(f"architecture {new.architecture}, served {old.architecture}")
    for key in ("hidden_size", "target_hidden_size", "draft_vocab_size", "vocab_size"):
        a, b = new.get(key), old.get(key)
        if a != b:
            out.append(f"{key} {a}, served {b}")
    if new.eagle_layer_ids != old.eagle_layer_ids:
        out.append(f"eagle_aux_hidden_state_layer_ids {new.eagle_layer_ids}, served {old.eagle_layer_ids}")
    new_t = (new.eagle_io_record or {}).get("target") or {}
    old_t = (old.eagle_io_record or {}).get("target") or {}
    for key in sorted(set(new_t) | set(old_t)):
        if new_t.get(key) != old_t.get(key):
            out.append(f"trained for target {key} {new_t.get(key)!r}, the served draft for {old_t.get(key)!r}")
    for name in sorted(set(new.tensors) | set(old.tensors)):
        a, b = new.tensors.get(name), old.tensors.get(name)
        if a is None or b is None:
            out.append(f"tensor {name}: {'absent' if a is None else 'present'} here, "
                       f"{'absent' if b is None else 'present'} in the served draft")  # fmt: skip
        elif a.shape != b.shape:
            out.append(f"tensor {name} {list(a.shape)}, served {list(b.shape)}")
    return out


def _vocab_differences(tensors: Mapping[str, Any], old: DraftInfo) -> list[str]:
    """The new draft's vocabulary map (its loaded ``tensors``) must be the served one's, value for value."""
    out = []
    for leaf in ("d2t", "t2d"):
        va, b = tensors.get(leaf), getattr(old, leaf)
        if va is None or b is None or list(va.shape) != list(b.shape):
            continue  # named by _differences
        vb = read_tensor_values(old.path, b)
        if not bool((va == vb).all()):
            out.append(
                f"vocab map {leaf}: {int((va != vb).sum())} of {va.numel()} entries differ from the served draft's "
                "(SGLang copies the map at start: train the new draft with `train-draft --keep-vocab-map "
                f"{old.path}`)"
            )
    return out


def _preflight(info: Mapping[str, Any], draft: Path, where: str) -> tuple[Path, dict[str, Any]]:
    """The served draft's directory and the new draft's tensors, or every reason to refuse."""
    algo, target, served = _served(info, where)
    lines: list[str] = []
    try:
        new = read_draft(draft)
    except CheckpointError as e:
        raise _refuse([str(e)], f"{draft}: not a draft SGLang can load", sent=False) from None
    old = read_draft(served)
    lines += [f"{f.code}: {f.message}" for f in check_serving(target, draft, algorithm=algo) if f.severity == ERROR]
    lines += _differences(new, old)
    tensors: dict[str, Any] = {}
    try:
        tensors = read_draft_tensors(draft)
    except CheckpointError as e:
        lines.append(str(e))
    lines += _vocab_differences(tensors, old)
    lines += nonfinite_problems(tensors)
    if lines:
        raise _refuse(lines, f"{draft} cannot replace the draft {where} serves ({served})", sent=False)
    return served, tensors


def _readback(call: Call, info: Mapping[str, Any], tensors: Mapping[str, Any]) -> tuple[int, str | None, list[str]]:
    """``(checksums matched, why none were checked, mismatches)`` from ``/weights_checker`` (selector draft)."""
    import torch

    answer = call("/weights_checker", {"action": "checksum", "selector": "draft"}, True)
    if str(info.get("device")) != "cpu":
        return 0, f"device {info.get('device')!r}: SGLang hashes its tensors there with a kernel of its own", []
    dtype = getattr(torch, str(info.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        return 0, f"dtype {info.get('dtype')!r}: not one torch names", []
    expected = served_checksums(tensors, dtype)
    served: dict[str, set[str]] = {}
    for rank in answer.get("ranks") or []:
        for key, value in (rank.get("checksums") or {}).items():
            role, _, name = key.partition(".")
            if role.startswith("draft"):
                served.setdefault(name, set()).add(str(value))
    bad = []
    for name, want in sorted(expected.items()):
        got = served.get(name)
        if got != {want}:
            bad.append(f"{name}: served checksum {sorted(got) if got else 'absent'}, the new draft's {want}")
    return len(expected) - len(bad), None, bad


def _update(call: Call, tensors: Mapping[str, Any], version: str, tp_size: int) -> None:
    """begin -> update -> end, each naming the draft selector; ``end`` is sent once ``begin`` succeeded, whatever
    the update did. ``tensors`` (the caller's) keep the shared-memory storages alive until the server answered.
    Raises :class:`DraftSwapError` (``sent`` True once the update was sent)."""
    named = sorted(sent_tensors(tensors).items())
    payload = serialized_tensors(named)
    try:
        call("/begin_weight_update", {"selector": "draft"}, True)
    except SGLangError as e:
        raise DraftSwapError(f"/begin_weight_update (selector draft) refused: {e}", sent=False, status=e.status) from e
    failure: SGLangError | None = None
    try:
        call("/update_weights_from_tensor",
             {"serialized_named_tensors": [payload] * tp_size, "selector": "draft", "weight_version": version,
              "flush_cache": True}, True)  # fmt: skip
    except SGLangError as e:
        failure = e
    finally:
        try:
            call("/end_weight_update", {"selector": "draft"}, True)
        except SGLangError as e:
            failure = failure or e
    if failure is not None:
        raise DraftSwapError(
            f"the weight update of {version} failed: {failure}; the served draft may be partly updated: swap again or "
            "restart the server",
            sent=True,
            status=failure.status,
        )


def swap_draft(
    call: Call,
    draft: str | os.PathLike[str],
    *,
    prompts: Sequence[Sequence[int]] | None = None,
    max_new_tokens: int = defaults.SWAP_MAX_NEW_TOKENS,
    stop_token_ids: Sequence[int] = (),
    accept_floor: float = defaults.SWAP_ACCEPT_FLOOR,
    accept_fraction: float = defaults.SWAP_ACCEPT_FRACTION,
    weight_version: str | None = None,
    where: str = "the server",
) -> SwapResult:
    """Loads the exported draft ``draft`` into the server behind ``call`` in place of the one it serves, then proves
    it (module docstring: preflight, update, read back, served accept length).

    Args:
        call: the worker's transport (:func:`http_call`).
        prompts: token ids of the check prompts (default :data:`~eagle_io.defaults.SWAP_PROMPTS`), decoded greedily
            for ``max_new_tokens`` each, ending at ``stop_token_ids``.
        accept_floor / accept_fraction: the swap is refused as collapsed when SGLang's pooled accept length (sum
            ``completion_tokens`` / sum ``spec_verify_ct``) is below ``accept_floor`` or below ``accept_fraction``
            of the accept length the draft's ``speculation_profile.json`` predicts at the served steps.
        weight_version: the version the server reports with answers after the swap (default
            :func:`weight_version_of`).
        where: the worker's name in messages.

    Raises:
        DraftSwapError: a refusal before anything is sent (``sent`` False: a server without a draft, a draft that
            differs from the served one or does not pass ``check-serving``, a truncated file, NaN/Inf weights), a
            failed update, checksums read back that are not the new draft's, or a collapsed accept length (``sent``
            True), each reason on its own line.
        SGLangError: the server did not answer as an SGLang server.
    """
    draft = Path(draft)
    info = call("/server_info", None, False)
    _, tensors = _preflight(info, draft, where)
    version = weight_version or weight_version_of(draft)
    t0 = time.perf_counter()
    _update(call, tensors, version, int(info.get("tp_size") or 1))
    seconds = time.perf_counter() - t0
    checked, why, bad = _readback(call, info, tensors)
    if bad:
        raise _refuse(bad, f"{where}: the draft weights read back are not {version}'s", sent=True)
    try:
        checks = prompts or defaults.SWAP_PROMPTS  # the settings decoded under are the server's: info, read above
        run = decode_prompts(info, lambda body: call("/generate", body, False), checks, max_new_tokens,
                             stop_token_ids, concurrency=len(checks), where="swap-draft's check prompts")  # fmt: skip
    except EagleIOError as e:
        raise DraftSwapError(f"{where}: the check prompts failed after the swap to {version}: {e}", sent=True) from e
    profile = read_profile(draft)
    expected = expected_accept_length(profile, run.num_steps) if profile else None
    threshold = max(accept_floor, accept_fraction * expected if expected else 0.0)
    served = run.sglang_accept_length
    if served is None or served < threshold:
        said = "no verify step" if served is None else f"{served:.3f}"
        basis = f"floor {accept_floor}" + (f", {accept_fraction} x the profile's {expected:.3f}" if expected else "")
        raise DraftSwapError(
            f"{where}: served accept length {said} after the swap to {version} is below {threshold:.3f} ({basis}): a "
            "collapsed swap (SGLang's pooled count, sum completion_tokens / sum spec_verify_ct, over "
            f"{len(run.verify_ct)} check prompts)",
            sent=True,
        )
    return SwapResult(version, len(sent_tensors(tensors)), checked, why, run, threshold, expected, seconds)
