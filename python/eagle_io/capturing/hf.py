"""Reference EAGLE-3 capture path on Hugging Face transformers models, through forward hooks.

What is captured, per token (ids in eagle-io's convention, see :mod:`eagle_io.store.eagle3`):

* aux states: the residual stream at the *input* of each requested decoder layer ``i`` (= HF
  ``output_hidden_states[i]``; the same value SGLang's ``LlamaModel.forward`` appends for
  ``i in layers_to_capture``), concatenated in ascending layer order -> ``[T, k*H]``;
* the final *post-norm* hidden state (output of ``model.model.norm``) -> ``[T, H]``. In transformers 5.x
  this equals ``output_hidden_states[-1]``: ``capture_outputs`` in ``utils/output_capturing.py``
  (``tie_last_hidden_states=True``) replaces the last recorded layer output by ``last_hidden_state``, which
  ``LlamaModel.forward`` sets to ``self.norm(hidden_states)``. The pre-norm output of the last layer is
  therefore *not* in HF's tuple.

How: a forward pre-hook (``with_kwargs=True``) on each requested ``model.model.layers[i]`` copies its
``hidden_states`` input into one preallocated ``[B, T, k*H]`` buffer (one copy per aux layer, no later
concatenation), and a forward hook on ``model.model.norm`` keeps its output (no copy). Id ``N`` (the boundary after
the last layer, :mod:`eagle_io.store.eagle3`) is the *input* of ``model.model.norm``: the final pre-norm
residual stream, what SGLang's gpt-oss capture and vLLM's ``[.., N]`` ids record; a forward pre-hook on the norm
copies it into the last aux slot.
``output_hidden_states`` stays off, so the other layers' states are never kept. By default the base model
``model.model`` is called instead of the CausalLM, so the LM head (``[T, H] x [H, V]``) is never computed
(SmolLM2-135M on CPU: ~17-24% less time per forward).

Padding: rows may be right- or left-padded; ``attention_mask`` must be one contiguous block of ones per row.
Position ids are derived from the mask (``cumsum - 1``), so a left-padded sample sees the same positions as
when run alone. Padded positions of the buffers hold unspecified values (possibly NaN) and are never returned
by the per-sample accessors.

Exactness: a sample run without padding (alone, or in a batch of equal-length samples) gives bit-identical
states on CPU. With padding, attention reduces over the padded key length, so real tokens can differ in the
last bits whatever the attention implementation (``sdpa`` and ``eager`` alike): in float32 the per-token
relative L2 error was <= 4e-6 on SmolLM2 (tests bound it by 2e-5). In bfloat16 the same rounding differences
are amplified by the forward itself (0.05-3.5% per token on SmolLM2, the size of bf16-vs-fp32 forward
differences); batch equal lengths when bit-exactness matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ArgumentTypeError, InvalidArgumentError
from ..store.eagle3 import default_aux_layer_ids, validate_aux_layer_ids

__all__ = ["CapturedBatch", "HFCapture", "find_decoder"]


@dataclass(frozen=True)
class CapturedBatch:
    """States of one batch, on the model's device, in the capture dtype (the model's, or ``state_dtype``).

    Attributes:
        aux_hidden_states: ``[B, T, k*H]``; columns ``[j*H, (j+1)*H)`` are layer ``aux_layer_ids[j]``.
        hidden_states: ``[B, T, H]`` final post-norm states.
        input_ids: ``[B, T]`` the (padded) input ids as given.
        starts, lengths: sample ``b``'s real tokens are positions ``starts[b] : starts[b] + lengths[b]``
            (``starts[b] > 0`` only for left padding). A ring buffer can copy
            ``aux_hidden_states[b, start:start + length]`` directly.
        aux_layer_ids: the captured ids, ascending.
    Padded positions hold unspecified values.
    """

    aux_hidden_states: torch.Tensor
    hidden_states: torch.Tensor
    input_ids: torch.Tensor
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    aux_layer_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.lengths)

    def aux(self, b: int) -> torch.Tensor:
        """Unpadded aux states of sample ``b``: a view ``[L_b, k*H]``."""
        return self.aux_hidden_states[b, self.starts[b] : self.starts[b] + self.lengths[b]]

    def hidden(self, b: int) -> torch.Tensor:
        """Unpadded final post-norm states of sample ``b``: a view ``[L_b, H]``."""
        return self.hidden_states[b, self.starts[b] : self.starts[b] + self.lengths[b]]

    def token_ids(self, b: int) -> torch.Tensor:
        """Unpadded input ids of sample ``b``: a view ``[L_b]``."""
        return self.input_ids[b, self.starts[b] : self.starts[b] + self.lengths[b]]


def find_decoder(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """Locate ``(base_model, decoder_layers, final_norm)`` of a Llama-like HF model.

    Accepts a CausalLM with ``model.model.layers`` / ``model.model.norm`` or a base model with ``.layers`` /
    ``.norm``. Raises ``TypeError`` naming the model class when neither layout is present.
    """
    for base in (getattr(model, "model", None), model):
        if base is None:
            continue
        layers, norm = getattr(base, "layers", None), getattr(base, "norm", None)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0 and isinstance(norm, nn.Module):
            return base, layers, norm
    raise ArgumentTypeError(
        f"HFCapture cannot find the decoder of {type(model).__name__}: expected a Llama-like layout with "
        "`model.model.layers` (nn.ModuleList) and `model.model.norm` (or `.layers`/`.norm` on a base model)"
    )


def _spans(mask: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(starts, lengths) of the one block of ones per row of a ``[B, T]`` 0/1 mask; ValueError if not."""
    m = mask.detach().to("cpu", torch.int64)
    if not bool(((m == 0) | (m == 1)).all()):
        raise InvalidArgumentError("attention_mask must contain only 0 and 1")
    lengths = m.sum(dim=1)
    starts = m.argmax(dim=1)
    pos = torch.arange(m.shape[1]).unsqueeze(0)
    expected = (pos >= starts.unsqueeze(1)) & (pos < (starts + lengths).unsqueeze(1))
    bad = (expected != m.bool()).any(dim=1) | (lengths == 0)
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise InvalidArgumentError(
            f"attention_mask row {b} is not one non-empty contiguous block of ones (right or left padding only)"
        )
    return tuple(starts.tolist()), tuple(lengths.tolist())


