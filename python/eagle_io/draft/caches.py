"""What the draft's one attention layer attends to outside plain causal training: an incremental KV cache (speculative
decoding) and SpecForge's test-time-training (TTT) unroll.

Both take the layer's queries and its new keys/values after RoPE (``q [B, heads, n, D]``, ``k``/``v``
``[B, kv_heads, n, D]``, before the grouped-query repeat) and return the attention output ``[B, heads, n, D]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["DraftKVCache", "TTTCache", "repeat_kv"]


def repeat_kv(x: torch.Tensor, rep: int) -> torch.Tensor:
    """Grouped-query attention: each of the ``kv_heads`` heads of ``x [B, kv_heads, n, D]`` repeated ``rep`` times."""
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


class DraftKVCache:
    """The draft's keys and values of one batch of sequences for incremental decoding: ``k``/``v``
    ``[B, kv_heads, T, D]`` after RoPE, positions ``0 .. T-1``.

    Each :meth:`attend` appends its ``n`` new positions and lets each new query see every cached key up to its own
    position. :meth:`crop` drops the positions a verify rejected (SGLang's draft worker overwrites their KV slots
    with the draft extend of the accepted tokens; dropping them and extending again is the same computation).
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else int(self.k.shape[2])

    def crop(self, n: int) -> None:
        """Keeps the first ``n`` positions."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        self.k = k if self.k is None else torch.cat((self.k, k), dim=2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=2)
        rep = q.shape[1] // k.shape[1]
        keys, values = repeat_kv(self.k, rep), repeat_kv(self.v, rep)
        n, t = q.shape[2], keys.shape[2]
        if n == t:  # nothing cached before: plain causal attention, as in training
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=scale)
        if n == 1:  # one new position sees every cached key
            return F.scaled_dot_product_attention(q, keys, values, scale=scale)
        seen = torch.arange(t, device=q.device)[None, :] <= torch.arange(t - n, t, device=q.device)[:, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=seen, scale=scale)


class TTTCache:
    """SpecForge's test-time-training attention (``specforge/modeling/draft/llama3_eagle.py``,
    ``LlamaAttention.forward`` with ``cache_hidden``, the sdpa backend of ``OnlineEagle3Model``).

    Step 0 is causal attention over the sequence (the training forward's). At step ``k >= 1`` the query at position
    ``t`` (rotated at ``t + k``) sees step 0's keys at positions ``<= t`` and the keys of steps ``1 .. k`` at ``t``
    itself: what the draft sees at inference when it drafts its ``k``-th token past position ``t`` (its cache then
    holds the prefix extended from the target's states, and its own ``k`` draft steps).
    """

    def __init__(self) -> None:
        self.k0: torch.Tensor | None = None
        self.v0: torch.Tensor | None = None
        self.steps: list[tuple[torch.Tensor, torch.Tensor]] = []

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        rep = q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, rep), repeat_kv(v, rep)
        if self.k0 is None:
            self.k0, self.v0 = k, v
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        self.steps.append((k, v))
        n = q.shape[2]
        prefix = torch.matmul(q, self.k0.transpose(2, 3)) * scale  # [B, heads, n, n]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        prefix = prefix.masked_fill(~causal, float("-inf"))
        own = [(q * ki).sum(-1, keepdim=True) * scale for ki, _ in self.steps]  # [B, heads, n, 1] each
        scores = torch.cat([prefix, *own], dim=-1)
        low = scores.dtype in (torch.float16, torch.bfloat16)  # upcast as SpecForge does; float64 stays float64
        w = torch.softmax(scores.float() if low else scores, dim=-1).to(q.dtype)
        out = torch.matmul(w[..., :n], self.v0)
        for i, (_, vi) in enumerate(self.steps):
            out = out + w[..., n + i : n + i + 1] * vi
        return out
