"""Regenerated answers: the target writes every assistant turn itself before the conversation is captured.

ShareGPT's answers were written by other models; a draft trained on them learns to predict text the target would
not produce, which the target then rejects. Trainers therefore regenerate the answers with the target first
(SpecForge ``scripts/regenerate_train_data.py`` and ``docs/advanced_features/regenerate_dataset.md``: each
assistant turn replaced by the target's reply to the conversation so far, earlier turns already regenerated; EAGLE's
data scripts do the same). Here that happens inside ``eagle-io generate --regenerate``, in the same run as the
capture, so no second tool and no intermediate file are needed.

Per conversation (turns cleaned first, :func:`eagle_io.data.turns.prepare_turns`): for each assistant turn, the
messages before it (system/user as in the source, assistant turns as regenerated) are rendered with the chat
template and the run's template kwargs, ``add_generation_prompt=True``, and the target generates up to
``max_new_tokens`` tokens (and no more than ``max_length`` leaves room for; greedy, or sampled at ``temperature``,
seeded per batch) until its end of turn; the decoded text (special tokens dropped) replaces the turn. Conversations
are regenerated 8 at a time, each batch's next assistant turns generated together (left-padded: greedy tokens can
differ from a batch-of-one decoding where padding changes a near-tied argmax). Once the prompt alone reaches
``max_length`` tokens the remaining turns are dropped: the capture would truncate them away anyway. Each
conversation's original and
regenerated turns go to ``regenerated_turns.jsonl`` in the dataset directory (one JSON line per source record,
appended as it is regenerated; on ``--resume`` a record regenerated again appends a new line: the last one counts).

Both backends generate: the Hugging Face model itself (:func:`hf_replies`), or the SGLang server that captures
(:func:`server_replies`), whose generation requests carry no eagle-io sample parameter and so are never captured
(``capturing.sglang.scheduler``: only requests with ``custom_params["eagle_io_sample_id"]`` are written);
the server batches them itself, and a sampled reply is seeded per conversation (SGLang's ``sampling_seed``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import torch

from .. import defaults
from ..data.sources import Conversation
from ..data.turns import prepare_turns
from ..errors import InvalidArgumentError, StorageError
from .models import end_of_turn_ids

__all__ = ["RegenerateOptions", "Regenerator", "Replies", "hf_replies", "server_replies", "turns_path"]


def turns_path(root: str | os.PathLike[str], rank: int = 0, world_size: int = 1) -> str:
    """Where ``rank``'s regenerated turns go inside the dataset directory ``root``."""
    name = "regenerated_turns.jsonl" if world_size == 1 and rank == 0 else f"regenerated_turns.r{rank:05}.jsonl"
    return os.path.join(os.fspath(root), name)


@dataclass(frozen=True)
class RegenerateOptions:
    """``max_new_tokens`` per assistant turn; ``temperature`` 0 = greedy; ``seed`` + the record index seeds the
    sampling of each conversation; ``max_length``: the capture's truncation (turns past it are not generated)."""

    max_new_tokens: int = 512
    temperature: float = 0.0
    seed: int = 0
    max_length: int | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.temperature < 0:
            raise InvalidArgumentError(
                f"--max-new-tokens must be >= 1 and --temperature >= 0 (got {self.max_new_tokens}, {self.temperature})"
            )

    def metadata(self, model_id: str) -> dict[str, Any]:
        """What the dataset metadata records (``metadata["regenerated"]``)."""
        return {
            "by": model_id,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "turns_file": "regenerated_turns.jsonl",
        }


#: ``replies(prompts, rooms, seeds) -> [(new token ids, finished)]``: each prompt's continuation, at most ``rooms[i]``
#: new tokens, ``finished`` when it ended at an end of turn (the ids then end with that token) rather than at the
#: budget; ``seeds[i]`` seeds a sampled continuation.
Replies = Callable[[list[list[int]], list[int], list[int]], list[tuple[list[int], bool]]]


def hf_replies(model: torch.nn.Module, tokenizer: Any, options: RegenerateOptions) -> Replies:
    """Replies by a Hugging Face causal LM: one ``model.generate`` per batch, left-padded (greedy tokens can differ
    from a batch-of-one decoding where padding changes a near-tied argmax); a sampled batch is seeded with its first
    seed."""
    eos = end_of_turn_ids(model, tokenizer)

    @torch.no_grad()
    def replies(prompts: list[list[int]], rooms: list[int], seeds: list[int]) -> list[tuple[list[int], bool]]:
        pad = eos[0]
        width = max(len(p) for p in prompts)
        x = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        kw: dict[str, Any] = {"max_new_tokens": max(rooms), "eos_token_id": eos, "pad_token_id": pad}
        if options.temperature > 0:
            torch.manual_seed(seeds[0])
            kw |= {"do_sample": True, "temperature": options.temperature, "top_k": 0, "top_p": 1.0}
        else:
            kw |= {"do_sample": False}
        out = model.generate(input_ids=x, attention_mask=mask, **kw)[:, width:].tolist()
        done = []
        for row, room in zip(out, rooms, strict=True):
            row = row[:room]
            end = next((i for i, t in enumerate(row) if t in eos), None)
            done.append((row[: end + 1], True) if end is not None else (row, False))
        return done

    return replies


