"""How SGLang's parallel layout maps onto eagle-io's shard writers: one writer per data-parallel rank that serves its
own requests, the process with attention-TP rank 0 of it writing.

SGLang 0.5.23 has two kinds of data-parallel ranks (``srt/runtime_context.py``, ``num_dp_ranks_of``: "replicas
times attention-DP groups"; "DP attention does not run inside replicas, so one of the two is one"):

* replicas, ``--dp-size N``: ``dp_size = N``, each replica its own TP group; a scheduler's ``dp_rank`` is its
  replica, its ``attn_dp_rank`` 0;
* attention-DP groups, ``--attn-dp-size N`` or the deprecated ``--dp-size N --enable-dp-attention`` (turned into
  ``attn_dp_size = N, dp_size = 1`` by ``_handle_deprecated_dp_attention`` in ``srt/arg_groups/parallel_hook.py``):
  one scheduler per TP rank, ``attn_dp_rank = tp_rank // (attn_tp_size * attn_cp_size)`` and ``attn_tp_rank =
  tp_rank % attn_tp_size`` (``derive_attention_ranks``); each group schedules its own requests. The DP controller
  hands those schedulers ``dp_rank = attn_dp_rank`` (``DataParallelController.launch_tensor_parallel_group``), so
  ``dp_rank`` alone cannot tell a replica from a group.

Writer rank ``replica * attn_dp_size + attn_dp_rank`` of ``dp_size * attn_dp_size`` writers, with ``replica =
dp_rank`` only when ``dp_size > 1``, numbers every request-serving rank once. Nothing here imports SGLang at
module import time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from .launch_args import reader

__all__ = ["CaptureRanks", "capture_ranks", "data_parallel_of", "writers_of"]


@dataclass(frozen=True)
class CaptureRanks:
    """One scheduler process's place among the capture's shard writers.

    Attributes:
        writer_rank: the shard-writer rank (``manifest.rNNNNN.json``) of this process' data-parallel rank.
        writers: how many shard writers the capture has (SGLang's ``num_dp_ranks``).
        writes: whether this process writes (attention-TP rank 0 of its data-parallel rank; the other TP ranks
            hold the same states).
    """

    writer_rank: int
    writers: int
    writes: bool


def _layout(dp_size: int, attn_dp_size: int, attn_cp_size: int = 1, pp_size: int = 1) -> None:
    if pp_size > 1:
        raise InvalidArgumentError(
            f"pp_size={pp_size}: under pipeline parallelism each stage runs its own layers, so no scheduler holds "
            "every aux state (SGLang's set_eagle3_layers_to_capture captures nothing on the stages before the last, "
            "and the last runs only its own layers), and every stage's attention-TP rank 0 would write as the same "
            "shard writer; eagle-io's SGLang capture does not reassemble stages: capture with pp_size=1"
        )
    if dp_size > 1 and attn_dp_size > 1:
        raise InvalidArgumentError(
            f"dp_size={dp_size} with attn_dp_size={attn_dp_size}: SGLang runs attention DP inside one replica only "
            "(runtime_context.num_dp_ranks_of); eagle-io's capture cannot number such writers"
        )
    if attn_cp_size > 1:
        raise InvalidArgumentError(
            f"attn_cp_size={attn_cp_size}: attention context parallelism splits a prompt's tokens over ranks, "
            "which eagle-io's SGLang capture does not reassemble; capture with attn_cp_size=1"
        )


def capture_ranks(parallel: Any) -> CaptureRanks:
    """The :class:`CaptureRanks` of this scheduler, from SGLang's published parallel context
    (``sglang.srt.runtime_context.get_parallel()``: ``dp_size``, ``dp_rank``, ``attn_dp_size``, ``attn_dp_rank``,
    ``attn_tp_rank``, ``attn_cp_size``, ``pp_size``; a width that cannot be read counts as 1, a rank as 0).

    Raises:
        InvalidArgumentError: replicas and attention DP at once, attention context parallelism, or pipeline
            parallelism.
    """

    def read(name: str, default: int) -> int:
        try:
            v = getattr(parallel, name)
        except (AttributeError, RuntimeError, ValueError):  # not published in this process
            return default
        return int(v) if v is not None else default

    dp_size, attn_dp_size = read("dp_size", 1), read("attn_dp_size", 1)
    _layout(dp_size, attn_dp_size, read("attn_cp_size", 1), read("pp_size", 1))
    replica = read("dp_rank", 0) if dp_size > 1 else 0
    group = read("attn_dp_rank", 0) if attn_dp_size > 1 else 0
    return CaptureRanks(replica * attn_dp_size + group, dp_size * attn_dp_size, read("attn_tp_rank", 0) == 0)


def data_parallel_of(server_args: Any) -> tuple[int, int]:
    """``(dp_size, attn_dp_size)`` of a launch as SGLang resolves them.

    ``server_args`` is a live ``ServerArgs`` (its resolved view when resolution has run,
    ``sglang.srt.arg_groups.overrides.resolved_view``) or a mapping of ``sglang.Engine`` keyword arguments, read
    with ``_handle_deprecated_dp_attention``'s rule (``enable_dp_attention`` with ``attn_dp_size`` 1 moves
    ``dp_size`` to ``attn_dp_size``).

    Raises:
        InvalidArgumentError: replicas and attention DP at once, attention context parallelism, or pipeline
            parallelism.
    """
    get = reader(server_args)
    dp, attn_dp = int(get("dp_size", 1) or 1), int(get("attn_dp_size", 1) or 1)
    if get("enable_dp_attention", False) and attn_dp == 1:
        dp, attn_dp = 1, dp
    _layout(dp, attn_dp, int(get("attn_cp_size", 1) or 1), int(get("pp_size", 1) or 1))
    return dp, attn_dp


def writers_of(server_args: Any) -> int:
    """How many shard writers a launch has: ``dp_size * attn_dp_size`` (:func:`data_parallel_of`).

    Raises:
        InvalidArgumentError: as :func:`data_parallel_of`.
    """
    dp, attn_dp = data_parallel_of(server_args)
    return dp * attn_dp
