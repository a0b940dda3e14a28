"""A draft measured on a dataset: live (the speculative decoder against the target's own greedy decoding, on held-out
conversations) and offline (:func:`eagle_io.draft.acceptance.offline_accept` over the stored aux states): what
``eagle-io eval-draft`` prints and the benchmarks tabulate.

Held out: a sample is held out when the draft's ``training_samples.json`` does not list its id. Ids are the
capture's source record indexes, so they name the same conversations in every capture of the same source file
(``metadata["source_dataset"]``: another precision, a regenerated capture); a dataset of another source is held out
whole. Without a ``source_dataset`` on either side, only the dataset trained on itself (same fingerprint) can tell.
A draft without that record (exported by another tool) cannot tell: every sample is used and the result says
``"held_out": "unknown"``.

A live prompt is a sample's tokens before its first loss-masked token: the conversation up to the first assistant
answer, generation prompt included.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..draft.acceptance import AcceptHistogram, mean_of_request_means, offline_accept
from ..errors import DatasetFormatError, InvalidArgumentError
from .decoder import SpeculativeDecoder, greedy_decode
from .loading import ServedDraft
from .served import ServedRun

__all__ = ["evaluate_draft", "held_out_positions", "live_prompts", "prompt_of", "read_prompts_file"]


def held_out_positions(
    dataset: Any, training: Mapping[str, Any] | None, fingerprint: str | None = None
) -> tuple[list[int], dict[str, Any]]:
    """Dataset positions not trained on, and how that was decided (``held_out``: ``"recorded"``,
    ``"other source"`` or ``"unknown"``; ``excluded``: samples left out).

    ``fingerprint``: the dataset's :func:`eagle_io.interop.vocab.dataset_fingerprint`. Where neither the dataset nor
    the record names a ``source_dataset``, sample ids name the same conversations only in the very dataset trained
    on: the record's ``dataset_sha256`` equal to ``fingerprint`` (``"recorded"``), else ``"unknown"``."""
    positions = list(range(len(dataset)))
    if training is None:
        return positions, {"held_out": "unknown", "excluded": 0}
    source = dataset.metadata.get("source_dataset")
    if source is None and training.get("source_dataset") is None and training.get("dataset_sha256") != fingerprint:
        return positions, {"held_out": "unknown", "excluded": 0, "source_dataset": None}
    if training.get("source_dataset") != source:
        return positions, {"held_out": "other source", "excluded": 0, "source_dataset": source}
    trained = {int(i) for i in training["train_sample_ids"]}
    kept = [p for p in positions if dataset.entry(p).sample_id not in trained]
    return kept, {"held_out": "recorded", "excluded": len(positions) - len(kept), "source_dataset": source}


def prompt_of(input_ids: torch.Tensor, loss_mask: torch.Tensor) -> list[int]:
    """The tokens before the first loss-masked one (empty when the first token is masked or none is)."""
    on = torch.nonzero(loss_mask).flatten()
    return input_ids[: int(on[0])].tolist() if len(on) else []


def live_prompts(dataset: Any, positions: Sequence[int], n: int) -> tuple[list[list[int]], list[int]]:
    """The prompts (:func:`prompt_of`) of the first ``n`` samples at ``positions`` that have one, and their ids."""
    picked, ids = [], []
    for p in positions:
        if len(picked) >= n:
            break
        item = dataset[p]
        prompt = prompt_of(item["input_ids"], item["loss_mask"])
        if prompt:
            picked.append(prompt)
            ids.append(int(item["sample_id"]))
    return picked, ids


