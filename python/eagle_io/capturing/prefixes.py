"""Which first tokens of a sample a capture stores once (docs/FORMAT.md 4.7): the longest prefix it shares with an
earlier sample of the run, capped at the end of its system prompt (no system prompt, no prefix), rounded down to a
multiple of :data:`eagle_io.defaults.PREFIX_BLOCK_TOKENS` and at least that many tokens. The count travels with the
sample to the writer, which stores those tokens' rows once, as a prefix record (the first time their token ids are
seen, from that sample's own forward), and every sample's rows after them with a reference.

Earlier prefixes are known by the SHA-256 of their token ids (int64 little-endian), the digest the writer keys its
prefix records by, so a resumed run starts from the prefix records its dataset holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from .. import defaults

__all__ = ["SharedPrefixes"]


class SharedPrefixes:
    """The prefixes seen so far in one capture.

    Args:
        known: prefix records the dataset holds already (``"sha256:<hex>"`` keys, as
            :meth:`eagle_io.ShardWriter.prefixes` gives them).
        block: prefixes are whole multiples of this many tokens.
    """

    def __init__(self, known: Iterable[str] = (), block: int = defaults.PREFIX_BLOCK_TOKENS) -> None:
        self.block = block
        self._seen = {bytes.fromhex(k.removeprefix("sha256:")) for k in known}

    def shared(self, input_ids: Sequence[int] | torch.Tensor, system_tokens: int) -> int:
        """Tokens of this sample to store once: the longest multiple of ``block`` tokens, at most ``system_tokens``
        and fewer than the sample's, whose token ids an earlier sample (or a known prefix record) began with; 0 when
        none. Records this sample's own such prefixes for the samples after it."""
        ids = np.ascontiguousarray(torch.as_tensor(input_ids, dtype=torch.int64).numpy(), dtype="<i8")
        top = min(system_tokens, len(ids) - 1) // self.block * self.block
        h, found, digests = hashlib.sha256(), 0, []
        for end in range(self.block, top + 1, self.block):
            h.update(ids[end - self.block : end].tobytes())
            digest = h.copy().digest()
            if digest in self._seen:
                found = end
            digests.append(digest)
        self._seen.update(digests)
        return found
