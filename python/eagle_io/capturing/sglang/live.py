"""Which live requests a serving SGLang capture stores (``LivePolicy``), decided once per request when the
scheduler creates it (:class:`Admission`), before any forward.

A request is sampled when, in this order:

0. it is not SGLang's own health check (``GET /health`` runs a one-token request on an idle server: never sampled,
   counted ``health_checks``);
1. its ``custom_params`` (``sampling_params.custom_params`` on ``/generate``; ``extra_body={"custom_params": ...}``
   on ``/v1/chat/completions``) hold :data:`~.protocol.CAPTURE_PARAM` ``false``: never (the per-request opt-out);
2. they hold it ``true``, or eagle-io's own :data:`~.protocol.SAMPLE_PARAM` (a client-driven capture): sampled;
3. else when :func:`rid_fraction` of its request id is below ``sample_rate`` (a hash, so every TP rank and every
   restart agrees on a rid);

and then only while the caps allow it: sampled requests per second and prompt tokens per second (token buckets
holding one second of burst), stored bytes in the last hour, and sampled requests in flight (each holds its rows
in device memory until it finishes). A request a cap refuses is counted under the cap's name; a request past
``max_length`` is counted ``too_long``. Nothing of an unsampled request is copied.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from ... import defaults
from ...errors import InvalidArgumentError, check_keywords
from .protocol import CAPTURE_PARAM, SAMPLE_PARAM

__all__ = ["LIVE_COUNTS", "Admission", "LivePolicy", "rid_fraction"]

LIVE_COUNTS = (
    "sampled",
    "not_sampled",
    "opted_out",
    "health_checks",
    "capped_samples_per_s",
    "capped_tokens_per_s",
    "capped_bytes_per_hour",
    "capped_inflight",
    "too_long",
)
"""Admission counters of a live capture: requests sampled; left alone by the rate; opted out per request; SGLang's
own health checks; refused by each cap; refused because the prompt alone is past ``max_length``."""

LIVE_ID_BASE = 1 << 62
"""Sample ids of live requests: ``LIVE_ID_BASE + writer_rank * 2**40 + n`` (n counts from the ids the dataset
already holds), apart from any client-given id below 2**62. The request id itself is the sample's ``key``."""


def rid_fraction(rid: str) -> float:
    """A request id's place in ``[0, 1)``: the first 8 bytes of its BLAKE2b digest over 2**64. The same on every
    process and machine (Python's ``hash`` is salted per process), so every TP rank samples the same requests."""
    return int.from_bytes(hashlib.blake2b(rid.encode(), digest_size=8).digest(), "big") / 2.0**64


