"""What the two sides of eagle-io's SGLang capture exchange: the request parameters that make a request a sample,
the control commands over HTTP and the status, the start by environment. The SGLang capture is the SGLang
counterpart of the HF path.

Scheduler side (:mod:`.scheduler` ; installed by the plugin, :func:`eagle_io.sglang_plugin.register`, unless
``EAGLE_IO_SGLANG_CAPTURE=0``): an AFTER hook on ``TpModelWorker.forward_batch_generation`` takes, for each
prefill forward, the concatenated aux states (``LogitsProcessorOutput.hidden_states``, ``[T, k*H]``, FULL capture)
and the final post-norm states (``.last_hidden_states``, ``[T, H]``) as tensors on the device, splits them per
request and puts them in eagle-io's capture ring (:class:`eagle_io.capturing.ring.RingSink`, asynchronous copies), which
feeds the shard writer. They never go through SGLang's float-list path. One process of each data-parallel rank (a
replica of ``--dp-size``, or an attention-DP group of ``--attn-dp-size`` / ``--enable-dp-attention``) writes, its
attention-TP rank 0, as one of ``dp_size * attn_dp_size`` shard writers (:mod:`eagle_io.sglang.ranks`;
``manifest.rNNNNN.json`` when there are several; ``eagle-io merge`` joins them).

A request is a sample when its ``sampling_params.custom_params`` hold ``eagle_io_sample_id`` (int) and
``eagle_io_loss_mask`` (0/1 per input token; optional ``eagle_io_key``): the mapping travels with the request, so it
works through a server's ``/generate`` on any DP rank (:func:`sample_params`). Other traffic is ignored, unless a
live capture samples it (:mod:`.live`).

Starting and stopping happen over HTTP only (what :class:`~eagle_io.capturing.sglang.client.ServerCapture` does):
``POST /set_internal_state`` with ``{"server_args": {"eagle_io:<JSON>": 1}}``, the JSON being ``{"op": "start" |
"stop", "token": ..., ...}`` (:func:`control_args`). SGLang 0.5.23 fans that request out to every DP rank's
``Scheduler.set_internal_state`` (``managers/scheduler.py``), which eagle-io's hook answers (``updated``: the command
was taken) before SGLang's own handlers see the key; its values must be numbers (``SetInternalStateReq.server_args:
Dict[str, int | float]``), so the command travels in the key. Starting and stopping run on a thread of their own,
never on the scheduler's. Each writing scheduler reports its capture in ``GET /server_info``'s ``internal_states``
(one dict per DP rank, ``Scheduler.get_internal_state``) under :data:`STATUS_KEY`: ``state`` (``idle``,
``starting``, ``capturing``, ``stopping``, ``stopped``, ``failed``), the capture's ``id`` (:func:`capture_id`, never
its secret) and the last stop's ``stop_id``, ``error``, ``counts``, and after a stop the writer's ``stats`` and
``upload``. No file is shared between client and server.

A capture may also start with the server, by environment: ``EAGLE_IO_CAPTURE_DIR=<out_dir>``, optionally
``EAGLE_IO_CAPTURE_OPTIONS=<JSON of the options>`` and, for a live capture, ``EAGLE_IO_CAPTURE_LIVE=<JSON of the
policy>``; each scheduler starts its capture at startup (before CUDA graphs). With ``EAGLE_IO_CAPTURE_SECRET`` only a
stop holding that secret (or a forced one) stops it; without, any stop over HTTP does (``eagle-io live stop URL``:
:func:`~eagle_io.capturing.sglang.client.stop_server_capture`).

What a sample holds (:mod:`.assembly`): the request's prompt states from its prefill, chunked or not, and, when its
``max_new_tokens`` is above 1, the states of the answer the server generates, from the decode forwards: the sample's
tokens are the prompt plus the generated tokens but the last, whose state no forward computed (the state before it,
which predicts it, is stored); its loss mask is the client's over the prompt then 1 over the generated tokens. A
request whose prompt was partly served from the radix cache would miss states: the scheduler gives each sampled
request a radix-cache namespace of its own, unless its prompt begins with a prefix record the capture stored (it is
then served from the cache up to that prefix, and stores the rows after it:
:class:`~eagle_io.capturing.sglang.capture.SchedulerCapture`), and refuses (counts ``incomplete``) any that still
arrives with a prefix it did not see.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

from ...errors import CaptureRefusedError

__all__ = [
    "CAPTURE_PARAM",
    "CONTROL_PREFIX",
    "ENV_CAPTURE",
    "ENV_CAPTURE_DIR",
    "ENV_CAPTURE_LIVE",
    "ENV_CAPTURE_OPTIONS",
    "KEY_PARAM",
    "MASK_PARAM",
    "SAMPLE_PARAM",
    "STATUS_KEY",
    "CaptureRefusedError",
    "capture_id",
    "control_args",
    "new_secret",
    "parse_control",
    "sample_params",
    "sample_proof",
]

ENV_CAPTURE = "EAGLE_IO_SGLANG_CAPTURE"
ENV_CAPTURE_DIR = "EAGLE_IO_CAPTURE_DIR"
ENV_CAPTURE_OPTIONS = "EAGLE_IO_CAPTURE_OPTIONS"
ENV_CAPTURE_LIVE = "EAGLE_IO_CAPTURE_LIVE"
"""JSON of a :class:`~.live.LivePolicy` for a capture started by environment: a live capture of served traffic."""
ENV_CAPTURE_ROOT = "EAGLE_IO_CAPTURE_ROOT"
"""Where a server lets clients have it write (:mod:`.operator`); unset: remote capture is off."""
ENV_CAPTURE_LIMITS = "EAGLE_IO_CAPTURE_LIMITS"
"""The operator's maximums on what a client asks for (:mod:`.operator`)."""
ENV_ALLOW_HIDDEN_STATES = "EAGLE_IO_ALLOW_CLIENT_HIDDEN_STATES"
"""``1``: requests other than eagle-io's samples may ask for hidden states (off by default)."""
ENV_CAPTURE_SECRET = "EAGLE_IO_CAPTURE_SECRET"
"""The secret of a capture started by environment (optional): the operator's client proves its samples and its stop
with it, as a client that started a capture over HTTP does with its own."""
SAMPLE_PARAM, MASK_PARAM, KEY_PARAM = "eagle_io_sample_id", "eagle_io_loss_mask", "eagle_io_key"
PROOF_PARAM = "eagle_io_proof"
"""A sample request's proof that it comes from the capture's own client (:func:`sample_proof`)."""
CAPTURE_PARAM = "eagle_io_capture"
"""A request's own say in a live capture (``custom_params``): ``true`` samples it whatever the rate (the caps still
apply), ``false`` never (:mod:`.live`)."""


