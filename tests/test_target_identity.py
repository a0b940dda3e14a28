"""One target identity (issue 34, kind 3): where a target meets a dataset, every fact the dataset records of its
target is compared (architecture, layers, width, vocabulary, the files' sha256), each difference named, and
--allow-other-target passes only the files (the same weights re-saved), never the shape."""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers.tiny_model import FIXTURE, build_tiny_model_dir

from eagle_io.cli import main
from eagle_io.errors import IncompatibleDatasetError
from eagle_io.store.target_identity import dataset_target, require_same_target, target_differences


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """(dataset captured from an 8-layer tiny target, that target's directory, the root for variants)."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ident")
    target = build_tiny_model_dir(root / "a" / "tiny", layers=8)
    ds = root / "ds"
    argv = ["generate", "--model", str(target), "--dataset", str(FIXTURE), "--out", str(ds), "--limit", "10"]
    assert main([*argv, "--max-length", "64", "--no-disk-check", "--skip-bad-records", "--threads", "1"]) == 0
    return ds, target, root


def _other_weights(target, out):
    """The same directory name, config and shapes, one weight changed."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(target, out)
    state = load_file(out / "model.safetensors")
    name = next(k for k in state if k.endswith("mlp.down_proj.weight"))
    state[name] = state[name] + 0.01
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _train(ds, target, out, *more):
    return main(
        ["train-draft", str(ds), "--out", str(out), "--target-model", str(target), "--steps", "1", "--threads", "1",
         "--draft-vocab-size", "64", "--eval-samples", "1", "--max-length", "64", *more]
    )  # fmt: skip


def test_train_draft_refuses_a_target_of_another_depth_naming_it_before_writing(captured, capsys):
    ds, _, root = captured
    deeper = build_tiny_model_dir(root / "b" / "tiny", layers=9)  # same width and vocabulary, 9 layers
    capsys.readouterr()
    out = root / "out-deeper"
    assert _train(ds, deeper, out) == 2
    err = capsys.readouterr().err
    assert "IncompatibleDatasetError" in err and "num_layers 8 recorded, 9 here" in err
    assert "--allow-other-target" not in err.split(": pass")[-1], "a shape difference is never passed"
    assert not out.exists(), "nothing written"
    assert _train(ds, deeper, out, "--allow-other-target") == 2


def test_train_draft_refuses_other_weights_of_the_same_shape_unless_allowed(captured, capsys):
    ds, target, root = captured
    other = _other_weights(target, root / "c" / "tiny")
    capsys.readouterr()
    assert _train(ds, other, root / "out-other") == 2
    err = capsys.readouterr().err
    assert "the files' sha256 differ: model.safetensors" in err and "--allow-other-target" in err
    assert _train(ds, other, root / "out-allowed", "--allow-other-target") == 0
    assert _train(ds, target, root / "out-same") == 0


def test_the_comparison_names_each_difference():
    rec = {"model_id": "m", "architecture": "LlamaForCausalLM", "num_layers": 10, "hidden_size": 64,
           "vocab_size": 100, "files": [{"name": "w", "size": 1, "sha256": "aa" * 32}]}  # fmt: skip
    same = dict(rec, model_id="renamed")
    assert target_differences(rec, same) == [], "same files: a new name is no difference"
    other = dict(rec, num_layers=8, vocab_size=101, files=[{"name": "w", "size": 1, "sha256": "bb" * 32}])
    diffs = target_differences(rec, other)
    assert diffs[:2] == ["num_layers 10 recorded, 8 here", "vocab_size 100 recorded, 101 here"]
    assert "sha256 differ" in diffs[2]
    assert target_differences(rec, other, allow_other_target=True) == diffs[:2]
    unhashed = dict(rec, files=[{"name": "w", "size": 1, "sha256": None}])
    assert target_differences(rec, unhashed) == [], "a fact one side lacks is not compared"
    with pytest.raises(IncompatibleDatasetError, match="is not the target ds was captured from: num_layers"):
        require_same_target(rec, other, where="ds", option="--target", allow_other_target=False)
    meta = {"target_model": {"model_id": "m", "architecture": "A"}, "num_layers": 3, "hidden_size": 8}
    assert dataset_target(meta) == {"model_id": "m", "architecture": "A", "num_layers": 3, "hidden_size": 8}


def test_check_serving_compares_the_same_record_of_the_datasets_target(tmp_path):
    from test_serving_preflight import H, N, V, eagle3_draft, llama_target

    import eagle_io
    from eagle_io.serving import check_serving
    from eagle_io.store.metadata import eagle3_metadata

    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    for name, info in (("ok", {"architecture": "LlamaForCausalLM"}), ("qwen", {"architecture": "Qwen2ForCausalLM"})):
        meta = eagle3_metadata(
            target_info={"num_layers": N, "hidden_size": H, "vocab_size": V, **info},
            aux_layer_ids=[2, 4, 5],
            dtype="bfloat16",
            tokenizer_identity=None,
            max_length=None,
        )
        with eagle_io.ShardWriter(tmp_path / name, eagle_io.eagle3_schema(H), meta) as w:
            w.write(0, {"input_ids": torch.arange(3), "loss_mask": torch.ones(3, dtype=torch.uint8),
                        "aux_hidden_states": torch.zeros(3, 3 * H, dtype=torch.bfloat16),
                        "hidden_states": torch.zeros(3, H, dtype=torch.bfloat16)})  # fmt: skip
    assert check_serving(t, d, algorithm="EAGLE3", dataset_manifest=tmp_path / "ok") == []
    fs = [f for f in check_serving(t, d, algorithm="EAGLE3", dataset_manifest=tmp_path / "qwen")
          if f.code == "dataset-target"]  # fmt: skip
    assert len(fs) == 1 and "architecture 'Qwen2ForCausalLM' recorded, 'LlamaForCausalLM' here" in fs[0].message