@dataclass(frozen=True)
class LivePolicy:
    """What a live capture samples (module docstring). Checked when built.

    Attributes:
        sample_rate: fraction of requests sampled by their id's hash, in ``[0, 1]``; 0: only flagged ones.
        max_samples_per_s: sampled requests per second (None: no cap).
        max_tokens_per_s: prompt tokens of sampled requests per second (None: no cap).
        max_bytes_per_hour: bytes of states (stored dtype) put in the last hour (None: no cap).
        max_inflight: sampled requests not finished yet; bounds the device memory they hold:
            ``max_inflight * (prompt + answer tokens) * (k + 1) * H * itemsize``.

    Raises:
        InvalidArgumentError: a rate outside ``[0, 1]``, a cap that is not positive.
    """

    sample_rate: float = 0.0
    max_samples_per_s: float | None = None
    max_tokens_per_s: float | None = None
    max_bytes_per_hour: float | None = None
    max_inflight: int = defaults.LIVE_MAX_INFLIGHT

    def __post_init__(self) -> None:
        if not isinstance(self.sample_rate, (int, float)) or not 0.0 <= self.sample_rate <= 1.0:
            raise InvalidArgumentError(f"live capture sample_rate {self.sample_rate!r}: a fraction in [0, 1]")
        for name in ("max_samples_per_s", "max_tokens_per_s", "max_bytes_per_hour", "max_inflight"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
                raise InvalidArgumentError(f"live capture {name} {v!r}: a positive number (or None: no cap)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LivePolicy:
        """Raises ArgumentTypeError on an unknown key (naming the closest: :func:`eagle_io.errors.check_keywords`)."""
        check_keywords(d, (f.name for f in fields(cls)), "live capture options")
        return cls(**d)


class _Bucket:
    """A token bucket refilled at ``rate`` per second, holding one second's worth, and at least 1 (a rate below 1
    per second admits one every ``1 / rate`` seconds, not none)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.size, self.at = rate, max(rate, 1.0), time.monotonic()
        self.level = self.size

    def take(self, n: float) -> bool:
        now = time.monotonic()
        self.level = min(self.size, self.level + (now - self.at) * self.rate)
        self.at = now
        if self.level < n:
            return False
        self.level -= n
        return True


class Admission:
    """Decides, per new request, whether a capture stores it (module docstring); called on the scheduler's
    thread. ``policy`` None: a client-driven capture, which stores only requests carrying
    :data:`~.protocol.SAMPLE_PARAM`."""

    def __init__(self, policy: LivePolicy | None, max_length: int | None) -> None:
        self.policy, self.max_length = policy, max_length
        self.counts = dict.fromkeys(LIVE_COUNTS, 0) if policy is not None else {}
        p = policy or LivePolicy()
        self._samples = _Bucket(p.max_samples_per_s) if p.max_samples_per_s else None
        self._tokens = _Bucket(p.max_tokens_per_s) if p.max_tokens_per_s else None
        self._bytes: deque[tuple[float, int]] = deque()
        self._bytes_sum = 0
        self._lock = threading.Lock()  # stored() runs on the hand-off thread

    def wants(self, rid: str, params: Mapping[str, Any], health_check: bool = False) -> bool:
        """Whether request ``rid`` is asked for, before the caps: never SGLang's own health check, then the opt-out,
        the flag, a client sample, the rate."""
        if health_check:
            if self.policy is not None:
                self.counts["health_checks"] += 1
            return False
        flag = params.get(CAPTURE_PARAM)
        if flag is False:
            if self.policy is not None:
                self.counts["opted_out"] += 1
            return False
        if SAMPLE_PARAM in params:
            return True
        if self.policy is None:
            return False
        if flag is True or rid_fraction(rid) < self.policy.sample_rate:
            return True
        self.counts["not_sampled"] += 1
        return False

    def admit(self, prompt_tokens: int, inflight: int) -> str | None:
        """None when a live request that :meth:`wants` asked for may be sampled now (then counted ``sampled``), else
        the counter that refused it (counted)."""
        p = self.policy
        assert p is not None
        why = None
        if self.max_length is not None and prompt_tokens > self.max_length:
            why = "too_long"
        elif inflight >= p.max_inflight:
            why = "capped_inflight"
        elif p.max_bytes_per_hour is not None and self._bytes_in_hour() >= p.max_bytes_per_hour:
            why = "capped_bytes_per_hour"
        elif self._samples is not None and not self._samples.take(1):
            why = "capped_samples_per_s"
        elif self._tokens is not None and not self._tokens.take(min(prompt_tokens, self._tokens.rate)):
            why = "capped_tokens_per_s"
        self.counts[why or "sampled"] += 1
        return why

    def stored(self, nbytes: int) -> None:
        """Records ``nbytes`` of states put into the ring (for ``max_bytes_per_hour``)."""
        with self._lock:
            self._bytes.append((time.monotonic(), nbytes))
            self._bytes_sum += nbytes

    def _bytes_in_hour(self) -> int:
        horizon = time.monotonic() - 3600.0
        with self._lock:
            while self._bytes and self._bytes[0][0] < horizon:
                self._bytes_sum -= self._bytes.popleft()[1]
            return self._bytes_sum
