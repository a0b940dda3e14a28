"""The one check that a dataset holds what EAGLE-3 training reads (the schema of :func:`eagle_io.eagle3_schema`).

``ShardDataset``, ``export-specforge``, the vocabulary mapping and ``train-draft`` all call it, so a dataset
written with another schema fails with the same :class:`~eagle_io.errors.IncompatibleDatasetError` naming its
manifest, instead of a ``KeyError`` deep in a loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import IncompatibleDatasetError
from .reader import Dataset

#: The schema tensors an EAGLE-3 training item needs.
REQUIRED_TENSORS = ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states")


def require_tensors(ds: Dataset, names: Sequence[str], user: str) -> None:
    """Raises :class:`IncompatibleDatasetError` naming ``ds``'s manifest when its schema lacks one of ``names``."""
    have = [s.name for s in ds.schema]
    for name in names:
        if name not in have:
            raise IncompatibleDatasetError(
                f"{ds.manifest_path}: schema has no tensor {name!r} (has {sorted(have)}); {user} needs {list(names)}"
            )


def check_eagle3_dataset(ds: Dataset, user: str) -> None:
    """The dataset holds the EAGLE-3 tensors, and its metadata agrees with its own schema widths and dtype.

    Raises:
        IncompatibleDatasetError: a tensor of :data:`REQUIRED_TENSORS` is missing, or metadata ``hidden_size``,
            ``aux_layer_ids`` or ``dtype`` contradicts the schema (names the manifest and both values).
    """
    require_tensors(ds, REQUIRED_TENSORS, user)
    specs = {s.name: s for s in ds.schema}
    meta = ds.metadata
    hidden, aux = specs["hidden_states"], specs["aux_hidden_states"]
    if "hidden_size" in meta and hidden.width != meta["hidden_size"]:
        raise IncompatibleDatasetError(
            f"{ds.manifest_path}: metadata hidden_size={meta['hidden_size']} but the schema's hidden_states "
            f"width is {hidden.width}"
        )
    if "hidden_size" in meta and "aux_layer_ids" in meta:
        want = len(meta["aux_layer_ids"]) * meta["hidden_size"]
        if aux.width != want:
            raise IncompatibleDatasetError(
                f"{ds.manifest_path}: metadata aux_layer_ids={meta['aux_layer_ids']} x hidden_size="
                f"{meta['hidden_size']} = {want} but the schema's aux_hidden_states width is {aux.width}"
            )
    if "dtype" in meta and meta["dtype"] not in (hidden.dtype, aux.dtype):
        raise IncompatibleDatasetError(
            f"{ds.manifest_path}: metadata dtype={meta['dtype']!r} but the schema stores "
            f"hidden_states as {hidden.dtype} and aux_hidden_states as {aux.dtype}"
        )
