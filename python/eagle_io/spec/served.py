"""Accept length measured by SGLang itself: a real ``sglang.Engine`` started here, or a running server's ``/generate``,
counted from each request's ``meta_info`` (``TokenizerManager`` ``_calculate_spec_decoding_metrics``, SGLang 0.5.23).

Two figures, both pooled over requests (total over total):

* ``sglang_accept_length`` = sum ``completion_tokens`` / sum ``spec_verify_ct``: SGLang's own per-request
  ``spec_accept_length`` pooled. It counts every completion token over the verify steps, the prefill's first token
  included, and the tokens a request drops at EOS or ``max_new_tokens`` excluded.
* ``accept_length`` (eagle-io's convention, :mod:`eagle_io.draft.acceptance`) = 1 + sum ``spec_num_correct_drafts``
  / sum ``spec_verify_ct``: each verify step's accepted drafts plus its bonus token, from the per-request
  ``spec_correct_drafts_histogram`` (the same counts as :class:`eagle_io.spec.SpeculativeDecoder`'s histogram, so the
  two can be compared verify for verify).

Requests are sent greedy (``temperature 0``) as token ids, one batch (the engine) or ``concurrency`` at a time (a
server); ``stop_token_ids`` end a request as the reference decoder's ``eos_token_ids`` do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..draft.acceptance import AcceptHistogram
from ..errors import InvalidArgumentError, SGLangError
from ..sglang.gateway import routes
from ..sglang.servers import ServerKeys, http_json
from ..sglang.spec_params import speculative_param_problems

__all__ = ["ServedRun", "decode_prompts", "engine_args", "run_engine", "run_server"]


@dataclass
class ServedRun:
    """What SGLang answered: ``tokens[i]`` prompt ``i``'s new tokens, ``completion_tokens`` / ``verify_ct`` its
    ``meta_info`` counts, ``per_request`` its verify histogram (``spec_correct_drafts_histogram``), ``seconds`` the wall
    time of the generation calls, ``server`` the launch settings SGLang reported (``/server_info`` or the engine's)."""

    num_steps: int
    tokens: list[list[int]]
    completion_tokens: list[int]
    verify_ct: list[int]
    per_request: list[AcceptHistogram]
    seconds: float
    server: dict[str, Any] = field(default_factory=dict)

    @property
    def histogram(self) -> AcceptHistogram:
        return AcceptHistogram.pooled(self.num_steps, self.per_request)

    @property
    def sglang_accept_length(self) -> float | None:
        steps = sum(self.verify_ct)
        return sum(self.completion_tokens) / steps if steps else None

    def to_dict(self) -> dict[str, Any]:
        """The live figures in ``eval-draft``'s JSON keys, plus ``sglang_accept_length`` and its definition."""
        generated = sum(len(t) for t in self.tokens)
        return {
            **self.histogram.to_dict(),
            "sglang_accept_length": self.sglang_accept_length,
            "definitions": {
                "accept_length": "1 + sum spec_num_correct_drafts / sum spec_verify_ct (eagle-io: bonus counted, "
                "pooled)",
                "sglang_accept_length": "sum completion_tokens / sum spec_verify_ct (SGLang's spec_accept_length, "
                "pooled; counts the prefill's token)",
            },
            "request_verify_ct": list(self.verify_ct),
            "generated_tokens": generated,
            "seconds": self.seconds,
            "tokens_per_s": generated / self.seconds if self.seconds else None,
            "server": self.server,
        }


def engine_args(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str],
    *,
    algorithm: str = "EAGLE3",
    num_steps: int = 3,
    topk: int = 1,
    draft_tokens: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``sglang.Engine`` keyword arguments serving ``draft`` for ``target`` (HF directories): token ids in and out
    (``skip_tokenizer_init``), ``--speculative-num-draft-tokens`` defaulting to ``num_steps + 1`` for a chain (topk 1)
    and to ``topk * num_steps + 1`` for a tree, then ``extra`` (e.g. ``device``, ``dtype``, attention backends;
    tests/helpers/sglang_cpu.py for a CPU).

    Raises:
        InvalidArgumentError: a value SGLang cannot serve
            (:func:`eagle_io.sglang.spec_params.speculative_param_problems`).
    """
    problems = speculative_param_problems(num_steps, topk, draft_tokens)
    if problems:
        raise InvalidArgumentError("; ".join(problems))
    if draft_tokens is None:
        draft_tokens = num_steps + 1 if topk == 1 else topk * num_steps + 1
    return {
        "model_path": os.fspath(target),
        "speculative_algorithm": algorithm,
        "speculative_draft_model_path": os.fspath(draft),
        "speculative_num_steps": num_steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": draft_tokens,
        "skip_tokenizer_init": True,
        **(extra or {}),
    }


def _sampling(max_new_tokens: int, stop_token_ids: Sequence[int]) -> dict[str, Any]:
    params: dict[str, Any] = {"temperature": 0.0, "max_new_tokens": int(max_new_tokens)}
    if stop_token_ids:
        params["stop_token_ids"] = [int(t) for t in stop_token_ids]
    return params


def _parse(outputs: Sequence[dict[str, Any]], num_steps: int, where: str) -> tuple[list, list, list, list]:
    """Per request: new tokens, ``completion_tokens``, ``spec_verify_ct``, verify histogram. A request without
    speculative counts (no draft served, or one that ended at its first token) counts 0 verify steps."""
    tokens, completion, verify, hists = [], [], [], []
    for i, out in enumerate(outputs):
        meta = out.get("meta_info") or {}
        if "output_ids" not in out or "completion_tokens" not in meta:
            raise SGLangError(f"{where}: request {i} answered without output_ids / meta_info.completion_tokens: {out}")
        steps = int(meta.get("spec_verify_ct", 0))
        hist = AcceptHistogram(num_steps)
        counts = meta.get("spec_correct_drafts_histogram") or []
        for j, n in enumerate(counts):
            if n:
                if j > num_steps:
                    raise SGLangError(f"{where}: request {i} accepted {j} drafts with num_steps {num_steps}")
                hist.add(j, int(n))
        if hist.verify_steps != steps:
            raise SGLangError(
                f"{where}: request {i}'s spec_correct_drafts_histogram counts {hist.verify_steps} verify steps, "
                f"spec_verify_ct says {steps}"
            )
        tokens.append([int(t) for t in out["output_ids"]])
        completion.append(int(meta["completion_tokens"]))
        verify.append(steps)
        hists.append(hist)
    return tokens, completion, verify, hists


def run_engine(
    args: dict[str, Any],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_token_ids: Sequence[int] = (),
    env: dict[str, str] | None = None,
) -> ServedRun:
    """Starts ``sglang.Engine(**args)`` (:func:`engine_args`), decodes ``prompts`` in one batch and shuts it down.
    ``env``: variables set while the engine starts (its scheduler processes inherit them), then restored.

    Raises:
        SGLangError: SGLang is not importable, or the engine failed to start or to answer (its message kept).
    """
    try:
        import sglang
    except ImportError as e:
        raise SGLangError(f"--engine sglang needs SGLang installed: {e}") from e
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        engine = sglang.Engine(**args)
    except Exception as e:  # SGLang's own start-up failures (a refused launch, a scheduler that died)
        raise SGLangError(f"sglang.Engine did not start: {type(e).__name__}: {e}") from e
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        t0 = time.perf_counter()
        outs = engine.generate(
            input_ids=[list(map(int, p)) for p in prompts],
            sampling_params=_sampling(max_new_tokens, stop_token_ids),
        )
        seconds = time.perf_counter() - t0
        info = engine.get_server_info()
    except Exception as e:
        raise SGLangError(f"sglang.Engine failed while decoding: {type(e).__name__}: {e}") from e
    finally:
        engine.shutdown()
    return _run(info, outs, seconds, "sglang.Engine")


# The resolved launch settings a measurement reports (GET /server_info, Engine.get_server_info).
SERVER_KEYS = (
    "model_path",
    "dtype",
    "device",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "version",
)


def _run(info: dict[str, Any], outs: Sequence[dict[str, Any]], seconds: float, where: str) -> ServedRun:
    """The run's counts from ``/server_info`` (``info``) and the ``/generate`` answers ``outs`` (SGLang's ``meta_info``:
    :func:`_parse`); a launch without speculative decoding (``speculative_num_steps`` None) counts 0 verify
    steps of a 1-step histogram."""
    num_steps = int(info.get("speculative_num_steps") or 1)
    tokens, completion, verify, hists = _parse(outs, num_steps, where)
    server = {k: info.get(k) for k in SERVER_KEYS}
    return ServedRun(num_steps, tokens, completion, verify, hists, seconds, server)


def run_server(
    url: str,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_token_ids: Sequence[int] = (),
    *,
    algorithm: str | None = None,
    concurrency: int = 8,
    timeout: float = 600.0,
    keys: ServerKeys | None = None,
) -> ServedRun:
    """Decodes ``prompts`` on the SGLang server at ``url`` (``POST /generate`` with ``input_ids``), after reading its
    speculative settings from ``GET /server_info``. ``url`` may be SGLang's gateway (SMG, with ``--enable-rl``): the
    prompts then go to its ``/generate`` as its users' do, and every worker it lists must serve the same settings
    (each read through its control plane; ``keys``: the gateway's inference and control-plane keys).

    Raises:
        SGLangError: the URL does not answer as an SGLang server, the server runs no speculative algorithm, or
            another one than ``algorithm`` (its ``speculative_algorithm`` named); a gateway's workers disagree on a
            setting (naming the two workers and the setting).
        InvalidArgumentError: what :func:`eagle_io.sglang.gateway.routes` raises for a gateway.
    """
    found = routes(url, keys=keys, timeout_s=timeout)
    base, generate_url = found[0].url, found[0].generate_url
    infos = [(r.name, r.call("server_info", timeout_s=timeout, keys=keys)) for r in found]
    info = infos[0][1]
    for name, other in infos[1:]:
        differ = [k for k in SERVER_KEYS if k != "model_path" and other.get(k) != info.get(k)]
        if differ:
            raise SGLangError(f"{name} serves {differ[0]} {other.get(differ[0])!r}, {infos[0][0]} "
                              f"{info.get(differ[0])!r}: one accept length needs one served setting")  # fmt: skip
    served = info.get("speculative_algorithm")
    if not served or "speculative_num_steps" not in info:
        raise SGLangError(
            f"{base}/server_info: speculative_algorithm {served!r}: the server runs no speculative decoding, so "
            "there is no accept length to measure"
        )
    if algorithm is not None and served != algorithm:
        raise SGLangError(f"{base} serves speculative_algorithm {served!r}, not {algorithm!r}")

    def generate(body: dict[str, Any]) -> Any:
        return http_json(generate_url, body, timeout_s=timeout, keys=keys)

    return decode_prompts(info, generate, prompts, max_new_tokens, stop_token_ids, concurrency=concurrency, where=base)


def decode_prompts(
    info: dict[str, Any],
    generate: Callable[[dict[str, Any]], Any],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_token_ids: Sequence[int] = (),
    *,
    concurrency: int = 8,
    where: str = "the server",
) -> ServedRun:
    """Greedy ``/generate`` of every prompt (``input_ids``), ``concurrency`` at once, through ``generate(body)`` (the
    server's route, or one worker's through a transport of its own); their counts under the settings ``info`` (its
    ``/server_info``).

    Raises:
        SGLangError: what ``generate`` raises, or an answer without SGLang's counts (naming ``where``).
    """
    sampling = _sampling(max_new_tokens, stop_token_ids)

    def one(prompt: Sequence[int]) -> Any:
        return generate({"input_ids": [int(t) for t in prompt], "sampling_params": sampling})

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(prompts)))) as pool:
        outs = list(pool.map(one, prompts))
    return _run(info, outs, time.perf_counter() - t0, where)
