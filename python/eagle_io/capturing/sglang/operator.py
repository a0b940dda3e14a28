"""What the operator of an SGLang server allows a remote capture, set on the server and read once in each scheduler
process (:class:`OperatorPolicy`): where a client may have the server write, how large a ring and how much live
traffic it may ask for, which of its options it may set, and whether clients may read hidden states.

* ``EAGLE_IO_CAPTURE_ROOT``: comma-separated local directories and/or ``s3://bucket/prefix`` roots. A start over HTTP
  is refused unless it is set and the ``out_dir`` lies under one of them: an absolute local path whose real path
  (symbolic links resolved) is inside a local root, with no ``..`` component; or an ``s3://`` URL under an ``s3://``
  root. An ``s3://`` capture stages its shards under the first local root (``.eagle-io-staging/BUCKET/PREFIX``), so
  it needs one. A capture started by environment (``EAGLE_IO_CAPTURE_DIR``) is the operator's own and needs no root.
* ``EAGLE_IO_CAPTURE_LIMITS``: a JSON object bounding what a client asks for: ``ring_bytes`` (default
  :data:`~eagle_io.defaults.CAPTURE_MAX_RING_BYTES`), ``max_inflight`` (default
  :data:`~eagle_io.defaults.LIVE_MAX_INFLIGHT`), ``sample_rate`` (default 1), ``max_samples_per_s``,
  ``max_tokens_per_s``, ``max_bytes_per_hour`` (default: none). A start asking for more is refused with the figures;
  a live cap the client leaves open is set to the operator's.
* ``EAGLE_IO_ALLOW_CLIENT_HIDDEN_STATES=1``: let requests other than eagle-io's own samples ask for hidden states
  (``return_hidden_states``); by default such a request is answered without them and counted.

A client's options are an allow-list (:data:`.protocol.CLIENT_WRITER_OPTIONS`, :data:`.protocol.CLIENT_METADATA`,
:data:`.protocol.CLIENT_TARGET_INFO`): the rest of the dataset's metadata comes from the server.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ... import defaults
from ...errors import CaptureRefusedError, InvalidArgumentError
from ..options import CaptureOptions
from .live import LivePolicy
from .protocol import (
    CLIENT_METADATA,
    CLIENT_TARGET_INFO,
    CLIENT_WRITER_OPTIONS,
    ENV_ALLOW_HIDDEN_STATES,
    ENV_CAPTURE_LIMITS,
    ENV_CAPTURE_ROOT,
)

__all__ = ["OperatorPolicy"]


_LIMITS = ("ring_bytes", "max_inflight", "sample_rate", "max_samples_per_s", "max_tokens_per_s", "max_bytes_per_hour")


@dataclass(frozen=True)
class OperatorPolicy:
    """The operator's bounds on remote captures (module docstring); :meth:`from_env` reads them.

    Attributes:
        roots: the capture roots, local ones as real paths, ``s3://`` ones ending in ``/``; empty: remote capture off.
        limits: ``ring_bytes``, ``max_inflight``, ``sample_rate`` and the live caps (None: no maximum).
        client_hidden_states: whether clients may ask for hidden states.
        problem: why the environment could not be read (remote starts are then refused, naming it), or None.
    """

    roots: tuple[str, ...] = ()
    limits: Mapping[str, float | None] = None  # type: ignore[assignment]
    client_hidden_states: bool = False
    problem: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorPolicy:
        """The policy of ``env`` (default: this process's environment). Never raises: a value it cannot read makes
        every remote start refused, naming the variable (serving goes on)."""
        env = os.environ if env is None else env
        hidden = env.get(ENV_ALLOW_HIDDEN_STATES, "0") == "1"
        try:
            roots = tuple(_root(r.strip()) for r in env.get(ENV_CAPTURE_ROOT, "").split(",") if r.strip())
            limits = _limits(env.get(ENV_CAPTURE_LIMITS))
        except InvalidArgumentError as e:
            return cls((), _limits(None), hidden, str(e))
        return cls(roots, limits, hidden, None)

    def posture(self, keys: str) -> str:
        """One line for the server's log: whether remote capture is on, under which roots and limits, and ``keys``
        (which of SGLang's keys guard the control route)."""
        if self.problem:
            return f"eagle-io SECURITY POSTURE: remote capture OFF ({self.problem}); control route guarded by {keys}"
        if not self.roots:
            return (f"eagle-io SECURITY POSTURE: remote capture OFF (set {ENV_CAPTURE_ROOT} to allow it); "
                    f"control route guarded by {keys}")  # fmt: skip
        shown = {k: v for k, v in self.limits.items() if v is not None}
        open_to = "any caller" if keys == "no key" else keys
        hidden = "allowed" if self.client_hidden_states else "off"
        return (f"eagle-io SECURITY POSTURE: remote capture ON under {list(self.roots)}, limits {shown}; control "
                f"route answers {open_to}; client hidden states {hidden}")  # fmt: skip

    def admit_start(
        self, out_dir: str, options: CaptureOptions, live: LivePolicy | None
    ) -> tuple[str, CaptureOptions, LivePolicy | None]:
        """A client's start, held to the operator's bounds: returns the ``out_dir`` to open (a local one as the real
        path that was checked; a directory under the root that untrusted local users can write stays open to a
        symbolic link swapped in between this check and the writer's open: keep roots writable by the server only),
        the options to run with
        (the staging of an ``s3://`` capture set under the first local root, checked like an ``out_dir``) and the
        live policy with its open caps set to the operator's.

        Raises:
            CaptureRefusedError: remote capture is off; ``out_dir`` not under a root (relative, ``..``, a symbolic
                link leaving the root, another scheme); an option outside the allow-lists; a figure over the
                operator's maximum (both named).
        """
        if self.problem:
            raise CaptureRefusedError(f"remote capture is off on this server: {self.problem}")
        if not self.roots:
            raise CaptureRefusedError(
                f"remote capture is off on this server: its operator has set no {ENV_CAPTURE_ROOT} (the directories "
                "or s3:// prefixes a client may have it write under)"
            )
        out_dir = _under_a_root(out_dir, self.roots)
        _allowed("writer option", options.writer_options, CLIENT_WRITER_OPTIONS)
        _allowed("metadata key", options.metadata, CLIENT_METADATA)
        _allowed("target_info key", options.target_info, CLIENT_TARGET_INFO)
        over = []
        cap = self.limits["ring_bytes"]
        if cap is not None and options.ring_bytes > cap:
            over.append(f"ring_bytes {options.ring_bytes:,} > {int(cap):,}")
        for name, most in _WRITER_MOST.items():  # the writer allocates by these at once (a queue, threads)
            given = options.writer_options.get(name)
            if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given > most()):
                over.append(f"writer option {name} {given!r} > {most()}")
        if out_dir.startswith("s3://"):
            local = [r for r in self.roots if not r.startswith("s3://")]
            if not local:
                raise CaptureRefusedError(
                    f"{out_dir}: an s3:// capture stages its shards on this server under a local root, and "
                    f"{ENV_CAPTURE_ROOT} names none"
                )
            staging = os.path.join(local[0], ".eagle-io-staging", out_dir.removeprefix("s3://").strip("/"))
            staging = _under_a_root(staging, tuple(local))  # a planted .eagle-io-staging link does not lead out
            options = options.replace(writer_options={**options.writer_options, "staging": staging})
        if live is not None:
            given = live.to_dict()
            for name in _LIMITS[1:]:
                cap = self.limits[name]
                if cap is None:
                    continue
                if given[name] is None:
                    given[name] = cap
                elif given[name] > cap:
                    over.append(f"{name} {given[name]} > {cap}")
            live = LivePolicy.from_dict(given)
        if over:
            raise CaptureRefusedError(f"over this server's limits ({ENV_CAPTURE_LIMITS}): " + "; ".join(over))
        return out_dir, options, live


_WRITER_MOST = {"queue_depth": lambda: 4 * defaults.QUEUE_DEPTH, "threads": lambda: os.cpu_count() or 1}
"""Writer options a remote client may set but not past these: the writer makes its queue and threads at once (a
queue_depth of 2**40 aborted the scheduler process; 1,000 threads were made)."""


def _root(root: str) -> str:
    if root.startswith("s3://"):
        if ".." in root.split("/"):
            raise InvalidArgumentError(f"{ENV_CAPTURE_ROOT}: {root!r} has a '..' component")
        return root.rstrip("/") + "/"
    if "://" in root or not os.path.isabs(root):
        raise InvalidArgumentError(f"{ENV_CAPTURE_ROOT}: {root!r} is neither an absolute local path nor s3://")
    return os.path.realpath(root)


def _limits(text: str | None) -> dict[str, float | None]:
    out: dict[str, float | None] = dict.fromkeys(_LIMITS)
    out.update(ring_bytes=defaults.CAPTURE_MAX_RING_BYTES, max_inflight=defaults.LIVE_MAX_INFLIGHT, sample_rate=1.0)
    if not text:
        return out
    try:
        given = json.loads(text)
    except ValueError as e:
        raise InvalidArgumentError(f"{ENV_CAPTURE_LIMITS} is not JSON: {e}") from None
    if not isinstance(given, dict):
        raise InvalidArgumentError(f"{ENV_CAPTURE_LIMITS} must be a JSON object, not {given!r}")
    for k, v in given.items():
        if k not in out:
            raise InvalidArgumentError(f"{ENV_CAPTURE_LIMITS}: unknown limit {k!r}; the limits are {list(out)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise InvalidArgumentError(f"{ENV_CAPTURE_LIMITS}: {k} {v!r} is not a positive number")
        out[k] = v
    return out


def _under_a_root(out_dir: str, roots: tuple[str, ...]) -> str:
    """``out_dir`` checked to lie under one of ``roots``: an ``s3://`` URL as given, a local path as its real path.

    Raises:
        CaptureRefusedError: naming why not.
    """
    if out_dir.startswith("s3://"):
        if ".." in out_dir.split("/"):
            raise CaptureRefusedError(f"out_dir {out_dir!r} has a '..' component")
        if any((out_dir.rstrip("/") + "/").startswith(r) for r in roots if r.startswith("s3://")):
            return out_dir
        raise CaptureRefusedError(f"out_dir {out_dir!r} is under none of this server's s3:// capture roots")
    if "://" in out_dir:
        raise CaptureRefusedError(f"out_dir {out_dir!r}: only local paths and s3:// URLs are captured into")
    if not os.path.isabs(out_dir):
        raise CaptureRefusedError(f"out_dir {out_dir!r} is relative: a remote capture names an absolute path")
    if ".." in out_dir.split(os.sep):
        raise CaptureRefusedError(f"out_dir {out_dir!r} has a '..' component")
    real = os.path.realpath(out_dir)
    for r in roots:
        if not r.startswith("s3://") and (real == r or real.startswith(r.rstrip(os.sep) + os.sep)):
            return real
    raise CaptureRefusedError(
        f"out_dir {out_dir!r} (real path {real!r}) is under none of this server's capture roots ({ENV_CAPTURE_ROOT})"
    )


def _allowed(what: str, given: Mapping[str, Any], allowed: frozenset[str]) -> None:
    extra = sorted(set(given) - allowed)
    if extra:
        raise CaptureRefusedError(f"{what}(s) {extra} cannot be set by a remote client; allowed: {sorted(allowed)}")
