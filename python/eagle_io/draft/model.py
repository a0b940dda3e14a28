"""A reference EAGLE-3 draft: ``fc`` (k*H -> H), one Llama decoder layer over ``[embed ; hidden]``, norm,
``lm_head`` over the draft vocabulary.

Architecture and parameter names follow SpecForge's ``LlamaForCausalLMEagle3``
(``specforge/modeling/draft/llama3_eagle.py``: ``LlamaDecoderLayer`` with ``hidden_norm`` /
``input_layernorm`` and q/k/v projections from ``2 * hidden_size``; ``project_hidden_states``;
``compute_logits`` = ``lm_head(norm(h))``) and SGLang's loader (``sglang/srt/models/llama_eagle3.py``:
``LlamaForCausalLMEagle3.load_weights`` maps ``midlayer.*``, ``fc``, ``norm``, ``lm_head``, reads ``d2t`` as
``hot_token_id = d2t + arange`` and ignores ``t2d``), so :func:`eagle_io.draft.export.save_draft` writes a
checkpoint both read unchanged.

Layer maths (per token, SGLang ``LlamaModel.forward`` / SpecForge ``LlamaDecoderLayer.forward``)::

    x = fc(aux)                                            # [.., H]   (aux: [.., k*H_target])
    a = attn(cat(input_layernorm(embed(ids)), hidden_norm(x)))   # q/k/v: [2H -> heads*head_dim], causal, RoPE
    x = x + a
    x = x + mlp(post_attention_layernorm(x))               # SiLU-gated MLP
    logits = lm_head(norm(x))                              # [.., draft_vocab]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InvalidArgumentError
from .caches import DraftKVCache, TTTCache, repeat_kv

__all__ = ["DraftKVCache", "Eagle3Draft", "Eagle3DraftConfig", "TTTCache", "packed_attention_mask"]


@dataclass
class Eagle3DraftConfig:
    """Shapes of an EAGLE-3 draft. ``hidden_size`` must equal the target's (the draft embeds tokens with the
    target's embedding, as SGLang's EAGLE-3 worker shares it); ``target_hidden_size`` is the width of each of
    the ``num_aux_layers`` captured states."""

    vocab_size: int
    draft_vocab_size: int
    hidden_size: int
    target_hidden_size: int
    num_aux_layers: int = 3
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    intermediate_size: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RMSNorm(nn.Module):
    """Llama RMSNorm: ``weight * x / sqrt(mean(x^2) + eps)``, computed in float32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Llama (NeoX "rotate half") rotary embedding; ``x [B, heads, L, D]``, ``cos/sin [L, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: Eagle3DraftConfig) -> None:
        super().__init__()
        d, h, kv = cfg.head_size, cfg.num_attention_heads, cfg.num_key_value_heads
        self.heads, self.kv_heads, self.head_dim = h, kv, d
        self.q_proj = nn.Linear(2 * cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: DraftKVCache | TTTCache | None = None,
    ) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        freqs = position_ids.float()[..., None] * self.inv_freq  # [B, L, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, L, D]
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        scale = 1.0 / math.sqrt(self.head_dim)
        if cache is not None:  # incremental decoding or a TTT unroll step (eagle_io.draft.caches)
            return self.o_proj(cache.attend(q, k, v, scale).transpose(1, 2).reshape(b, n, -1))
        k, v = repeat_kv(k, self.heads // self.kv_heads), repeat_kv(v, self.heads // self.kv_heads)
        # Right-padded batches need only the causal mask: a real query never sees a later (padded) key. Packed rows
        # get the block-diagonal causal ``mask`` (:func:`packed_attention_mask`).
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    def __init__(self, cfg: Eagle3DraftConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """SpecForge/SGLang's EAGLE-3 ``midlayer``: attention over ``[input_layernorm(emb) ; hidden_norm(h)]``."""

    def __init__(self, cfg: Eagle3DraftConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        emb: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: DraftKVCache | TTTCache | None = None,
    ) -> torch.Tensor:
        x = torch.cat((self.input_layernorm(emb), self.hidden_norm(hidden)), dim=-1)
        hidden = hidden + self.self_attn(x, position_ids, mask, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def packed_attention_mask(position_ids: torch.Tensor) -> torch.Tensor | None:
    """The attention mask of a batch whose rows may pack several samples end to end (``PackingCollator``).

    A sample starts wherever ``position_ids[b, t] != position_ids[b, t - 1] + 1`` (and at ``t = 0``); a query sees
    the keys of its own sample up to itself. Returns ``[B, 1, L, L]`` bool (True = attend), or None when every row
    is one sample (``0 .. L-1``, as ``PaddingCollator`` gives), where plain causal attention is the same and faster.
    """
    new = torch.ones_like(position_ids, dtype=torch.bool)
    new[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    if not bool(new[:, 1:].any()):
        return None
    seg = new.cumsum(-1)
    n = position_ids.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=position_ids.device).tril()
    return ((seg[:, :, None] == seg[:, None, :]) & causal)[:, None]


class Eagle3Draft(nn.Module):
    """The draft. ``embed_tokens`` is frozen (the target's); ``d2t [draft_vocab]`` int64 and
    ``t2d [vocab]`` bool are buffers holding the vocabulary mapping (:mod:`eagle_io.interop.vocab`).

    ``forward(aux [B, L, k*H_t], next_ids [B, L] int64, position_ids [B, L] | None)`` returns draft logits
    ``[B, L, draft_vocab]`` (float32 compute). Position ``t`` sees ``aux[t]`` and the embedding of the token
    that follows position t (the shift contract, :func:`eagle_io.feed.shift_targets`).

    Besides the training forward: :meth:`ttt_forward` (SpecForge's test-time-training unroll) and :meth:`extend` +
    :meth:`logits` (incremental decoding over a :class:`eagle_io.draft.caches.DraftKVCache`, as SGLang runs the
    draft). Both give the training forward's values where they compute the same thing (tested).

    Batches: right-padded rows (``PaddingCollator``; ``position_ids`` None or ``0 .. L-1``), or packed rows
    (``PackingCollator``): pass its ``position_ids`` (restarting at 0 per sample) and attention is block-diagonal
    (:func:`packed_attention_mask`), so a sample's logits are the same packed or padded. A packed row given without
    its ``position_ids`` is read as one sequence.
    """

    def __init__(self, cfg: Eagle3DraftConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(cfg.num_aux_layers * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = DecoderLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def set_vocab_mapping(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Installs ``d2t [draft_vocab]`` int64 offsets and ``t2d [vocab]`` bool: shapes checked, then every
        invariant of :func:`eagle_io.interop.vocab.validate_mapping` (one-to-one included), so no draft is trained
        or exported with a broken map (raises InvalidArgumentError naming the first)."""
        from ..interop.vocab import validate_mapping

        if tuple(d2t.shape) != tuple(self.d2t.shape) or tuple(t2d.shape) != tuple(self.t2d.shape):
            raise InvalidArgumentError(
                f"vocab mapping d2t {list(d2t.shape)} / t2d {list(t2d.shape)} does not fit the draft "
                f"(draft_vocab_size {self.config.draft_vocab_size}, vocab_size {self.config.vocab_size})"
            )
        validate_mapping(d2t.to(torch.int64), t2d.to(torch.bool), self.config.draft_vocab_size, self.config.vocab_size)
        self.d2t.copy_(d2t.to(torch.int64))
        self.t2d.copy_(t2d.to(torch.bool))

    def draft_token_ids(self) -> torch.Tensor:
        """Target ids of the draft vocabulary: ``d2t + arange`` (SGLang's ``hot_token_id``)."""
        return self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)

    def forward(
        self, aux: torch.Tensor, next_ids: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, n, width = aux.shape
        if width != self.fc.in_features:
            raise InvalidArgumentError(
                f"aux width {width} != fc input {self.fc.in_features} "
                f"({self.config.num_aux_layers} x target_hidden_size {self.config.target_hidden_size})"
            )
        mask = None
        if position_ids is None:
            position_ids = torch.arange(n, device=aux.device).expand(b, n)
        else:
            mask = packed_attention_mask(position_ids)
        dtype = self.fc.weight.dtype
        hidden = self.fc(aux.to(dtype))
        emb = self.embed_tokens(next_ids).to(dtype)
        hidden = self.midlayer(emb, hidden, position_ids, mask)
        return self.lm_head(self.norm(hidden)).float()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``lm_head(norm(hidden))`` (float32) of a pre-norm ``hidden [.., H]``."""
        return self.lm_head(self.norm(hidden)).float()

    def ttt_forward(self, aux: torch.Tensor, next_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """SpecForge's test-time-training unroll (``specforge/algorithms/eagle3/model.py``,
        ``OnlineEagle3Model.forward``, sdpa backend) over right-padded rows: ``steps`` logits ``[B, L, draft_vocab]``
        (float32), one per step.

        Step 0 is :meth:`forward` (the same values). Step ``k`` feeds position ``t`` the token ``next_ids[t + k]`` (the
        ids shifted left ``k`` times, 0 past the end: SpecForge's ``padding(input_ids, left=False)``), the pre-norm
        hidden state step ``k - 1`` produced at ``t`` (SGLang's draft steps feed their own hidden state the same way,
        ``fc`` skipped), RoPE position ``t + k`` (SpecForge's ``position_ids + lck``), and attends as
        :class:`eagle_io.draft.caches.TTTCache` says. Its logits are the draft's guess of token ``t + 2 + k``.
        """
        b, n, width = aux.shape
        if width != self.fc.in_features:
            raise InvalidArgumentError(
                f"aux width {width} != fc input {self.fc.in_features} "
                f"({self.config.num_aux_layers} x target_hidden_size {self.config.target_hidden_size})"
            )
        if steps < 1:
            raise InvalidArgumentError(f"TTT steps must be >= 1, got {steps}")
        dtype = self.fc.weight.dtype
        position_ids = torch.arange(n, device=aux.device).expand(b, n)
        hidden = self.fc(aux.to(dtype))
        cache = TTTCache()
        ids = next_ids
        out = []
        for k in range(steps):
            if k:
                ids = torch.cat((ids[:, 1:], torch.zeros_like(ids[:, :1])), dim=1)
            hidden = self.midlayer(self.embed_tokens(ids).to(dtype), hidden, position_ids + k, cache=cache)
            out.append(self.logits(hidden))
        return out

    def extend(
        self, states: torch.Tensor, next_ids: torch.Tensor, position_ids: torch.Tensor, cache: DraftKVCache
    ) -> torch.Tensor:
        """One incremental draft forward over ``n`` new positions, as SGLang runs the draft (``srt/models/
        llama_eagle3.py``, ``LlamaModel.forward``): a draft extend over target states, or a draft decode step.

        Args:
            states: ``[B, n, width]``. ``fc`` runs only when ``width`` differs from the draft's hidden size (SGLang's
                ``if hidden_states.shape[-1] != embeds.shape[-1]``): the target's ``k * H_t`` aux states are projected;
                an ``H``-wide state passes unprojected (the draft's own hidden state in later draft steps, or the
                target's final state when an EAGLE-3 draft is served as ``EAGLE``).
            next_ids: ``[B, n]`` int64, the token that follows each position.
            position_ids: ``[B, n]`` int64 RoPE positions, continuing ``cache`` (``len(cache) ..``).
            cache: :class:`eagle_io.draft.caches.DraftKVCache`, extended in place.

        Returns:
            The pre-norm hidden state ``[B, n, H]`` (what SGLang hands the next draft step, ``norm_output`` off);
            :meth:`logits` gives the draft-vocabulary logits.

        Raises:
            InvalidArgumentError: a width to project that is not ``fc``'s input width.
        """
        dtype = self.fc.weight.dtype
        x = states.to(dtype)
        if x.shape[-1] != self.config.hidden_size:
            if x.shape[-1] != self.fc.in_features:
                raise InvalidArgumentError(
                    f"states {x.shape[-1]} wide: neither the draft hidden size {self.config.hidden_size} nor fc's "
                    f"input width {self.fc.in_features}"
                )
            x = self.fc(x)
        return self.midlayer(self.embed_tokens(next_ids).to(dtype), x, position_ids, cache=cache)