def new_secret() -> str:
    """A capture's secret: 256 random bits as hex, made by its client and sent once, in the start command."""
    return secrets.token_hex(32)


def capture_id(secret: str | None) -> str | None:
    """The public id of the capture whose secret is ``secret`` (the first 16 hex digits of its SHA-256): what the
    status shows, never the secret itself. None for a capture with no secret."""
    return None if secret is None else hashlib.sha256(secret.encode()).hexdigest()[:16]


def sample_proof(secret: str, sample_id: int) -> str:
    """HMAC-SHA-256 of the sample id under the capture's secret: a request carrying it was made by the capture's own
    client; the secret itself never travels in a sample request."""
    return hmac.new(secret.encode(), str(int(sample_id)).encode(), hashlib.sha256).hexdigest()


def sample_params(sample: Any, secret: str) -> dict[str, Any]:
    """The ``custom_params`` that make a request the sample ``sample`` (``index``, ``loss_mask [L]``, optional
    ``id`` stored as the key) of the capture whose secret is ``secret``; put them in the request's
    ``sampling_params``."""
    sid = int(sample.index)
    params: dict[str, Any] = {SAMPLE_PARAM: sid, MASK_PARAM: [int(v) for v in sample.loss_mask.tolist()]}
    params[PROOF_PARAM] = sample_proof(secret, sid)
    if getattr(sample, "id", None):
        params[KEY_PARAM] = str(sample.id)
    return params


CLIENT_WRITER_OPTIONS = frozenset({"shard_bytes", "chunk_bytes", "threads", "zstd_level", "queue_depth", "resume"})
"""Writer options a remote client may set (``staging`` is the server's: under its first local capture root)."""
CLIENT_METADATA = frozenset({"source_dataset", "regenerated"})
"""Metadata keys a remote client may add (what ``eagle-io generate`` records of its input)."""
CLIENT_TARGET_INFO = frozenset({"model_id", "files"})
"""Target facts a remote client may name; the shapes (layers, widths, vocabulary) are the server's own."""

STATUS_KEY = "eagle_io_capture"
"""The key of eagle-io's capture status in each ``internal_states`` entry of ``GET /server_info``."""

CONTROL_PREFIX = "eagle_io:"


def control_args(op: str, token: str, **payload: Any) -> dict[str, int]:
    """The ``server_args`` of a ``POST /set_internal_state`` that sends eagle-io command ``op`` (``"start"`` with
    ``out_dir``, ``options`` and, for a live capture, ``live`` (:meth:`~.live.LivePolicy.to_dict`); or ``"stop"``
    with ``complete``, or ``force`` from an operator) to every DP rank's scheduler. ``token`` is the capture's
    secret (:func:`new_secret`; a forced stop sends a fresh one): only its :func:`capture_id` is ever shown."""
    return {CONTROL_PREFIX + json.dumps({"op": op, "token": token, **payload}, separators=(",", ":")): 1}


def parse_control(server_args: Any) -> dict[str, Any] | None:
    """The eagle-io command in a ``SetInternalStateReq.server_args`` mapping, or None when it holds none.

    Raises:
        CaptureRefusedError: a key with eagle-io's prefix that is not a JSON object with ``op`` and ``token``, or
            eagle-io keys mixed with SGLang's own.
    """
    keys = [k for k in (server_args or {}) if isinstance(k, str) and k.startswith(CONTROL_PREFIX)]
    if not keys:
        return None
    # (the messages never quote a command: it carries a secret)
    if len(keys) != len(server_args):
        others = sorted(k for k in server_args if k not in keys)
        raise CaptureRefusedError(f"an eagle-io command is mixed with SGLang settings: {others}")
    try:
        (cmd,) = (json.loads(k[len(CONTROL_PREFIX) :]) for k in keys)
    except ValueError as e:
        raise CaptureRefusedError(f"not one eagle-io command (a JSON object per key): {type(e).__name__}") from e
    if not isinstance(cmd, dict) or not isinstance(cmd.get("op"), str) or not isinstance(cmd.get("token"), str):
        raise CaptureRefusedError("an eagle-io command needs a str op and token")
    return cmd
