"""Assembling one sample from the forwards SGLang runs for one request, in a scheduler process.

SGLang with its defaults does not give a request's states in one forward:

* **chunked prefill** splits a prompt over several extend forwards (``prefix_len`` = the tokens done before);
* the **decode** forwards of a request that generates an answer each bring the state of the token fed in;
* under speculative decoding (EAGLE3 with a draft), each **verify** forward brings the states of the tokens it fed
  whose drafts were accepted: the last committed token (the previous step's bonus token) and the accepted draft
  tokens, in commit order (:func:`eagle_io.sglang.probe.verify_rows`);
* a **retracted** request (evicted under memory pressure, ``Req.reset_for_retract``) is prefilled again later, over
  its prompt and the tokens generated so far, possibly from a prefix it had cached itself.

:class:`RequestStates` keeps, per request, the rows of every forward at their token positions: an extend at
``prefix_len = p`` replaces whatever was held from position ``p`` on (a retracted request's recomputed rows replace
the first ones, so no row is held twice). A decode or verify forward *proposes* rows (:meth:`RequestStates.propose`:
it cannot know yet how many tokens it commits without a host sync); once SGLang processed its result, the request's
committed length says how many of them are real (:meth:`RequestStates.commit`: prompt plus generated tokens but the
last, whose state no forward computed yet), oldest proposal first (an overlap scheduler runs the next forward
before processing this one's result). An extend that starts past what is held (a prefix
served from the radix cache that this capture never saw) makes the request incomplete: it is never stored, and
counted. A request admitted after a **stored prefix** (``Held.start`` tokens whose states a prefix record of the
dataset holds: SGLang serves them from its radix cache, :mod:`.capture`) is held from that position on; rows an
extend recomputes before it (the cache held less of the prefix) are dropped. Rows are device tensors cloned right
behind the forward (no host sync); they are joined when the request finishes (:meth:`RequestStates.take`).

Device memory held: ``rows * (k + 1) * H * itemsize`` per unfinished sampled request.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Held", "RequestStates"]


@dataclass
class Held:
    """The rows held for one request: ``parts`` are ``(position, aux [n, k*H], final [n, H])`` in position order,
    contiguous from ``start``; ``pending`` the proposals of forwards whose results are not processed yet, oldest
    first (``(aux [m, k*H], final [m, H])``: m candidate rows from the next position on); ``broken`` says why the
    request can no longer be stored (None: it can).

    ``start``: its first tokens whose states the prefix record of digest ``stored_prefix`` holds (0 and None: none);
    ``shared_prefix``: its first tokens to store once as a new prefix record (``ForwardSample.shared_prefix``)."""

    sample_id: int
    params: dict[str, Any]
    start: int = 0
    stored_prefix: bytes | None = None
    shared_prefix: int = 0
    parts: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    pending: deque[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=deque)
    broken: str | None = None

    @property
    def rows(self) -> int:
        """The position after the last row held (``start`` when none is)."""
        if not self.parts:
            return self.start
        pos, aux, _ = self.parts[-1]
        return pos + int(aux.shape[0])

    def cut(self, position: int) -> None:
        """Drops every row at or after ``position``."""
        kept = []
        for pos, aux, fin in self.parts:
            if pos >= position:
                break
            n = min(int(aux.shape[0]), position - pos)
            kept.append((pos, aux[:n], fin[:n]))
        self.parts = kept


class RequestStates:
    """Per-request rows of the sampled requests of one scheduler (see the module docstring). Called from the
    scheduler's thread only."""

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}

    def __len__(self) -> int:
        return len(self.held)

    def extend(
        self, rid: str, prefix_len: int, aux: torch.Tensor, final: torch.Tensor, new: Held | None = None
    ) -> None:
        """An extend forward of request ``rid`` over positions ``[prefix_len, prefix_len + len(aux))``; ``new``:
        what to hold for a request not held yet (its first forward)."""
        h = self.held.get(rid)
        if h is None:
            if new is None:
                return
            h = self.held[rid] = new
        if prefix_len < h.start:  # recomputed rows of the stored prefix: its record holds them
            skip = min(h.start - prefix_len, int(aux.shape[0]))
            aux, final, prefix_len = aux[skip:], final[skip:], prefix_len + skip
            if not int(aux.shape[0]):
                return
        if prefix_len > h.rows:
            h.broken = h.broken or (
                f"its forward starts at token {prefix_len} but only {h.rows} were captured before (a prefix served "
                "from the radix cache, or a capture started while the request ran)"
            )
            return
        h.cut(prefix_len)  # from 0: a retracted request's re-prefill with nothing cached
        h.pending.clear()  # a re-prefill (retraction) recomputes what earlier forwards proposed
        h.parts.append((prefix_len, aux, final))

    def propose(self, rid: str, aux: torch.Tensor, final: torch.Tensor) -> None:
        """A decode (one row) or verify forward (its accepted-path rows, at most ``spec_steps + 1``) of ``rid``:
        candidate rows from the next position on, committed by :meth:`commit`. A request not held (its prefill came
        before the capture started) is ignored: it is never stored."""
        h = self.held.get(rid)
        if h is not None and h.broken is None:
            h.pending.append((aux, final))

    def commit(self, rid: str, rows: int) -> None:
        """SGLang processed the result of ``rid``'s oldest proposing forward, after which the request holds
        ``rows`` computed states (prompt plus committed tokens but the last): that proposal's first rows up to
        ``rows`` are kept, the rest (rejected drafts, tokens past a stop) dropped. No proposal: nothing to do (an
        extend forward's rows are held already)."""
        h = self.held.get(rid)
        if h is None or not h.pending:
            return
        aux, final = h.pending.popleft()
        n = min(int(aux.shape[0]), rows - h.rows)
        if n > 0:
            h.parts.append((h.rows, aux[:n], final[:n]))

    def take(self, rid: str, rows: int) -> tuple[Held, torch.Tensor | None, torch.Tensor | None]:
        """Forgets ``rid`` and returns what was held with its rows ``[held.start, rows)`` joined (``[n, k*H]``,
        ``[n, H]``), or None for both when they cannot be: broken, or fewer rows held (``held.broken`` then
        says why). Rows past ``rows`` (a forward the overlap scheduler ran after the request finished) are left
        out."""
        h = self.held.pop(rid)
        h.pending.clear()
        if h.broken is None and h.rows < rows:
            h.broken = f"{h.rows} token states were captured for its {rows} tokens"
        if h.broken is not None:
            return h, None, None
        h.cut(rows)
        aux = torch.cat([a for _, a, _ in h.parts]) if len(h.parts) > 1 else h.parts[0][1]
        fin = torch.cat([f for _, _, f in h.parts]) if len(h.parts) > 1 else h.parts[0][2]
        return h, aux, fin

    def forget(self, rid: str) -> Held | None:
        return self.held.pop(rid, None)
