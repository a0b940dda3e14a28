"""vLLM speculators 0.9.0 and hs-connectors 0.9.0 as eagle-io's clients, both ways, with their own code (installed
with --no-deps, requirements/speculators.txt):

* a dataset `eagle-io generate` wrote (tiny HF target, aux ids [2, N//2, N-3, N]: N the final pre-norm boundary),
  exported with `export-speculators` (bf16 and `--precision fp8`), is read by speculators' ``ArrowDataset`` over
  hs-connectors' ``FileTransfer`` / ``FP8Transfer`` and batched by its ``CollateFn`` with ``shift_batch`` in its
  ``DataLoader``: every sample's aux states, pre-norm final state, tokens and loss mask as eagle-io stored them; its
  token counts and vocabulary mapping equal speculators' own ``save_token_frequency_distribution`` /
  ``build_vocab_mappings_from_distribution``;
* FP8 files written by hs-connectors' own ``FP8HiddenStatesConnector._write_tensors`` import into FP8 shards holding
  their bytes and scales, and re-export byte-identical; the imported dataset records its aux layer ids and trains with
  `eagle-io train-draft`.

TEST-ONLY STAND-IN: ``hs_connectors.fp8_hidden_states_connector`` subclasses vLLM's ``ExampleHiddenStatesConnector``
(vLLM is not installed here); an empty class stands in for that base class, so the module's own ``_write_tensors``
(quantise, ``save_file``) runs unchanged. Where the speculators trainer stops: nothing past its data path runs here
(its ``Trainer`` needs an accelerator and FSDP).
"""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
from helpers.tiny_model import FIXTURE, build_tiny_model_dir
from safetensors.torch import load_file

import eagle_io
from eagle_io.cli import main
from eagle_io.interop.speculators import PRE_NORM, quantize_like_speculators

pytest.importorskip("speculators", reason="speculators not installed (requirements/speculators.txt)")
pytest.importorskip("hs_connectors", reason="hs-connectors not installed (requirements/speculators.txt)")

