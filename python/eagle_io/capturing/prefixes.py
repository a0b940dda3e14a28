"""Which first tokens of a sample a capture stores once (docs/FORMAT.md 4.7).

* **Choosing a new prefix** (:meth:`SharedPrefixes.shared`): the longest prefix a sample shares with an earlier
  sample of the run, capped (offline: at the end of its system prompt; live: before its first supervised token and
  its last token), rounded down to a multiple of :data:`eagle_io.defaults.PREFIX_BLOCK_TOKENS` and at least that
  many tokens. The count travels with the sample to the writer, which stores those tokens' rows once, as a prefix
  record (the first time their token ids are seen, from that sample's own forward), and every sample's rows after
  them with a reference.
* **Reusing a stored one** (:meth:`SharedPrefixes.match`, a capture on SGLang): the longest prefix
  record put already that a new request's prompt begins with. The request is then served from SGLang's radix cache
  up to that prefix and stores only the rows after it (:mod:`eagle_io.capturing.sglang.capture`).

Prefixes are known by :func:`token_digest` of their token ids, the digest the writer keys its prefix records by, so
a resumed run starts from the prefix records its dataset holds.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from .. import defaults

__all__ = ["SharedPrefixes", "token_digest"]


def token_digest(input_ids: Sequence[int] | torch.Tensor) -> bytes:
    """SHA-256 of token ids as int64 little-endian: a prefix record's digest (its key is ``sha256:<hex>``)."""
    return hashlib.sha256(_le_int64(input_ids).tobytes()).digest()


def _le_int64(input_ids: Sequence[int] | torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(torch.as_tensor(input_ids, dtype=torch.int64).numpy(), dtype="<i8")


class SharedPrefixes:
    """The prefixes seen so far in one capture, and the prefix records put.

    Args:
        known: prefix records the dataset holds already (``"sha256:<hex>"`` keys, as
            :meth:`eagle_io.ShardWriter.prefixes` gives them).
        block: prefixes are whole multiples of this many tokens.
        remember: block digests of earlier samples kept, least recently seen forgotten first (bounds a live
            capture's memory: about 100 bytes each).
    """

    def __init__(
        self,
        known: Iterable[str] = (),
        block: int = defaults.PREFIX_BLOCK_TOKENS,
        remember: int = defaults.PREFIX_DIGESTS_KEPT,
    ) -> None:
        self.block, self.remember = block, remember
        self.stored = {bytes.fromhex(k.removeprefix("sha256:")) for k in known}
        self._seen: OrderedDict[bytes, None] = OrderedDict.fromkeys(self.stored)

    def _blocks(self, input_ids: Sequence[int] | torch.Tensor, limit: int) -> list[tuple[int, bytes]]:
        """``(end, digest of the first end tokens)`` for each multiple of ``block`` up to ``limit`` tokens (and
        fewer than the sample's)."""
        ids = _le_int64(input_ids)
        top = min(limit, len(ids) - 1) // self.block * self.block
        h, out = hashlib.sha256(), []
        for end in range(self.block, top + 1, self.block):
            h.update(ids[end - self.block : end].tobytes())
            out.append((end, h.copy().digest()))
        return out

    def shared(self, input_ids: Sequence[int] | torch.Tensor, limit: int) -> int:
        """Tokens of this sample to store once: the longest multiple of ``block`` tokens, at most ``limit`` and
        fewer than the sample's, whose token ids an earlier sample (or a known prefix record) began with; 0 when
        none. Records this sample's own such prefixes for the samples after it."""
        return self._remember(self._blocks(input_ids, limit))

    def _remember(self, blocks: list[tuple[int, bytes]]) -> int:
        found = 0
        for end, digest in blocks:
            if digest in self._seen:
                found = end
                self._seen.move_to_end(digest)
            else:
                self._seen[digest] = None
        while len(self._seen) > self.remember:
            self._seen.popitem(last=False)
        return found

    def match(self, input_ids: Sequence[int] | torch.Tensor, limit: int) -> tuple[int, bytes | None, int]:
        """``(tokens, digest, 0)`` of the longest prefix record put (:meth:`note_stored`) or known that this sample
        begins with, at most ``limit`` tokens and fewer than the sample's; else ``(0, None, shared)``, ``shared`` as
        :meth:`shared` gives it (and records). The prompt is hashed once."""
        blocks = self._blocks(input_ids, limit)
        for end, digest in reversed(blocks):
            if digest in self.stored:
                return end, digest, 0
        return 0, None, self._remember(blocks)

    def note_stored(self, input_ids: Sequence[int] | torch.Tensor) -> None:
        """A sample whose first ``len(input_ids)`` tokens are these was put with them as its shared prefix: the
        writer holds their prefix record before any sample put after it (may be called from another thread)."""
        self.stored.add(token_digest(input_ids))
