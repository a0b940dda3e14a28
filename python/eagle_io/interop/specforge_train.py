"""``specforge train`` on an eagle-io dataset, with no export: ``eagle-io specforge-train --config cfg.yaml``.

SpecForge 0.2.0's offline trainer (``specforge train``, ``specforge/cli.py``) finds its samples by listing
``.ckpt[.gz]`` files (``OfflineManifestReader`` / ``list_feature_files`` in ``specforge/runtime/data_plane/``) and
reads each through ``LocalFeatureStore.get``, which serves ``file://`` refs from those files and sends every other
ref to its in-memory table. It has no plugin registry for readers or stores. This module plugs eagle-io in at the
two places SpecForge itself chooses them, for the length of one call of SpecForge's own CLI:

* **the reader**: the ``eagle3`` algorithm's offline provider (``AlgorithmProviders.offline``, the registration
  ``resolve_run`` looks up in ``builtin_algorithm_registry``) gets a ``build_reader`` that, for a
  ``data.hidden_states_path`` (or ``data.eval_hidden_states_path``) holding an eagle-io dataset, emits SpecForge's
  own refs (``OfflineManifestReader._ref_for``: the same ``sample_id``, keys and metadata) with the URI
  ``eagleio://<manifest>#<position>``; any other path gets SpecForge's reader unchanged. The refs come in the order
  SpecForge lists the files ``export-specforge`` writes for the same dataset (by path string), so both runs see the
  same samples in the same batches.
* **the store**: ``specforge.launch.LocalFeatureStore`` (what ``build_offline_runtime`` and its eval data factory
  construct) becomes :class:`EagleIoFeatureStore`, a subclass that reads ``eagleio://`` refs from the shards and
  returns exactly the dict ``load_feature_file`` returns for the exported ``.ckpt`` (:func:`to_specforge_record`:
  ``input_ids [L]`` int64, ``loss_mask [L]`` int64, ``aux_hidden_state [1, L, k*H]``, ``hidden_state [1, L, H]``;
  FP8 states dequantised by eagle-io's reader, as export writes them). Its ``get`` (device move, clone, lease) is
  SpecForge's.

Everything after that (``normalize_offline_sample``, ``DataCollatorWithPadding``, ``FeatureDataLoader``, the
sampler, the FSDP trainer) is SpecForge's code, unchanged. Checked against SpecForge 0.2.0 only
(``requirements/embedded.txt``); :func:`specforge_seams` refuses a SpecForge without these seams.

Not served: ``deployment.mode: disaggregated`` (its feature stores are chosen by ``DISAGG_BACKEND``), SpecForge's
own multi-rank self-launch (its children run ``python -m specforge.cli``: run this module under ``torchrun``
instead), and SpecForge deriving a vocabulary mapping from the data (it lists ``.ckpt`` files for that): pass
``model.vocab_mapping_path`` from ``eagle-io vocab-map``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..errors import IncompatibleDatasetError, InvalidArgumentError, MissingDataPackageError
from ..store import layout
from .specforge import specforge_path, to_specforge_record

try:
    from specforge.runtime.data_plane.feature_store import LocalFeatureStore
except ImportError as e:  # SpecForge is optional for eagle-io; this module is its launcher
    raise MissingDataPackageError(
        "specforge==0.2.0 --no-deps", "eagle-io specforge-train runs SpecForge's own trainer, which is not installed"
    ) from e

__all__ = [
    "SCHEME",
    "EagleIoFeatureStore",
    "eagle_io_refs",
    "eagle_io_registry",
    "is_eagle_io_dataset",
    "main",
    "read_ref",
    "specforge_seams",
]

#: URI scheme of the refs this module mints: ``eagleio://<manifest path or URL>#<dataset position>``.
SCHEME = "eagleio://"
#: The SpecForge release whose seams this module was written against and tested with.
SPECFORGE_VERSION = "0.2.0"

_open: dict[str, Any] = {}
_open_lock = threading.Lock()


def is_eagle_io_dataset(path: str) -> bool:
    """Whether ``path`` names an eagle-io dataset (a manifest, a root holding one, or an object-storage URL)
    rather than a directory of SpecForge ``.ckpt`` files."""
    return bool(path) and (layout.is_url(path) or bool(layout.dataset_manifests(path)))


def _dataset(manifest: str) -> Any:
    """One :class:`eagle_io.Dataset` per manifest and process, shared by SpecForge's loader threads."""
    from ..store.reader import Dataset

    with _open_lock:
        ds = _open.get(manifest)
        if ds is None:
            ds = _open[manifest] = Dataset(manifest)
        return ds


def _manifest(path: str) -> str:
    m = layout.manifest_file(path)
    return m if layout.is_url(m) else os.path.abspath(m)


