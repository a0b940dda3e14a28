"""Every consumer of EAGLE-3 training data refuses a dataset of another schema with one IncompatibleDatasetError
naming its manifest (export-specforge, the vocabulary mapping and train-draft ended in KeyError tracebacks), and
train-draft refuses missing metadata before loading the target or training."""

from __future__ import annotations

import pytest
import torch

import eagle_io
from eagle_io.cli import main
from eagle_io.draft import build_draft
from eagle_io.errors import IncompatibleDatasetError
from eagle_io.feed import ShardDataset
from eagle_io.interop.specforge import export_specforge
from eagle_io.interop.vocab import build_vocab_mapping


@pytest.fixture()
def other_schema(tmp_path):
    """A valid dataset whose schema is not EAGLE-3's: token ids and one bf16 tensor ``x``."""
    root = tmp_path / "other"
    schema = [eagle_io.TensorSpec("input_ids", "int64"), eagle_io.TensorSpec("x", "bfloat16", 8)]
    with eagle_io.ShardWriter(root, schema, {}, threads=1) as w:
        w.write(0, {"input_ids": torch.arange(4), "x": torch.zeros(4, 8, dtype=torch.bfloat16)})
    return root


def test_every_consumer_names_the_missing_tensor(other_schema, tmp_path):
    manifest = str(other_schema / "manifest.json")
    for call, user in (
        (lambda: ShardDataset(other_schema), "ShardDataset"),
        (lambda: export_specforge(other_schema, tmp_path / "sf"), "export-specforge"),
        (lambda: build_vocab_mapping(other_schema, 8, target_vocab_size=16), "a draft vocabulary mapping"),
    ):
        with pytest.raises(IncompatibleDatasetError, match="schema has no tensor 'loss_mask'") as e:
            call()
        assert manifest in str(e.value) and f"{user} needs" in str(e.value)
    assert not (tmp_path / "sf").exists() or not any((tmp_path / "sf").iterdir())


@pytest.mark.parametrize("command", ["export-specforge", "train-draft"])
def test_cli_exits_2_with_the_manifest(other_schema, tmp_path, capsys, command):
    extra = ["--target-model", str(tmp_path / "no-such-model")] if command == "train-draft" else []
    assert main([command, str(other_schema), "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err
    assert "IncompatibleDatasetError" in err and "schema has no tensor 'loss_mask'" in err and "Traceback" not in err


def test_train_draft_refuses_missing_aux_ids_before_loading_the_target(tmp_path, capsys):
    root = tmp_path / "no-ids"
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(8), {"hidden_size": 8}, threads=1) as w:
        w.write(0, {
            "input_ids": torch.arange(4), "loss_mask": torch.ones(4, dtype=torch.uint8),
            "aux_hidden_states": torch.zeros(4, 24, dtype=torch.bfloat16),
            "hidden_states": torch.zeros(4, 8, dtype=torch.bfloat16),
        })  # fmt: skip
    # The target path does not exist: reaching the model load would fail with another error.
    assert main(["train-draft", str(root), "--out", str(tmp_path / "out"), "--target-model", "/no/such"]) == 2
    assert "has no aux_layer_ids" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_build_draft_names_missing_hidden_size():
    head = type("Head", (), {})()
    head.config = {"hidden_size": 8, "vocab_size": 16}
    with pytest.raises(IncompatibleDatasetError, match="no integer hidden_size"):
        build_draft(head, {"aux_layer_ids": [1, 2, 3]}, 8)