class HFCapture:
    """Capture EAGLE-3 aux states and final post-norm states from a Llama-like HF model.

    Usage::

        with HFCapture(model, aux_layer_ids=None) as cap:   # None -> default_aux_layer_ids(N)
            out = cap.forward(input_ids, attention_mask)    # CapturedBatch
            aux0, hid0 = out.aux(0), out.hidden(0)          # [L_0, k*H], [L_0, H]

    Args:
        model: a ``*ForCausalLM`` (or base model) with the layout :func:`find_decoder` accepts, in eval mode.
        aux_layer_ids: eagle-io ids (input of 0-based decoder layer i), ascending, ``1 <= id <= N``
            (``N`` = the final pre-norm boundary); validated against ``config.num_hidden_layers``
            (:func:`eagle_io.store.eagle3.validate_aux_layer_ids`). ``None`` means SGLang's default
            ``[2, N//2, N-3]``.
        skip_lm_head: call the base model (``model.model``) so no logits are computed (default). ``False``
            calls the full model and discards its logits (kept only to measure the saving).
        state_dtype: dtype of the returned states; ``None`` keeps the model's dtype. E.g. a float32 forward
            with ``state_dtype=torch.bfloat16`` converts with round-to-nearest-even (``Tensor.copy_``, same as
            ``.to``), which is *not* bit-identical to running the forward in bfloat16.
    Hooks exist only between ``__enter__`` and ``__exit__`` (removed also when an exception propagates) and
    record only during :meth:`forward`. Not thread-safe; one capture per model at a time.
    """

    def __init__(
        self,
        model: nn.Module,
        aux_layer_ids: Sequence[int] | None = None,
        *,
        skip_lm_head: bool = True,
        state_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.base, self.layers, self.norm = find_decoder(model)
        cfg = getattr(model, "config", None)
        self.num_layers = int(getattr(cfg, "num_hidden_layers", len(self.layers)))
        if self.num_layers != len(self.layers):
            raise InvalidArgumentError(
                f"config.num_hidden_layers={self.num_layers} but the model has {len(self.layers)} layers"
            )
        if aux_layer_ids is None:
            self.aux_layer_ids = tuple(default_aux_layer_ids(self.num_layers))
        else:
            ids = validate_aux_layer_ids(list(aux_layer_ids), self.num_layers, final_boundary=True)
            self.aux_layer_ids = tuple(ids)
        self.skip_lm_head = skip_lm_head
        self.state_dtype = state_dtype
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._recording = False
        self._aux: torch.Tensor | None = None
        self._final: torch.Tensor | None = None
        self._seen: list[int] = []
        self._norm_calls = 0

    # -- hook management -------------------------------------------------------------------------------------
    def __enter__(self) -> HFCapture:
        if self._handles:
            raise InvalidArgumentError("HFCapture is already entered")
        try:
            for j, i in enumerate(self.aux_layer_ids):
                # id N: the input of the final norm (pre-norm boundary after the last layer)
                module = self.norm if i == self.num_layers else self.layers[i]
                self._handles.append(module.register_forward_pre_hook(self._make_pre_hook(j, i), with_kwargs=True))
            self._handles.append(self.norm.register_forward_hook(self._norm_hook))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove all hooks (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._recording = False

    def _make_pre_hook(self, j: int, layer_id: int):
        k = len(self.aux_layer_ids)

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self._recording:
                return None
            h = args[0] if args else kwargs["hidden_states"]
            width = h.shape[-1]
            if self._aux is None:
                dtype = self.state_dtype or h.dtype
                self._aux = torch.empty((*h.shape[:-1], k * width), dtype=dtype, device=h.device)
            self._aux[..., j * width : (j + 1) * width].copy_(h)
            self._seen.append(layer_id)
            return None

        return hook

    def _norm_hook(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if not self._recording:
            return None
        self._norm_calls += 1
        self._final = output if self.state_dtype is None else output.to(self.state_dtype)
        return None

    # -- capture ---------------------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> CapturedBatch:
        """Run the model on ``input_ids`` ``[B, T]`` (or ``[T]``) and return the captured states.

        ``attention_mask`` ``[B, T]`` of 0/1 (right or left padding); ``None`` means no padding. Runs under
        ``torch.inference_mode()`` with ``use_cache=False`` and ``output_hidden_states=False``.

        Raises:
            RuntimeError: if called outside the ``with`` block, or if a hooked layer / the final norm did not
                run exactly once (a model whose forward skips or repeats layers).
            ValueError: on a malformed mask or a shape mismatch.
        """
        if not self._handles:
            raise InvalidArgumentError("HFCapture.forward called outside its `with` block (no hooks installed)")
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
            attention_mask = None if attention_mask is None else attention_mask.reshape(1, -1)
        if input_ids.dim() != 2:
            raise InvalidArgumentError(f"input_ids must be [B, T] or [T], got shape {tuple(input_ids.shape)}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            shapes = f"{tuple(attention_mask.shape)} != {tuple(input_ids.shape)}"
            raise InvalidArgumentError(f"attention_mask shape != input_ids shape: {shapes}")
        starts, lengths = _spans(attention_mask)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)
        target = self.base if self.skip_lm_head else self.model
        kwargs = dict(attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        kwargs["output_hidden_states"] = False
        self._aux, self._final, self._seen, self._norm_calls = None, None, [], 0
        self._recording = True
        try:
            with torch.inference_mode():
                target(input_ids=input_ids, **kwargs)
        finally:
            self._recording = False
        aux, final, seen = self._aux, self._final, self._seen
        self._aux, self._final, self._seen = None, None, []
        if seen != list(self.aux_layer_ids) or self._norm_calls != 1 or aux is None or final is None:
            raise InvalidArgumentError(
                f"{type(self.model).__name__}: expected hooked layers {list(self.aux_layer_ids)} and the "
                f"final norm to run once each, saw layers {seen} and {self._norm_calls} norm call(s)"
            )
        return CapturedBatch(
            aux_hidden_states=aux,
            hidden_states=final,
            input_ids=input_ids,
            starts=starts,
            lengths=lengths,
            aux_layer_ids=self.aux_layer_ids,
        )
