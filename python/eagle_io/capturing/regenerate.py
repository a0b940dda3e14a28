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
``max_new_tokens`` tokens (greedy, or sampled at ``temperature`` with a per-conversation seed) until its end of turn;
the decoded text (special tokens dropped) replaces the turn. Once the prompt alone reaches ``max_length`` tokens the
remaining turns are dropped: the capture would truncate them away anyway. Each conversation's original and
regenerated turns go to ``regenerated_turns.jsonl`` in the dataset directory (one JSON line per source record,
appended as it is regenerated; on ``--resume`` a record regenerated again appends a new line: the last one counts).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..data.sources import Conversation
from ..data.turns import prepare_turns
from ..errors import InvalidArgumentError, StorageError

__all__ = ["RegenerateOptions", "Regenerator", "turns_path"]


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


class Regenerator:
    """Regenerates conversations with ``model`` (a Hugging Face causal LM) and its ``tokenizer``, writing each
    record's turns to ``path`` (:func:`turns_path`)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, options: RegenerateOptions, path: str) -> None:
        self.model, self.tokenizer, self.options, self.path = model, tokenizer, options, path
        self.turns = self.tokens = 0
        eos = getattr(model.generation_config, "eos_token_id", None)
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
            eos.append(tokenizer.eos_token_id)
        self.eos = eos

    @torch.no_grad()
    def _reply(self, prompt: list[int], budget: int, index: int) -> tuple[list[int], bool]:
        o = self.options
        kw: dict[str, Any] = {"max_new_tokens": budget, "eos_token_id": self.eos, "pad_token_id": self.eos[0]}
        if o.temperature > 0:
            torch.manual_seed(o.seed + index)
            kw |= {"do_sample": True, "temperature": o.temperature, "top_k": 0, "top_p": 1.0}
        else:
            kw |= {"do_sample": False}
        x = torch.tensor([prompt], device=self.model.device)
        out = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kw)[0, len(prompt) :].tolist()
        finished = bool(out) and out[-1] in self.eos
        return out, finished

    def regenerate(self, conversation: Conversation) -> tuple[Conversation, dict[str, Any]]:
        """The conversation with its assistant turns regenerated, and its record (``sample_id``, ``turns``: each
        assistant turn's ``original`` and ``regenerated`` text, ``new_tokens``, ``finished`` (ended at an end of
        turn, not at ``max_new_tokens``), ``dropped_turns``)."""
        o = self.options
        messages, _ = prepare_turns(conversation.messages)
        out: list[dict[str, str]] = []
        turns: list[dict[str, Any]] = []
        dropped = 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                out.append(dict(m))
                continue
            prompt = self.tokenizer.apply_chat_template(
                out, add_generation_prompt=True, tokenize=True, return_dict=False, **o.template_kwargs
            )
            room = o.max_new_tokens if o.max_length is None else min(o.max_new_tokens, o.max_length - len(prompt))
            if room < 1:
                dropped = sum(x["role"] == "assistant" for x in messages[i:])
                break
            ids, finished = self._reply(list(prompt), room, conversation.index)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append({"role": "assistant", "content": text})
            turns.append({"original": m["content"], "regenerated": text, "new_tokens": len(ids), "finished": finished})
            self.turns += 1
            self.tokens += len(ids)
        record = {"sample_id": conversation.index, "turns": turns, "dropped_turns": dropped}
        return Conversation(conversation.index, conversation.id, out, conversation.byte_offset), record

    def map(self, conversations: Iterable[Conversation]) -> Iterator[Conversation]:
        """Regenerates each conversation, appending its record to :attr:`path` before yielding it.

        Raises:
            StorageError: the turns file cannot be written.
        """
        for c in conversations:
            new, record = self.regenerate(c)
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
            except OSError as e:
                err = StorageError(f"regenerated turns {self.path}: {e.strerror or e}")
                err.path, err.errno = self.path, e.errno
                raise err from e
            yield new
