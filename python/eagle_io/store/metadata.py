"""The dataset metadata every consumer of EAGLE-3 shards needs (docs/FORMAT.md, section 2.1)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from .._native import __version__
from ..errors import InvalidArgumentError
from .eagle3 import AUX_LAYER_CONVENTION


def eagle3_metadata(
    *,
    target_info: Mapping[str, Any],
    aux_layer_ids: Sequence[int],
    dtype: str,
    tokenizer_identity: Mapping[str, Any] | None,
    max_length: int | None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Builds the manifest metadata of a capture.

    Args:
        target_info: ``load_target``'s info (``model_id``, ``files``, ``architecture``, ``num_layers``,
            ``hidden_size``, ``vocab_size``); machine-specific paths are left out so a run resumes elsewhere.
        aux_layer_ids: captured layers in eagle-io's convention
            (:data:`eagle_io.store.eagle3.AUX_LAYER_CONVENTION`). The last may be ``num_layers``: the final
            pre-norm boundary; ``final_state_is_prenorm`` (always written) is then ``True``, so a consumer knows the
            last ``H`` columns of ``aux_hidden_states`` are the un-normalised final state (gpt-oss drafts feed it
            through ``norm_before_fc``), while ``hidden_states`` stays post-norm.
        dtype: stored dtype of the states (e.g. ``"bfloat16"``).
        tokenizer_identity: :func:`eagle_io.data.chat_template_identity` of the tokenizer, if any.
        max_length: truncation length of the samples.
        extra: caller keys merged last.

    Raises:
        InvalidArgumentError: ``target_info`` lacks ``num_layers``, ``hidden_size`` or ``vocab_size``, or one of them
            is not a positive integer.
    """
    for name in ("num_layers", "hidden_size", "vocab_size"):
        value = target_info.get(name) if isinstance(target_info, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            what = "lacks it" if value is None else f"holds {value!r}"
            raise InvalidArgumentError(f"target_info[{name!r}] must be a positive integer; it {what}")
    meta: dict[str, Any] = {
        "target_model": {k: target_info[k] for k in ("model_id", "files", "architecture") if k in target_info},
        "num_layers": int(target_info["num_layers"]),
        "hidden_size": int(target_info["hidden_size"]),
        "vocab_size": int(target_info["vocab_size"]),
        "aux_layer_ids": [int(i) for i in aux_layer_ids],
        "aux_layer_convention": AUX_LAYER_CONVENTION,
        "hidden_states_post_norm": True,
        "final_state_is_prenorm": bool(aux_layer_ids) and int(aux_layer_ids[-1]) == int(target_info["num_layers"]),
        "dtype": dtype,
        "tokenizer": dict(tokenizer_identity) if tokenizer_identity else None,
        "max_length": max_length,
        "eagle_io_format_writer": f"eagle-io {__version__}",
    }
    meta.update(extra or {})
    return meta