LAYERS, HIDDEN = 8, 32
IDS = [2, 4, 5, 8]  # speculators' [2, N//2, N-3] and N, the final pre-norm boundary
MAX_LEN = 256


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """``(target dir, {precision: dataset dir})``: `eagle-io generate` on the ShareGPT fixture, bf16 and fp8."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("spec-client")
    target = build_tiny_model_dir(root / "tiny", hidden=HIDDEN, layers=LAYERS)
    out = {}
    for precision in ("bf16", "fp8"):
        out[precision] = root / f"ds-{precision}"
        argv = ["generate", "--model", str(target), "--dataset", str(FIXTURE), "--out", str(out[precision])]
        argv += ["--limit", "6", "--max-length", "96", "--aux-layer-ids", ",".join(map(str, IDS))]
        argv += ["--precision", precision, "--no-disk-check", "--skip-bad-records", "--threads", "1"]
        assert main(argv) in (0, 1)  # 1: a record skipped (counted), the others captured
    return target, out


def speculators_loader(data_path, transfer, batch=2):
    """speculators' data path as its trainer builds it (``speculators/train/cli.py``: ``ArrowDataset`` over the
    backend's transfer, ``CollateFn`` with eagle3's ``shift_batch``), in a plain DataLoader."""
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn

    ds = ArrowDataset(MAX_LEN, data_path, transfer=transfer, on_missing="raise")
    collate = CollateFn(MAX_LEN, HIDDEN, num_target_layers=3, preprocess=shift_batch)
    return ds, torch.utils.data.DataLoader(ds, batch_size=batch, collate_fn=collate)


def bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def test_a_generated_dataset_reaches_speculators_reader_and_collate(captured, tmp_path):
    from hs_connectors import FileTransfer

    _, dss = captured
    src = eagle_io.Dataset(dss["bf16"])
    assert src.metadata["final_state_is_prenorm"] is True and len(src) >= 4
    out = tmp_path / "spec"
    assert main(["export-speculators", str(dss["bf16"]), "--out", str(out), "--draft-vocab-size", "64"]) == 0
    ds, loader = speculators_loader(out, FileTransfer(out / "hidden_states"))
    assert len(ds) == len(src)
    for pos in range(len(src)):
        item, theirs = src[pos], ds[pos]
        assert torch.equal(bits(theirs["hidden_states"]), bits(item["aux_hidden_states"][:, : 3 * HIDDEN]))
        assert torch.equal(
            bits(theirs["verifier_last_hidden_states"]), bits(item["aux_hidden_states"][:, 3 * HIDDEN :])
        )
        assert torch.equal(theirs["input_ids"], item["input_ids"])
        assert torch.equal(theirs["loss_mask"], item["loss_mask"].to(torch.int64))
    batches = list(loader)
    lengths = src.lengths()
    assert len(batches) == -(-len(src) // 2)
    first = batches[0]
    assert first["hidden_states"].shape == (1, MAX_LEN, 3 * HIDDEN) and first["hidden_states"].dtype == torch.bfloat16
    n = lengths[0] - 1  # shift_batch drops one token per sample
    assert torch.equal(bits(first["hidden_states"][0, :n]), bits(src[0]["aux_hidden_states"][:-1, : 3 * HIDDEN]))
    assert torch.equal(first["input_ids"][0, :n], src[0]["input_ids"][1:])
    assert int((first["document_ids"] >= 0).sum()) == min(MAX_LEN, lengths[0] + lengths[1] - 2)
    assert json.loads((out / "eagle_io_export.json").read_text())["target_layer_ids"] == IDS[:3]


def test_the_vocabulary_files_are_speculators_own(captured, tmp_path):
    import numpy as np
    from datasets import load_from_disk
    from speculators.train.vocab_mapping import (
        build_vocab_mappings_from_distribution,
        save_token_frequency_distribution,
    )

    _, dss = captured
    out = tmp_path / "spec"
    main(["export-speculators", str(dss["bf16"]), "--out", str(out), "--draft-vocab-size", "64"])
    save_token_frequency_distribution(load_from_disk(str(out)), tmp_path / "theirs.pt")
    theirs = torch.load(tmp_path / "theirs.pt", weights_only=True)
    ours = torch.load(out / "token_freq.pt", weights_only=True)
    assert ours == theirs and len(ours) > 20
    vocab = eagle_io.Dataset(dss["bf16"]).metadata["vocab_size"]
    d2t, t2d = build_vocab_mappings_from_distribution(theirs, 64, vocab)
    assert torch.equal(torch.from_numpy(np.load(out / "d2t-64.npy")), d2t)
    assert torch.equal(torch.from_numpy(np.load(out / "t2d-64.npy")), t2d)


def test_fp8_exports_in_hs_connectors_layout(captured, tmp_path):
    from hs_connectors import FP8Transfer
    from hs_connectors.fp8_utils import dequantize_fp8_tensor, quantize_tensor_to_fp8

    _, dss = captured
    # From bf16 states: the file hs-connectors' quantiser makes of the same planes.
    out = tmp_path / "from-bf16"
    assert main(["export-speculators", str(dss["bf16"]), "--out", str(out), "--precision", "fp8"]) == 0
    src = eagle_io.Dataset(dss["bf16"])
    for pos in range(len(src)):
        planes = src[pos]["aux_hidden_states"].reshape(-1, 4, HIDDEN)
        q, s = quantize_tensor_to_fp8(planes)
        mine = quantize_like_speculators(planes)
        assert torch.equal(mine[0].view(torch.uint8), q.view(torch.uint8)) and torch.equal(mine[1], s)
        got = load_file(str(out / "hidden_states" / f"hs_{pos}.safetensors"))
        assert torch.equal(got["hidden_states"].view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(got["hidden_states_scales"], s)
    # From FP8 states (one scale per token over the 4 planes: hs-connectors' layout): the stored bytes, as stored.
    out = tmp_path / "from-fp8"
    assert main(["export-speculators", str(dss["fp8"]), "--out", str(out), "--precision", "fp8"]) == 0
    raw = eagle_io.Dataset(dss["fp8"], dequantize=False)
    ds, loader = speculators_loader(out, FP8Transfer(out / "hidden_states"))
    for pos in range(len(raw)):
        item = raw[pos]
        want = dequantize_fp8_tensor(
            item["aux_hidden_states"].reshape(-1, 4, HIDDEN), item["aux_hidden_states_scales"][:, :, None]
        )
        theirs = ds[pos]
        assert theirs["hidden_states"].dtype == torch.bfloat16
        assert torch.equal(bits(theirs["hidden_states"]), bits(want[:, :3].flatten(1)))
        assert torch.equal(bits(theirs["verifier_last_hidden_states"]), bits(want[:, 3]))
        assert torch.equal(theirs["loss_mask"], item["loss_mask"].to(torch.int64))
    assert sum(int(b["document_ids"].max()) + 1 for b in loader) == len(raw)  # every sample batched


def test_export_of_a_capture_without_the_pre_norm_state_names_the_option(small_dataset, tmp_path, capsys):
    root, _ = small_dataset
    assert main(["export-speculators", str(root), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--aux-layer-ids" in err and "import-speculators" in err


def _write_with_hs_connectors(path, hidden_states, token_ids):
    """``FP8HiddenStatesConnector._write_tensors`` itself (module docstring: vLLM's base class stood in for)."""
    name = "vllm.distributed.kv_transfer.kv_connector.v1"
    stubs, parts = {}, name.split(".")
    for i in range(len(parts)):
        mod = ".".join(parts[: i + 1])
        if mod not in sys.modules:
            stubs[mod] = sys.modules[mod] = types.ModuleType(mod)
    if "example_hidden_states_connector" not in vars(sys.modules[name]):
        base = types.ModuleType(name + ".example_hidden_states_connector")
        base.ExampleHiddenStatesConnector = type("ExampleHiddenStatesConnector", (), {})  # TEST-ONLY STAND-IN
        sys.modules[name].example_hidden_states_connector = base
    try:
        from hs_connectors.fp8_hidden_states_connector import FP8HiddenStatesConnector

        event = types.SimpleNamespace(synchronize=lambda: None)
        tensors = {"hidden_states": hidden_states, "token_ids": token_ids}
        FP8HiddenStatesConnector._write_tensors(tensors, event, str(path), None)
    finally:
        for mod in stubs:
            del sys.modules[mod]
        sys.modules.pop("hs_connectors.fp8_hidden_states_connector", None)


def test_hs_connectors_fp8_files_import_bit_exact_and_train(captured, tmp_path):
    target, dss = captured
    spec = tmp_path / "spec"
    main(["export-speculators", str(dss["bf16"]), "--out", str(spec)])  # the preprocessed dataset and bf16 states
    fp8_dir = tmp_path / "fp8-hs"
    fp8_dir.mkdir()
    for f in sorted((spec / "hidden_states").iterdir()):
        raw = load_file(str(f))
        _write_with_hs_connectors(fp8_dir / f.name, raw["hidden_states"], raw["token_ids"])
    args = ["import-speculators", str(fp8_dir), "--out", str(tmp_path / "imp"), "--preprocessed", str(spec)]
    assert main([*args, "--target", str(target), "--aux-layer-ids", "2,4,5", "--threads", "1"]) == 0
    ds = eagle_io.Dataset(tmp_path / "imp")
    assert ds.metadata["aux_layer_ids"] == [2, 4, 5] and ds.metadata["num_layers"] == LAYERS
    assert {s.name: s.precision for s in ds.schema}[PRE_NORM] == "float8_e4m3fn"
    raw = eagle_io.Dataset(tmp_path / "imp", dequantize=False)
    first = load_file(str(fp8_dir / "hs_0.safetensors"))
    assert torch.equal(raw[0][PRE_NORM].view(torch.uint8), first["hidden_states"][:, 3].view(torch.uint8))
    assert torch.equal(raw[0]["aux_hidden_states_scales"], first["hidden_states_scales"][:, :, 0])
    back = tmp_path / "back"
    assert main(["export-speculators", str(tmp_path / "imp"), "--out", str(back), "--precision", "fp8"]) == 0
    for f in sorted(fp8_dir.iterdir()):
        assert (back / "hidden_states" / f.name).read_bytes() == f.read_bytes(), f.name
    # The imported dataset trains (aux ids recorded; post-norm states from the target's norm).
    argv = ["train-draft", str(tmp_path / "imp"), "--target-model", str(target), "--out", str(tmp_path / "draft")]
    assert main([*argv, "--steps", "2", "--batch-size", "2", "--draft-vocab-size", "64", "--threads", "1"]) == 0
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 64 and len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) == 3
