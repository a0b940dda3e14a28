"""Probes of SGLang's live objects in a scheduler process: what the startup guard, the runtime checks and the SGLang
capture read from a ``Scheduler``, a ``ScheduleBatch`` and a forward's result.

The attribute paths are SGLang-version-specific; the names and rules they rest on (hook targets, supported
versions) are in :mod:`.compat` and :mod:`.hooks`. A missing attribute raises
:class:`~eagle_io.errors.SGLangCompatError` instead of silently skipping a check. Nothing here imports SGLang at
module import time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InternalError, SGLangCompatError
from .compat import SUPPORTED_SGLANG, sglang_version
from .hooks import DECODE_METHOD, PREFILL_METHOD
from .launch_args import reader
from .ranks import capture_ranks


@dataclass(frozen=True)
class StartupFacts:
    """What the startup guard decides on, read from a scheduler after attention-backend setup."""

    algorithm: str  # SpeculativeAlgorithm name, e.g. "EAGLE"
    is_eagle3: bool  # scheduler.spec_algorithm.is_eagle3()
    target_architecture: str
    target_hidden_size: int
    target_num_layers: int | None
    capture_enabled: bool  # capture_aux_hidden_states on the model that runs the layers
    layers_to_capture: tuple[int, ...]
    spec_aux_enabled: bool | None  # runner.spec_aux_config.eagle_use_aux_hidden_state (None if unknown)
    draft_present: bool  # False on non-last PP ranks (EAGLEWorkerV2._draft_worker is None)
    draft_architecture: str | None
    draft_config: dict[str, Any]  # the draft hf_config as a dict
    draft_class: str | None  # the class SGLang built the draft as: type(draft_runner.model).__name__
    fc_in_width: int | None
    draft_embed_width: int | None
    wiring_problems: tuple[str, ...] = ()  # capture_wiring_problems(model): empty = wired (or not checkable)


def _attr(obj: Any, *names: str) -> Any:
    """First present attribute among ``names`` (each may be dotted); raises SGLangCompatError if none is."""
    for name in names:
        cur = obj
        try:
            for part in name.split("."):
                cur = getattr(cur, part)
        except AttributeError:
            continue
        return cur
    raise SGLangCompatError(
        f"{type(obj).__name__} has none of {', '.join(names)} (SGLang {sglang_version()}; "
        f"eagle-io supports {SUPPORTED_SGLANG})"
    )


def _capture_model(model: Any) -> Any:
    """The module that owns ``capture_aux_hidden_states``: the model itself, or its ``language_model`` for
    wrappers (``KimiK25ForConditionalGeneration``, ``Mistral3``/``Llama4`` VLMs delegate the setter there)."""
    if hasattr(model, "capture_aux_hidden_states"):
        return model
    inner = getattr(model, "language_model", None)
    if inner is not None and hasattr(inner, "capture_aux_hidden_states"):
        return inner
    return model


_PER_LAYER_IDS = re.compile(r"\b(?:i|idx|layer_idx|layer_id)\s+in\s+self\.layers_to_capture")
"""A forward that selects layers by id (``LlamaModel.forward``: ``if i in self.layers_to_capture``); Qwen3.5 /
MiniMax-M3 select by the per-layer flag and test ids only for ``self.end_layer``."""


def _decoder_layers(module: Any) -> Any:
    layers = getattr(module, "layers", None)
    return (
        layers
        if isinstance(layers, (list, tuple)) or (hasattr(layers, "__getitem__") and hasattr(layers, "__len__"))
        else None
    )


def _forward_source(module: Any) -> str | None:
    """The source of every method the module's class (and its bases outside torch) defines, setters excepted
    (``set_eagle3_layers_to_capture`` writes the flags; what reads them is the forward and its helpers: a forward
    that hands the layer loop to another method selects by the same flag). None when no source is readable."""
    import inspect

    parts = []
    for cls in type(module).__mro__:
        if cls.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        for name, fn in vars(cls).items():
            if name.startswith("set_") or not callable(fn):
                continue
            try:
                parts.append(inspect.getsource(fn))
            except (OSError, TypeError):
                continue
    return "\n".join(parts) or None


def capture_wiring_problems(model: Any) -> tuple[str, ...]:
    """Whether the target's forward will actually record the aux states its setter asked for: a structural probe
    of the module tree, the cheap equivalent of a one-token forward (run before CUDA-graph capture).

    Walks from the target model down ``language_model`` / ``model`` to the module that owns the decoder
    ``layers`` (``LlamaModel``, ``DeepseekV2Model``, Qwen3.5's ``Qwen3_5ForCausalLM`` backbone...) and returns one
    sentence per broken link (empty = wired, or not checkable: no ``layers`` found):

    * a module on that path with ``capture_aux_hidden_states`` off while one above it has it on: its forward returns
      plain hidden states, so nothing reaches the logits processor (a VL wrapper that sets the flag on itself only);
    * the layer owner's ``layers_to_capture`` empty or missing;
    * an owner whose ``forward`` (or a method it hands the layer loop to) selects layers by their
      ``_is_layer_to_capture`` flag (Qwen3.5, Qwen3-Next, Qwen2-MoE, MiniMax-M3: ``setattr(self.layers[i],
      "_is_layer_to_capture", True)`` in their ``set_eagle3_layers_to_capture``) and not by ``i in
      self.layers_to_capture``, whose flagged layers differ from ``layers_to_capture`` (a wrapper that assigned
      ``model.layers_to_capture`` instead of calling the setter: SGLang's ``Qwen3VLForConditionalGeneration`` does so
      for a backbone without the setter). Such a target records nothing: its first request fails inside the target
      forward (the wrapper unpacks plain states as ``(states, aux)``), never reaching the draft-extend width check.
    """
    chain: list[Any] = []
    cur, seen = model, set()
    while cur is not None and id(cur) not in seen and len(chain) < 5:
        chain.append(cur)
        seen.add(id(cur))
        if _decoder_layers(cur) is not None:
            break
        nxt = getattr(cur, "language_model", None)
        cur = nxt if nxt is not None else getattr(cur, "model", None)
    owner = chain[-1] if chain and _decoder_layers(chain[-1]) is not None else None
    if owner is None:
        return ()
    problems: list[str] = []
    flags = [(type(m).__name__, m.capture_aux_hidden_states) for m in chain if hasattr(m, "capture_aux_hidden_states")]
    on = [name for name, v in flags if v]
    off = [name for name, v in flags if not v]
    if on and off:
        problems.append(
            f"capture_aux_hidden_states is on for {', '.join(on)} but off for {', '.join(off)} on the path to the "
            f"decoder layers: {off[0]}'s forward returns no aux states, so the draft receives none"
        )
    if not on:
        return tuple(problems)
    wanted = getattr(owner, "layers_to_capture", None)
    owner_name = type(owner).__name__
    if not wanted:
        problems.append(
            f"{owner_name}, which runs the decoder layers, has no layers_to_capture: its forward records nothing (the "
            "capture setter did not reach it)"
        )
        return tuple(problems)
    src = _forward_source(owner)
    if src is not None and "_is_layer_to_capture" in src and not _PER_LAYER_IDS.search(src):
        layers = _decoder_layers(owner)
        flagged = sorted(i for i in range(len(layers)) if getattr(layers[i], "_is_layer_to_capture", False))
        want = sorted({int(i) for i in wanted if 0 <= int(i) < len(layers)})
        if flagged != want:
            problems.append(
                f"{owner_name}.forward captures the layers flagged _is_layer_to_capture ({flagged}), not "
                f"layers_to_capture ({list(wanted)}): {len(flagged)} aux states arrive instead of {len(want)} (a "
                "wrapper set layers_to_capture without calling the language model's set_eagle3_layers_to_capture)"
            )
    return tuple(problems)


def _hf_config_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    if isinstance(cfg, Mapping):
        return dict(cfg)
    to_dict = getattr(cfg, "to_dict", None)
    return dict(to_dict()) if callable(to_dict) else dict(vars(cfg))


def _fc_in_width(draft_model: Any) -> int | None:
    """``model.fc.in_features`` (``llama_eagle3``: ``nn.Linear``) or ``model.fc.input_size``
    (``kimi_k25_eagle3``: ``ColumnParallelLinear``)."""
    inner = getattr(draft_model, "model", draft_model)
    fc = getattr(inner, "fc", None)
    if fc is None:
        return None
    for name in ("in_features", "input_size"):
        v = getattr(fc, name, None)
        if isinstance(v, int):
            return v
    w = getattr(fc, "weight", None)
    return int(w.shape[1]) if w is not None and getattr(w, "dim", lambda: 0)() == 2 else None


def _embed_width(draft_model: Any) -> int | None:
    inner = getattr(draft_model, "model", draft_model)
    emb = getattr(inner, "embed_tokens", None)
    dim = getattr(emb, "embedding_dim", None)
    if isinstance(dim, int):
        return dim
    w = getattr(emb, "weight", None)
    return int(w.shape[-1]) if w is not None else None


def startup_facts(scheduler: Any) -> StartupFacts:
    """Reads :class:`StartupFacts` from a ``Scheduler`` (``srt/managers/scheduler.py``).

    Paths: ``scheduler.spec_algorithm``; target ``scheduler.tp_worker.model_runner`` (``.model``,
    ``.model_config.hf_text_config``, ``.spec_aux_config`` (0.5.23) or the runner's own
    ``eagle_use_aux_hidden_state`` (0.5.14)); draft ``scheduler.draft_worker._draft_worker.draft_runner``
    (``EAGLEWorkerV2`` -> ``EagleDraftWorker``; ``_draft_worker`` is None on non-last PP ranks) with
    ``.model`` and ``.model_config.hf_config``.
    """
    algo = _attr(scheduler, "spec_algorithm")
    runner = _attr(scheduler, "tp_worker.model_runner", "tp_worker.worker.model_runner")
    model = _attr(runner, "model")
    cap = _capture_model(model)
    layer_owner = getattr(cap, "model", cap)
    layers = tuple(int(i) for i in (getattr(layer_owner, "layers_to_capture", None) or ()))
    text_cfg = _attr(runner, "model_config.hf_text_config", "model_config.hf_config")
    spec_aux = getattr(runner, "spec_aux_config", None)
    spec_aux_enabled = getattr(spec_aux, "eagle_use_aux_hidden_state", None) if spec_aux is not None else None
    if spec_aux_enabled is None:
        spec_aux_enabled = getattr(runner, "eagle_use_aux_hidden_state", None)
    dw = getattr(scheduler, "draft_worker", None)
    inner = getattr(dw, "_draft_worker", dw) if dw is not None else None
    draft_runner = getattr(inner, "draft_runner", None) if inner is not None else None
    draft_model = getattr(draft_runner, "model", None)
    draft_cfg = getattr(getattr(draft_runner, "model_config", None), "hf_config", None)
    draft_dict = _hf_config_dict(draft_cfg)
    archs = draft_dict.get("architectures") or []
    return StartupFacts(
        algorithm=str(getattr(algo, "name", algo)),
        is_eagle3=bool(algo.is_eagle3()),
        target_architecture=type(model).__name__,
        target_hidden_size=int(_attr(text_cfg, "hidden_size")),
        target_num_layers=getattr(text_cfg, "num_hidden_layers", None),
        capture_enabled=bool(getattr(cap, "capture_aux_hidden_states", False)),
        layers_to_capture=layers,
        spec_aux_enabled=None if spec_aux_enabled is None else bool(spec_aux_enabled),
        draft_present=draft_model is not None,
        draft_architecture=(archs[0] if archs else type(draft_model).__name__) if draft_model is not None else None,
        draft_config=draft_dict,
        draft_class=type(draft_model).__name__ if draft_model is not None else None,
        fc_in_width=_fc_in_width(draft_model) if draft_model is not None else None,
        draft_embed_width=_embed_width(draft_model) if draft_model is not None else None,
        wiring_problems=capture_wiring_problems(model),
    )


def draft_workers(scheduler: Any) -> tuple[Any, Any]:
    """``(outer, inner)``: the scheduler's speculative worker (``scheduler.draft_worker``: ``EAGLEWorkerV2``,
    ``MultiLayerEagleWorkerV2``...) and the draft worker inside it that runs the draft extends (its
    ``_draft_worker``: ``EagleDraftWorker``, ``MultiLayerEagleDraftWorker``; None on non-last PP ranks)."""
    outer = _attr(scheduler, "draft_worker")
    return outer, getattr(outer, "_draft_worker", None)


def draft_extend_width(method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int | None:
    """Width of the states entering a draft extend, from the hooked call's arguments (host metadata only:
    ``Tensor.shape`` never synchronises the device). None when absent (idle batches). ``method`` is
    :data:`~eagle_io.sglang.hooks.PREFILL_METHOD` (``(self, batch, target_hidden_states, ...)``) or
    :data:`~eagle_io.sglang.hooks.DECODE_METHOD` (``(self, batch, batch_result, ...)``: the verify forward's
    ``logits_output.hidden_states``); ``EagleDraftWorker`` and ``MultiLayerEagleDraftWorker`` share both signatures."""
    if method == PREFILL_METHOD:
        states = kwargs.get("target_hidden_states", args[2] if len(args) > 2 else None)
    elif method == DECODE_METHOD:
        result = kwargs.get("batch_result", args[2] if len(args) > 2 else None)
        states = getattr(getattr(result, "logits_output", None), "hidden_states", None)
    else:
        raise InternalError(method)
    shape = getattr(states, "shape", None)
    return int(shape[-1]) if shape is not None and len(shape) >= 1 else None


def capture_target(scheduler: Any) -> dict[str, Any]:
    """Facts the SGLang capture needs from a scheduler: the target's sizes and capture layers (eagle-io ids: SGLang's
    ``layers_to_capture`` mean the input of layer i), this process' place among the shard writers
    (:func:`eagle_io.sglang.ranks.capture_ranks` over ``runtime_context.get_parallel()``: ``writer_rank``,
    ``writers``, ``writes``), SGLang's ``dp_size`` / ``attn_dp_size``, and the chunked-prefill / radix-cache
    settings.

    Raises:
        InvalidArgumentError: a parallel layout the capture cannot number
            (:func:`~eagle_io.sglang.ranks.capture_ranks`).
    """
    from sglang.srt.runtime_context import get_parallel

    runner = _attr(scheduler, "tp_worker.model_runner", "tp_worker.worker.model_runner")
    model = _attr(runner, "model")
    cap = _capture_model(model)
    owner = getattr(cap, "model", cap)
    text = _attr(runner, "model_config.hf_text_config", "model_config.hf_config")
    get = reader(_attr(scheduler, "server_args"))
    algo = getattr(scheduler, "spec_algorithm", None)
    ranks = capture_ranks(get_parallel())
    return {
        "architecture": type(model).__name__,
        "hidden_size": int(_attr(text, "hidden_size")),
        "num_layers": int(_attr(text, "num_hidden_layers")),
        "vocab_size": int(_attr(text, "vocab_size")),
        "capture_enabled": bool(getattr(cap, "capture_aux_hidden_states", False)),
        "layers": [int(i) for i in (getattr(owner, "layers_to_capture", None) or ())],
        "chunked_prefill_size": get("chunked_prefill_size"),
        "speculative_algorithm": None if algo is None or algo.is_none() else str(getattr(algo, "name", algo)),
        "radix_cache_disabled": bool(get("disable_radix_cache", False)),
        "writer_rank": ranks.writer_rank,
        "writers": ranks.writers,
        "writes": ranks.writes,
        "dp_size": int(get("dp_size", 1) or 1),
        "attn_dp_size": int(get("attn_dp_size", 1) or 1),
    }


def is_prefill(batch: Any) -> bool:
    """``ScheduleBatch.forward_mode.is_extend()`` (a prefill; decode and idle batches are not captured)."""
    mode = getattr(batch, "forward_mode", None)
    return bool(mode is not None and mode.is_extend())


def is_decode(batch: Any) -> bool:
    """``ScheduleBatch.forward_mode.is_decode()`` (one new token per request)."""
    mode = getattr(batch, "forward_mode", None)
    return bool(mode is not None and mode.is_decode())


def batch_requests(batch: Any) -> list[dict[str, Any]]:
    """Per request of a ``ScheduleBatch``, in forward order: ``rid``, ``prefix_len`` (tokens served from cache or
    earlier chunks: ``batch.prefix_lens``, the forward's own snapshot, else ``Req.prefix_len``), ``extend_len``
    (tokens in this forward: ``batch.extend_lens``; 1 in a decode forward), ``custom_params``
    (``Req.sampling_params.custom_params``, ``{}`` when unset). Reads no token list: it runs after every forward."""
    reqs = list(getattr(batch, "reqs", None) or ())
    if not is_prefill(batch):
        lens, prefixes = [1] * len(reqs), [0] * len(reqs)
    else:
        lens = getattr(batch, "extend_lens", None) or [r.extend_len for r in reqs]
        prefixes = getattr(batch, "prefix_lens", None) or [getattr(r, "prefix_len", 0) for r in reqs]
    return [
        {
            "rid": str(r.rid),
            "prefix_len": int(p),
            "extend_len": int(n),
            "custom_params": getattr(getattr(r, "sampling_params", None), "custom_params", None) or {},
        }
        for r, n, p in zip(reqs, lens, prefixes, strict=True)
    ]


def finished_requests(batch: Any) -> list[dict[str, Any]]:
    """The requests of a ``ScheduleBatch`` that have finished (``Req.finished()``, after
    ``Scheduler.process_batch_result``): ``rid``, ``input_ids`` (``Req.origin_input_ids``), ``output_ids``
    (``Req.output_ids_through_stop``: the generated tokens, the stop token included), ``aborted``
    (``finished_reason`` is ``FINISH_ABORT``)."""
    out = []
    for r in getattr(batch, "reqs", None) or ():
        if not r.finished():
            continue
        ids = getattr(r, "output_ids_through_stop", None)
        out.append(
            {
                "rid": str(r.rid),
                "input_ids": [int(t) for t in r.origin_input_ids],
                "output_ids": [int(t) for t in (r.output_ids if ids is None else ids)],
                "aborted": is_aborted(r),
            }
        )
    return out


def is_aborted(req: Any) -> bool:
    """Whether a ``Req`` was aborted (``finished_reason`` is ``FINISH_ABORT``): by ``/abort_request`` while running,
    or refused by the scheduler right after it was created (``set_finish_with_abort``, ``prepare_abort``)."""
    return type(getattr(req, "finished_reason", None)).__name__ == "FINISH_ABORT"


def forward_states(result: Any) -> tuple[Any, Any]:
    """``(aux [T, k*H], final [T, H])`` from a ``GenerationBatchResult`` (either may be None)."""
    lo = getattr(result, "logits_output", None)
    return getattr(lo, "hidden_states", None), getattr(lo, "last_hidden_states", None)


def request_facts(req: Any) -> dict[str, Any]:
    """A new ``Req`` (``Scheduler._create_generation_req``'s result): ``rid``, ``prompt_len``
    (``len(origin_input_ids)``), ``custom_params`` (``{}`` when unset or not a dict: SGLang serves such a request
    and reads none of its keys, ``isinstance(custom_params, dict)`` in its ``sampling_params``) and ``health_check``:
    whether it is SGLang's own ``/health`` probe, one token generated for the input ``[0]`` on an idle server (its rid
    prefix, ``sglang.srt.managers.utils.is_health_check_generate_req``), not traffic."""
    from sglang.srt.managers.utils import is_health_check_generate_req

    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    return {
        "rid": str(req.rid),
        "prompt_len": len(req.origin_input_ids),
        "custom_params": params if isinstance(params, dict) else {},
        "health_check": is_health_check_generate_req(req),
    }


def isolate_from_radix_cache(req: Any) -> None:
    """Gives ``req`` a radix-cache namespace of its own (``Req.extra_key``, which SGLang's ``RadixKey`` matches on,
    keeping any key it had in front), so its whole prompt is computed: a prefix served from the cache brings no
    states. Its cached prefix then serves no one else (LRU evicts it)."""
    req.extra_key = f"{getattr(req, 'extra_key', None) or ''}|eagle-io:{req.rid}"


def prompt_prefix_shareable(req: Any) -> bool:
    """Whether the states of ``req``'s first prompt tokens depend on its token ids alone, so a prefix record of the
    same token ids holds them: no radix-cache namespace of its own (``Req.extra_key``, which a LoRA adapter's id is
    appended to, and ``cache_salt``), no multimodal input, no input embeddings overriding positions."""
    return not (
        getattr(req, "extra_key", None)
        or getattr(req, "cache_salt", None)
        or getattr(req, "lora_id", None) is not None
        or getattr(req, "multimodal_inputs", None) is not None
        or getattr(req, "positional_embed_overrides", None) is not None
    )


def can_cap_prefix_match() -> bool:
    """Whether this SGLang bounds a request's radix-cache match by ``Req._compute_max_prefix_len`` (the bound
    ``Req.init_next_round_input`` hands ``match_kv_cache``), which :func:`cap_prefix_match` lowers."""
    from sglang.srt.managers.schedule_batch import Req

    return callable(getattr(Req, "_compute_max_prefix_len", None))


def bigram_prefix_cache(scheduler: Any) -> bool:
    """Whether the scheduler's radix cache keys prompts by token bigrams, so that a match bounded to ``n`` raw tokens
    serves ``n - 1``: its cache is built with ``is_eagle=spec_algorithm.is_eagle()`` (``kv_cache_builder``; EAGLE,
    EAGLE3), and keys by bigram then (``RadixKey.maybe_to_bigram_view``)."""
    algo = getattr(scheduler, "spec_algorithm", None)
    return bool(algo is not None and algo.is_eagle())


def cap_prefix_match(req: Any, tokens: int, *, bigram: bool) -> None:
    """SGLang serves at most ``req``'s first ``tokens`` tokens from its radix cache (fewer when it holds fewer):
    ``Req._compute_max_prefix_len``, the bound SGLang itself lowers to ``logprob_start_len``, capped for this
    request only, at ``tokens + 1`` raw tokens on a ``bigram`` cache (:func:`bigram_prefix_cache`). The request is
    otherwise served as any other (its answer is unchanged)."""
    own, cap = req._compute_max_prefix_len, tokens + int(bigram)
    req._compute_max_prefix_len = lambda input_len: min(own(input_len), cap)


def strip_hidden_states(req: Any) -> bool:
    """Turns off a new request's ``return_hidden_states`` (``Req.return_hidden_states`` and its
    ``return_hidden_states_mode``, which ``ScheduleBatch`` reads when it batches the request and the batch result
    processor when it answers); returns whether the request had asked for them."""
    if not getattr(req, "return_hidden_states", False):
        return False
    from sglang.srt.managers.schedule_batch import get_return_hidden_states_mode

    req.return_hidden_states = False
    req.return_hidden_states_mode = get_return_hidden_states_mode(False)
    return True


def committed_rows(req: Any) -> int:
    """States a running request's committed tokens need, after ``Scheduler.process_batch_result``: its prompt plus
    its generated tokens (``output_ids_through_stop`` once finished) but the last, whose state no forward computed
    yet."""
    out = getattr(req, "output_ids_through_stop", None) if req.finished() else None
    return len(req.origin_input_ids) + len(req.output_ids if out is None else out) - 1


def verify_states(result: Any) -> tuple[Any, Any] | None:
    """The states of the tokens an EAGLE verify forward fed and committed, per request of the batch:
    ``(aux [bs, s, k*H], final [bs, s, H])`` with ``s = spec_steps + 1``; row j of request i is the state of its j-th
    committed token this step (the previous step's bonus token first, then the accepted drafts); only the first
    ``accept_len`` rows of a request are real (the scheduler learns how many from the request's committed length,
    never by reading ``accept_lens`` off the device). None when the result holds no states.

    Source: ``EAGLEWorkerV2.verify`` -> ``run_eagle_verify`` (speculative/eagle_worker_common.py): the verify
    forward's ``logits_output.hidden_states`` (``[bs * num_draft_tokens, k*H]``) has the accepted path moved to the
    front of each request's block (``_finalize_accept_tree_path`` for topk > 1; a chain already is), while
    ``last_hidden_states`` (the final post-norm states before ``lm_head``) is not moved: gathered here by
    ``accept_index`` (``[bs, s]`` node indices, -1 past the accepted ones, clamped: those rows are never used). Device
    ops only, no host sync."""
    import torch

    lo = getattr(result, "logits_output", None)
    aux, final = getattr(lo, "hidden_states", None), getattr(lo, "last_hidden_states", None)
    index = getattr(result, "accept_index", None)
    if aux is None or final is None or index is None or index.dim() != 2 or index.shape[0] == 0:
        return None
    bs, s = int(index.shape[0]), int(index.shape[1])
    nd = int(aux.shape[0]) // bs
    if nd * bs != int(aux.shape[0]) or int(final.shape[0]) != int(aux.shape[0]) or nd < s:
        return None
    front = aux.view(bs, nd, -1)[:, :s]
    picked = final.index_select(0, index.clamp(min=0).reshape(-1).to(torch.int64)).view(bs, s, -1)
    return front, picked
