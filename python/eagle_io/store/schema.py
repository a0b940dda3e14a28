"""Schemas: the named tensors every sample of a dataset holds (docs/FORMAT.md, "Schema")."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError

#: dtype names a schema may use (torch's names: ``torch.bfloat16`` -> ``"bfloat16"``).
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32")

#: dtype names the hidden states of the EAGLE-3 schema may be stored in.
STATE_DTYPES = ("bfloat16", "float16", "float32")

#: Lossy storage precisions a floating ``[L, width]`` tensor may declare (bfloat16 or float32 only).
PRECISIONS = ("float8_e4m3fn",)

#: Expected compression of the states (raw bf16 bytes / stored bytes) per storage precision (None: lossless), for
#: disk estimates; set a little below what benches/README.md measures on real states (lossless 1.465x, FP8 2.40x).
EXPECTED_RATIO = {None: 1.35, "float8_e4m3fn": 2.3}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of every sample: shape ``[L]`` when ``width`` is None, else ``[L, width]``,
    where ``L`` is the sample's token count."""

    name: str
    dtype: str
    width: int | None = None
    #: Lossy storage: ``"float8_e4m3fn"`` (FP8 with f32 scales, docs/FORMAT.md "FP8 storage") or None (``dtype``,
    #: lossless). Readers dequantise back into ``dtype``.
    precision: str | None = None
    #: Channels per FP8 scale; None = one scale per token over the row (vLLM speculators' choice).
    scale_block: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidArgumentError(f"tensor {self.name!r}: dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.precision not in (None, *PRECISIONS):
            raise InvalidArgumentError(
                f"tensor {self.name!r}: precision {self.precision!r} is not None or one of {', '.join(PRECISIONS)}"
            )
        if self.scale_block is not None and (
            self.precision is None or type(self.scale_block) is not int or self.scale_block < 1
        ):
            raise InvalidArgumentError(
                f"tensor {self.name!r}: scale_block {self.scale_block!r} needs FP8 precision and an integer >= 1"
            )


def precision_name(precision: str | None) -> str | None:
    """The schema's name for a storage precision given as ``None``/``"bf16"`` (lossless) or ``"fp8"``/
    ``"float8_e4m3fn"`` (FP8 with one scale per token). Raises InvalidArgumentError for anything else."""
    if precision in (None, "bf16", "lossless"):
        return None
    if precision in ("fp8", *PRECISIONS):
        return PRECISIONS[0]
    raise InvalidArgumentError(f"precision must be 'bf16' (lossless) or 'fp8' (float8_e4m3fn), not {precision!r}")


def eagle3_schema(
    hidden_size: int, num_aux_layers: int = 3, dtype: str = "bfloat16", precision: str | None = None
) -> list[TensorSpec]:
    """The EAGLE-3 training schema.

    - ``input_ids [L]`` int64: the rendered conversation's token ids.
    - ``loss_mask [L]`` uint8: 1 on assistant tokens the draft is trained on, else 0.
    - ``aux_hidden_states [L, num_aux_layers * hidden_size]`` ``dtype``: the target's residual
      stream at the inputs of the aux layers, concatenated in ascending layer order.
    - ``hidden_states [L, hidden_size]`` ``dtype``: the target's final post-norm hidden state.

    ``precision="fp8"`` stores both state tensors as FP8 e4m3fn with one scale per token (lossy; read back as
    ``dtype``, docs/FORMAT.md 3.1); ``dtype`` must then be bfloat16 or float32.

    Raises:
        InvalidArgumentError: ``hidden_size`` or ``num_aux_layers`` below 1, or a ``dtype`` that is not one of
            :data:`STATE_DTYPES` (states stored as ``int8`` or ``bool`` were accepted and lost their values).
    """
    for name, value in (("hidden_size", hidden_size), ("num_aux_layers", num_aux_layers)):
        if type(value) is not int or value < 1:
            raise InvalidArgumentError(f"EAGLE-3 schema: {name} must be an integer >= 1, not {value!r}")
    if dtype not in STATE_DTYPES:
        raise InvalidArgumentError(
            f"EAGLE-3 schema: states are stored as one of {', '.join(STATE_DTYPES)}, not {dtype!r}"
        )
    return [
        TensorSpec("input_ids", "int64"),
        TensorSpec("loss_mask", "uint8"),
        TensorSpec("aux_hidden_states", dtype, num_aux_layers * hidden_size, precision_name(precision)),
        TensorSpec("hidden_states", dtype, hidden_size, precision_name(precision)),
    ]