def read_prompts_file(path: str | os.PathLike[str], tokenizer: Any) -> list[list[int]]:
    """Live prompts from a JSONL file, one per line: ``{"input_ids": [int, ...]}`` as is, or ``{"messages": [{"role":
    ..., "content": ...}, ...]}`` rendered with the target's chat template (``apply_chat_template``, generation prompt
    added, as SGLang's chat route renders it) and tokenized without added special tokens. Blank lines are skipped.

    Raises:
        DatasetFormatError: a line that is not UTF-8 JSON, has neither key, or holds a non-integer or negative id or
            an empty prompt (file, 0-based record number and byte offset named; reason ``prompt``). StorageError: the
            file cannot be read. InvalidArgumentError: a file with no prompt.
    """
    from ..store.layout import storage_error

    name = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise storage_error(path, e) from e
    out, offset, record = [], 0, 0
    for raw in data.split(b"\n"):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue

        def bad(detail: str, start: int = start, record: int = record) -> DatasetFormatError:
            return DatasetFormatError(name, record, start, "prompt", detail)

        record += 1
        try:
            rec = json.loads(raw.decode("utf-8-sig" if start == 0 else "utf-8"))
        except ValueError as e:  # UnicodeDecodeError included
            raise bad(f"not UTF-8 JSON ({e})") from None
        if isinstance(rec, dict) and isinstance(rec.get("input_ids"), list):
            ids = rec["input_ids"]
        elif isinstance(rec, dict) and isinstance(rec.get("messages"), list):
            text = tokenizer.apply_chat_template(rec["messages"], tokenize=False, add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            raise bad('expected an object with "input_ids" (a list of token ids) or "messages" (a list of turns)')
        if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise bad("the prompt is empty or holds an id that is not an integer >= 0")
        out.append([int(t) for t in ids])
    if not out:
        raise InvalidArgumentError(f"{name}: no prompt in the file")
    return out


def evaluate_draft(
    served: ServedDraft,
    dataset: Any,
    positions: Sequence[int],
    *,
    num_steps: int = 3,
    as_algorithm: str = "EAGLE3",
    prompts: int = 8,
    max_new_tokens: int = 64,
    eos_token_ids: Sequence[int] = (),
    offline: bool = True,
    batch_size: int = 4,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    sglang: Callable[[list[list[int]]], ServedRun] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Live on the first ``prompts`` of ``positions`` (samples with a prompt), or on ``prompt_ids`` when given (the
    user's own prompts: ``sample_ids`` are then their line numbers), offline on all of ``positions``.

    ``progress(done, total)``: called after each prompt the reference decoder decodes live.

    ``sglang``: decodes the prompts in SGLang (:func:`eagle_io.spec.served.run_engine` / ``run_server``); the live
    figures are then SGLang's own counts (:class:`eagle_io.spec.served.ServedRun`), ``lossless`` compares its tokens
    with the reference target's greedy decoding, and the reference decoder does not run.

    Returns:
        ``num_steps``, ``as_algorithm``, ``live`` (``accept_length``, ``per_position_accept_rate``,
        ``per_position_conditional``, ``accept_rate``, ``verify_steps``, ``generated_tokens``, ``lossless``,
        ``mismatched_prompts``, ``mean_of_request_means`` (the biased figure, for comparison), ``tokens_per_s``,
        ``greedy_tokens_per_s``, ``speedup``, ``sample_ids``), ``offline`` (``accept_length``,
        ``accept_length_product_of_marginals``, ``per_position_conditional``, ``per_position_accept_rate``,
        ``per_position_marginal``, ``positions``, ``samples``; None under ``as_algorithm="EAGLE"``: the stored aux
        states are what an EAGLE3 launch feeds).

    Speed: each prompt is decoded by the target's own greedy decoding and then speculatively, one right after the
    other, so both see the same machine load (a shared machine's load drifts over minutes); ``speedup`` is the summed
    greedy seconds over the summed speculative seconds, the one ratio measured that way.

    Raises:
        InvalidArgumentError: live prompts for a draft loaded on the target's head alone (``served.target`` None).
    """
    out: dict[str, Any] = {"num_steps": num_steps, "as_algorithm": as_algorithm, "live": None, "offline": None}
    if prompt_ids is None:
        picked, ids = live_prompts(dataset, positions, prompts)
    else:
        picked, ids = [list(p) for p in prompt_ids[:prompts]], list(range(min(prompts, len(prompt_ids))))
    if picked and served.target is None:
        raise InvalidArgumentError(
            f"{len(picked)} live prompt(s) asked for, but only the target's head was loaded: live figures need the "
            "whole target (load_served_draft with load_target's model), or pass prompts=0 for the offline figure"
        )
    if picked and sglang is not None:
        run = sglang(picked)
        ref, ref_s = greedy_decode(served.target, picked, max_new_tokens, eos_token_ids)
        bad = [sid for sid, a, b in zip(ids, run.tokens, ref, strict=True) if a != b]
        out["live"] = {
            **run.to_dict(),
            "engine": "sglang",
            "lossless": not bad,
            "mismatched_prompts": bad,
            "mean_of_request_means": mean_of_request_means(run.per_request),
            "prompts": len(picked),
            "prompt_tokens": sum(len(p) for p in picked),
            "greedy_tokens_per_s": sum(len(t) for t in ref) / ref_s if ref_s else None,
            "speedup": None,  # SGLang's engine and the reference target's greedy decoding are different programs
            "sample_ids": ids,
        }
    elif picked:
        decoder = SpeculativeDecoder(
            served.target, served.draft, num_steps=num_steps, as_algorithm=as_algorithm, eos_token_ids=eos_token_ids
        )
        ref, ref_s, runs = [], 0.0, []
        for prompt in picked:  # interleaved: each prompt's greedy and speculative decodings back to back
            tokens, seconds = greedy_decode(served.target, [prompt], max_new_tokens, eos_token_ids)
            ref += tokens
            ref_s += seconds
            runs.append(decoder.generate([prompt], max_new_tokens))
            if progress is not None:
                progress(len(runs), len(picked))
        spec_tokens = [t for r in runs for t in r.tokens]
        per_request = [h for r in runs for h in r.per_request]
        spec_s = sum(r.seconds for r in runs)
        bad = [sid for sid, a, b in zip(ids, spec_tokens, ref, strict=True) if a != b]
        pooled = AcceptHistogram.pooled(num_steps, per_request)
        generated = sum(len(t) for t in spec_tokens)
        out["live"] = {
            **pooled.to_dict(),
            "generated_tokens": generated,
            "lossless": not bad,
            "mismatched_prompts": bad,
            "mean_of_request_means": mean_of_request_means(per_request),
            "prompts": len(picked),
            "prompt_tokens": sum(len(p) for p in picked),
            "tokens_per_s": generated / spec_s if spec_s else None,
            "greedy_tokens_per_s": sum(len(t) for t in ref) / ref_s if ref_s else None,
            "speedup": ref_s / spec_s if spec_s else None,
            "seconds": spec_s,
            "greedy_seconds": ref_s,
            "sample_ids": ids,
            "engine": "reference",
        }
    if offline and as_algorithm == "EAGLE3" and positions:
        res = offline_accept(served.draft, dataset, list(positions), served.lm_head, num_steps, batch_size=batch_size)
        out["offline"] = res.to_dict()
    return out