def server_replies(url: str, options: RegenerateOptions) -> Replies:
    """Replies by a running SGLang server (token ids in and out, ``POST /generate``): one request per batch,
    ``max_new_tokens`` per prompt, ``temperature`` and, when sampling, ``sampling_seed`` per conversation;
    ``finished`` when SGLang's ``finish_reason`` is ``"stop"`` (its end-of-turn ids are the model's). No
    ``custom_params``: nothing of these forwards is captured.

    Raises:
        SGLangError: the server did not answer, or not as SGLang does (names the URL).
    """
    from ..sglang.servers import http_json

    def replies(prompts: list[list[int]], rooms: list[int], seeds: list[int]) -> list[tuple[list[int], bool]]:
        params = []
        for room, seed in zip(rooms, seeds, strict=True):
            p: dict[str, Any] = {"max_new_tokens": room, "temperature": options.temperature}
            if options.temperature > 0:
                p["sampling_seed"] = seed
            params.append(p)
        outs = http_json(f"{url.rstrip('/')}/generate", {"input_ids": prompts, "sampling_params": params},
                         timeout_s=defaults.SERVER_REQUEST_TIMEOUT_S)  # fmt: skip
        done = []
        for out, room in zip(outs, rooms, strict=True):
            reason = (out.get("meta_info") or {}).get("finish_reason") or {}
            done.append(([int(t) for t in out["output_ids"]][:room], reason.get("type") == "stop"))
        return done

    return replies


class Regenerator:
    """Regenerates conversations ``batch`` at a time (their next assistant turns generated together by ``replies``:
    :func:`hf_replies` or :func:`server_replies`), rendering prompts with ``tokenizer``'s chat template and writing
    each record's turns to ``path`` (:func:`turns_path`). A sampled reply is seeded with ``options.seed`` + its
    record index (HF: one seed per batch, that of the batch's first conversation still waiting for a turn)."""

    def __init__(self, replies: Replies, tokenizer: Any, options: RegenerateOptions, path: str, batch: int = 8) -> None:
        self.replies, self.tokenizer, self.options, self.path, self.batch = replies, tokenizer, options, path, batch
        self.turns = self.tokens = 0

    def _prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return list(
            self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False, **self.options.template_kwargs
            )
        )

    def regenerate_batch(self, conversations: list[Conversation]) -> list[tuple[Conversation, dict[str, Any]]]:
        """Each conversation with its assistant turns regenerated, and its record (``sample_id``, ``turns``: each
        assistant turn's ``original`` and ``regenerated`` text, ``new_tokens``, ``finished`` (ended at an end of
        turn, not at the token budget), ``dropped_turns``: turns past ``max_length``, not generated)."""
        o = self.options
        todo = [prepare_turns(c.messages)[0] for c in conversations]
        outs: list[list[dict[str, str]]] = [[] for _ in conversations]
        turns: list[list[dict[str, Any]]] = [[] for _ in conversations]
        dropped = [0] * len(conversations)
        at = [0] * len(conversations)
        while True:
            waiting = []  # (conversation, prompt, original text)
            for k, msgs in enumerate(todo):
                while at[k] < len(msgs) and msgs[at[k]]["role"] != "assistant":
                    outs[k].append(dict(msgs[at[k]]))
                    at[k] += 1
                if at[k] == len(msgs):
                    continue
                prompt = self._prompt(outs[k])
                if o.max_length is not None and len(prompt) >= o.max_length:
                    dropped[k] = sum(m["role"] == "assistant" for m in msgs[at[k] :])
                    at[k] = len(msgs)
                    continue
                waiting.append((k, prompt, msgs[at[k]]["content"]))
            if not waiting:
                break
            rooms = [
                o.max_new_tokens if o.max_length is None else min(o.max_new_tokens, o.max_length - len(p))
                for _, p, _ in waiting
            ]
            seeds = [o.seed + conversations[k].index for k, _, _ in waiting]
            replies = self.replies([p for _, p, _ in waiting], rooms, seeds)
            for (k, _, original), (ids, finished) in zip(waiting, replies, strict=True):
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                outs[k].append({"role": "assistant", "content": text})
                turns[k].append(
                    {"original": original, "regenerated": text, "new_tokens": len(ids), "finished": finished}
                )
                at[k] += 1
                self.turns += 1
                self.tokens += len(ids)
        return [
            (
                Conversation(c.index, c.id, outs[k], c.byte_offset),
                {"sample_id": c.index, "turns": turns[k], "dropped_turns": dropped[k]},
            )
            for k, c in enumerate(conversations)
        ]

    def map(self, conversations: Iterable[Conversation]) -> Iterator[Conversation]:
        """Regenerates the conversations ``batch`` at a time, appending each record to :attr:`path` before yielding
        it.

        Raises:
            StorageError: the turns file cannot be written.
        """
        it = iter(conversations)
        while chunk := list(islice(it, self.batch)):
            done = self.regenerate_batch(chunk)
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    for _, record in done:
                        f.write(json.dumps(record, ensure_ascii=False) + "\n")
            except OSError as e:
                err = StorageError(f"regenerated turns {self.path}: {e.strerror or e}")
                err.path, err.errno = self.path, e.errno
                raise err from e
            for new, _ in done:
                yield new
