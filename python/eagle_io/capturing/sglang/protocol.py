"""What the two sides of eagle-io's SGLang capture exchange: the request parameters that make a request a sample,
the start by environment and the stop file. The SGLang capture is the SGLang counterpart of the HF path.

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
works through ``Engine.generate`` and a server's ``/generate`` alike, on any DP rank. Other traffic is ignored.

Starting, either:

* ``Engine.collective_rpc("eagle_io_capture_start", out_dir=..., **options)`` on an existing engine (a method the
  plugin adds to ``Scheduler``; SGLang 0.5.23's ``collective_rpc`` reaches the schedulers only when ``dp_size`` is
  1), which is what :class:`SGLangCaptureSession` does; or
* by environment, for any launch (an ``Engine``, ``python -m sglang.launch_server``, any ``dp_size``/``tp_size``):
  ``EAGLE_IO_CAPTURE_DIR=<out_dir>`` and optionally ``EAGLE_IO_CAPTURE_OPTIONS=<JSON of the same options>``; each
  scheduler starts its capture at startup (before CUDA graphs). ``eagle-io generate --backend sglang`` does this.

Stopping (drain the ring, commit the last shard, mark the manifest complete) goes through a file, because SGLang
kills its scheduler processes with SIGKILL on shutdown and ``collective_rpc`` does not reach DP ranks: writing
``<out_dir>/.eagle-io-stop`` (a JSON ``{"token": ..., "complete": bool}``; ``complete`` false for an interrupted
capture, whose manifest then stays marked incomplete) makes every writing scheduler close and answer in
``<out_dir>/.eagle-io-stop.rNNNNN.json`` (``token``, ``writer_rank``, ``error``, ``counts``, ``stats``), one per
writer.
:meth:`SGLangCaptureSession.close` / :func:`stop_capture` do both sides.

The engine must run SGLang's capture-only mode (0.5.23: ``enable_return_aux_hidden_states=True,
speculative_algorithm="EAGLE3"``; no draft is loaded), with chunked prefill (``chunked_prefill_size=-1``) and the
radix cache (``disable_radix_cache=True``) off: a request split over forwards or with a cached prefix is refused
(its stored length would differ from its input length).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ...errors import CaptureRefusedError

__all__ = [
    "ENV_CAPTURE",
    "ENV_CAPTURE_DIR",
    "ENV_CAPTURE_OPTIONS",
    "KEY_PARAM",
    "MASK_PARAM",
    "POLL_S",
    "SAMPLE_PARAM",
    "STOP_FILE",
    "CaptureRefusedError",
    "ack_path",
    "read_stop",
    "read_token",
]

ENV_CAPTURE = "EAGLE_IO_SGLANG_CAPTURE"
ENV_CAPTURE_DIR = "EAGLE_IO_CAPTURE_DIR"
ENV_CAPTURE_OPTIONS = "EAGLE_IO_CAPTURE_OPTIONS"
SAMPLE_PARAM, MASK_PARAM, KEY_PARAM = "eagle_io_sample_id", "eagle_io_loss_mask", "eagle_io_key"
STOP_FILE = ".eagle-io-stop"
POLL_S = 0.2


def read_stop(stop_file: str) -> tuple[Any, bool]:
    """(token, complete) of a stop file: the token None when there is none (or it is being written); ``complete``
    False only when the stop says the capture was interrupted (its manifest stays marked incomplete)."""
    try:
        with open(stop_file, encoding="utf-8") as f:
            stop = json.load(f)
        return stop.get("token"), stop.get("complete") is not False
    except (OSError, ValueError, AttributeError):
        return None, True


def read_token(stop_file: str) -> Any:
    """The token of a stop file, or None when there is none (or it is being written)."""
    return read_stop(stop_file)[0]


def ack_path(out_dir: str, writer_rank: int) -> str:
    """Where shard writer ``writer_rank`` answers a stop: ``<out_dir>/.eagle-io-stop.rNNNNN.json``."""
    return os.path.join(out_dir, f"{STOP_FILE}.r{writer_rank:05d}.json")