def read_ref(uri: str) -> dict[str, torch.Tensor]:
    """The record an ``eagleio://<manifest>#<position>`` URI names, as SpecForge's ``load_feature_file`` returns
    the exported ``.ckpt`` of that sample (:func:`eagle_io.interop.specforge.to_specforge_record`).

    Raises:
        InvalidArgumentError: not an ``eagleio://`` URI with an integer position in range (names the URI).
        CorruptRecordError, StorageError: the record cannot be read (eagle-io's reader names shard and offset).
    """
    body = uri[len(SCHEME) :] if uri.startswith(SCHEME) else ""
    manifest, sep, pos = body.rpartition("#")
    if not sep or not manifest or not pos.isdigit():
        raise InvalidArgumentError(f"{uri!r} is not an {SCHEME}<manifest>#<position> feature reference")
    ds = _dataset(manifest)
    if int(pos) >= len(ds):
        raise InvalidArgumentError(f"{uri}: position {pos} is past the dataset's {len(ds)} samples ({manifest})")
    return to_specforge_record(ds[int(pos)])


def eagle_io_refs(path: str, reader: Any) -> list[Any]:
    """SpecForge refs for every sample of the eagle-io dataset at ``path``.

    Args:
        path: the dataset (``data.hidden_states_path``).
        reader: SpecForge's ``OfflineManifestReader`` as its ``build_offline_reader`` configured it for ``path``
            (run id, strategy, ``ttt_length``, ``max_len``, target representation).

    Returns:
        ``[SampleRef]``: ref ``i`` is ``reader._ref_for(i, ...)`` with ``feature_store_uri``
        ``eagleio://<manifest>#<position>``, for the ``i``-th sample in the order SpecForge lists the files
        ``export-specforge`` writes for this dataset (``rows_{g}-{g+2000}/data_{sample_id}.ckpt``, sorted as strings).

    Raises:
        IncompatibleDatasetError: the dataset lacks an EAGLE-3 tensor or contradicts its metadata; it is empty.
    """
    from ..store.eagle3 import check_eagle3_dataset

    manifest = _manifest(path)
    ds = _dataset(manifest)
    check_eagle3_dataset(ds, "specforge-train")
    if len(ds) == 0:
        raise IncompatibleDatasetError(f"{manifest}: the dataset holds no sample for specforge train")
    order = sorted(range(len(ds)), key=lambda pos: specforge_path("", ds.entry(pos).sample_id))
    refs = []
    for index, pos in enumerate(order):
        uri = f"{SCHEME}{manifest}#{pos}"
        refs.append(dataclasses.replace(reader._ref_for(index, uri), feature_store_uri=uri))
    return refs


class _EagleIoReader:
    """SpecForge's reader interface (``read``, iteration) over :func:`eagle_io_refs`."""

    def __init__(self, path: str, reader: Any) -> None:
        self._refs = eagle_io_refs(path, reader)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._refs)

    def read(self, limit: int | None = None) -> list[Any]:
        return list(self._refs if limit is None else self._refs[:limit])


def _reader_factory(specforge_factory: Callable[..., Any]) -> Callable[..., Any]:
    """A ``build_reader`` that serves eagle-io datasets and hands any other path to SpecForge's own factory."""

    def build_reader(hidden_states_path: str, **kwargs: Any) -> Any:
        reader = specforge_factory(hidden_states_path, **kwargs)
        return _EagleIoReader(hidden_states_path, reader) if is_eagle_io_dataset(hidden_states_path) else reader

    return build_reader


def eagle_io_registry(registry: Any) -> Any:
    """``registry`` (a SpecForge ``AlgorithmRegistry``) with the ``eagle3`` algorithm's offline readers wrapped by
    :func:`_reader_factory`; every other registration and provider is SpecForge's own object."""
    from specforge.algorithms.registry import AlgorithmRegistration, AlgorithmRegistry

    regs = []
    for reg in registry:
        if reg.name == "eagle3":
            offline = tuple(
                dataclasses.replace(p, build_reader=_reader_factory(p.build_reader)) for p in reg.providers.offline
            )
            reg = AlgorithmRegistration(spec=reg.spec, providers=dataclasses.replace(reg.providers, offline=offline))
        regs.append(reg)
    return AlgorithmRegistry(regs)


class EagleIoFeatureStore(LocalFeatureStore):
    """SpecForge's ``LocalFeatureStore`` serving ``eagleio://`` refs from eagle-io shards as well.

    ``LocalFeatureStore.get`` reads ``file://`` refs from their files and sends every other ref to
    ``_get_from_mem``, then moves, clones and, on failure, releases as usual; here an ``eagleio://`` ref is read
    with :func:`read_ref` (one record, checksummed) and leased like a file (releasing it frees nothing: the shards
    stay). Other refs are SpecForge's.

    Raises (from ``get``):
        IncompatibleDatasetError: the ref asks for a key the exported record would not hold (names both).
        InvalidArgumentError, CorruptRecordError, StorageError: from :func:`read_ref`.
    """

    def _get_from_mem(self, ref: Any, wanted: list[str]) -> tuple[dict[str, torch.Tensor], Any]:
        if not ref.feature_store_uri.startswith(SCHEME):
            return super()._get_from_mem(ref, wanted)
        raw = read_ref(ref.feature_store_uri)
        out = {}
        for name in wanted:
            key = ref.feature_keys.get(name, name)
            if key not in raw:
                raise IncompatibleDatasetError(
                    f"{ref.feature_store_uri}: SpecForge asks for key {key!r} (feature {name!r}); an exported record "
                    f"holds {sorted(raw)}"
                )
            out[name] = raw[key]
        return out, self._register_file_lease(ref)


@contextlib.contextmanager
def specforge_seams() -> Iterator[None]:
    """While inside, SpecForge resolves the ``eagle3`` algorithm with eagle-io's reader
    (``specforge.algorithms.builtin.builtin_algorithm_registry`` returns :func:`eagle_io_registry` of its catalog)
    and builds its offline stores as :class:`EagleIoFeatureStore` (``specforge.launch.LocalFeatureStore``); both
    are restored on exit.

    Raises:
        InvalidArgumentError: the installed SpecForge lacks one of these seams (it names them and the version
            this module was tested with, :data:`SPECFORGE_VERSION`).
    """
    import specforge.algorithms.builtin as builtin
    import specforge.launch as launch
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader

    seams = (
        (builtin, "builtin_algorithm_registry"),
        (launch, "LocalFeatureStore"),
        (LocalFeatureStore, "_get_from_mem"),
        (LocalFeatureStore, "_register_file_lease"),
        (OfflineManifestReader, "_ref_for"),
    )
    missing = [f"{getattr(o, '__name__', o)}.{name}" for o, name in seams if not hasattr(o, name)]
    if missing:
        raise InvalidArgumentError(
            f"the installed SpecForge has no {', '.join(missing)}: eagle-io specforge-train plugs into SpecForge "
            f"{SPECFORGE_VERSION}'s (pip install --no-deps specforge=={SPECFORGE_VERSION})"
        )
    saved = builtin.builtin_algorithm_registry, launch.LocalFeatureStore
    catalog = saved[0]
    builtin.builtin_algorithm_registry = lambda: eagle_io_registry(catalog())
    launch.LocalFeatureStore = EagleIoFeatureStore
    try:
        yield
    finally:
        builtin.builtin_algorithm_registry, launch.LocalFeatureStore = saved


def check_config(cfg: Any, env: Any = os.environ) -> None:
    """Refuses, before SpecForge starts, a config naming an eagle-io dataset that this launcher cannot serve.

    Args:
        cfg: SpecForge's ``Config`` (``specforge.config.load_config``).
        env: the process environment (an existing ``torchrun`` worker has ``WORLD_SIZE``).

    Raises:
        InvalidArgumentError: naming the setting: ``deployment.mode: disaggregated``; more than one trainer process
            outside ``torchrun`` (SpecForge would start ``python -m specforge.cli`` children, which know no eagle-io
            reader); no ``model.vocab_mapping_path`` (SpecForge derives one by listing ``.ckpt`` files).
    """
    paths = [p for p in (cfg.data.hidden_states_path, cfg.data.eval_hidden_states_path) if is_eagle_io_dataset(p)]
    if not paths:
        return
    where = f"data.hidden_states_path / eval_hidden_states_path {paths} (an eagle-io dataset)"
    if cfg.deployment.mode == "disaggregated":
        raise InvalidArgumentError(
            f"{where}: eagle-io specforge-train serves SpecForge's colocated offline trainer, not "
            f"deployment.mode={cfg.deployment.mode!r}"
        )
    topo = cfg.deployment.trainer
    ranks = topo.nnodes * topo.nproc_per_node
    if ranks > 1 and "WORLD_SIZE" not in env:
        raise InvalidArgumentError(
            f"{where}: {ranks} trainer processes: start them with torchrun so each runs eagle-io's reader, e.g. "
            f"`torchrun --standalone --nproc_per_node {topo.nproc_per_node} -m eagle_io.interop.specforge_train "
            "--config CFG`"
        )
    if not cfg.model.vocab_mapping_path:
        raise InvalidArgumentError(
            f"{where}: set model.vocab_mapping_path: SpecForge derives a mapping by listing .ckpt files, which an "
            "eagle-io dataset has none of; write eagle-io's with `eagle-io vocab-map DATASET --draft-vocab-size V "
            "--out VOCAB.pt` (V: the draft's draft_vocab_size)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``eagle-io specforge-train ARGS`` / ``python -m eagle_io.interop.specforge_train ARGS``: SpecForge's own
    ``specforge train ARGS`` (``specforge.cli.main(["train", *ARGS])``: ``--config``, ``--role``, ``--plan``,
    dotted overrides) inside :func:`specforge_seams`, after :func:`check_config`. Returns SpecForge's exit code.

    Raises:
        InvalidArgumentError: from :func:`check_config` or :func:`specforge_seams`.
    """
    from specforge.cli import main as specforge_main
    from specforge.config import load_config

    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-c", "--config")
    known, rest = parser.parse_known_args(args)
    if known.config:  # SpecForge's parser reports a missing --config itself
        overrides = [a for a in rest if "=" in a and not a.startswith("-")]
        check_config(load_config(known.config, overrides))
    with specforge_seams():
        return specforge_main(["train", *args])


if __name__ == "__main__":
    sys.exit(main())
