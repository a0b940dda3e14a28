"""`train-draft` / `save_draft` write the eagle_config ids that SGLang's setter for *the target's architecture* turns
into the trained layers, and record the target; `check-serving` accepts the export on that target and refuses it on
another one."""

from __future__ import annotations

import json

import pytest
import torch
from test_train_draft import H, K, V, synthetic_head

import eagle_io
from eagle_io.cli import main, train_draft_cmd
from eagle_io.draft import TrainConfig, save_draft, train_draft
from eagle_io.interop.vocab import build_vocab_mapping
from eagle_io.serving import check_serving


def _dataset(root, meta, n=12):
    g = torch.Generator().manual_seed(2)
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H, K), meta, threads=1) as w:
        for i in range(n):
            w.write(
                i,
                {
                    "input_ids": torch.randint(0, V, (20,), generator=g),
                    "loss_mask": torch.ones(20, dtype=torch.uint8),
                    "aux_hidden_states": torch.randn(20, K * H, generator=g).bfloat16(),
                    "hidden_states": torch.randn(20, H, generator=g).bfloat16(),
                },
            )
    return root


def _target(path, arch, layers=8):
    """A target config.json with SGLang's sizes at the top level, or in text_config for the Kimi-K2.5 wrapper."""
    text = {"architectures": [arch], "hidden_size": H, "num_hidden_layers": layers, "vocab_size": V,
            "max_position_embeddings": 512, "rope_theta": 10000.0}  # fmt: skip
    cfg = text
    if arch == "KimiK25ForConditionalGeneration":
        cfg = {"architectures": [arch], "text_config": {**text, "architectures": ["DeepseekV3ForCausalLM"]}}
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = _dataset(tmp_path_factory.mktemp("ds") / "d", {"hidden_size": H, "vocab_size": V, "aux_layer_ids": [3, 5, 7],
                                                           "num_layers": 8})  # fmt: skip
    r = train_draft(root, synthetic_head(), build_vocab_mapping(root, 64), TrainConfig(steps=1, eval_samples=4),
                    log=None)  # fmt: skip
    return r.model


@pytest.mark.parametrize(
    ("arch", "written"),
    [
        ("LlamaForCausalLM", [2, 4, 6]),  # +1 setter
        ("DeepseekV3ForCausalLM", [3, 5, 7]),  # +1 only when the first id is 1: written as trained
        ("KimiK25ForConditionalGeneration", [3, 5, 7]),  # delegates to DeepSeek-V3
        ("Glm4MoeLiteForCausalLM", [3, 5, 7]),  # copies DeepSeek's rule
    ],
)
def test_export_ids_follow_the_targets_setter(trained, tmp_path, arch, written):
    target = {"architecture": arch, "num_layers": 8, "hidden_size": H, "model_id": "t8"}
    save_draft(trained, tmp_path / "draft", [3, 5, 7], target=target)
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == written
    assert cfg["eagle_io"]["aux_layer_ids"] == [3, 5, 7] and cfg["eagle_io"]["target"] == target
    t = _target(tmp_path / "target", arch)
    fs = check_serving(t, tmp_path / "draft", algorithm="EAGLE3", layer_ids=[3, 5, 7])
    assert [f.code for f in fs if f.severity == "error"] == []
    # the same draft on a 12-layer target of the same family: refused from its eagle_io record alone
    t12 = _target(tmp_path / "t12", arch, layers=12)
    fs = check_serving(t12, tmp_path / "draft", algorithm="EAGLE3")
    assert "draft-trained-target" in {f.code for f in fs if f.severity == "error"}


def test_export_refuses_ids_the_setter_cannot_express(trained, tmp_path):
    """DeepSeek's setter turns [0, ..] into [0, ..] and [1, ..] into [2, ..]: eagle-io id 1 first cannot be served."""
    with pytest.raises(eagle_io.InvalidArgumentError, match="DeepseekV3ForCausalLM setter cannot capture"):
        save_draft(
            trained, tmp_path / "d", [1, 5, 7], target={"architecture": "DeepseekV3ForCausalLM", "num_layers": 8}
        )
    with pytest.raises(eagle_io.InvalidArgumentError, match="aux layer id -1 out of range"):
        save_draft(trained, tmp_path / "d", [-1, 5, 7], target={"num_layers": 8})
    assert not (tmp_path / "d" / "model.safetensors").exists()


def test_cli_train_draft_uses_the_datasets_target(tmp_path, monkeypatch, capsys):
    import eagle_io.draft as draft_mod
    from eagle_io import cli as cli_mod

    monkeypatch.setitem(cli_mod.COMMANDS, "train-draft", train_draft_cmd)
    monkeypatch.setattr(draft_mod, "load_target_head", lambda model=None: synthetic_head())
    meta = {"hidden_size": H, "vocab_size": V, "aux_layer_ids": [3, 5, 7], "num_layers": 8,
            "target_model": {"model_id": "glm-lite", "architecture": "Glm4MoeLiteForCausalLM"}}  # fmt: skip
    root = _dataset(tmp_path / "ds", meta)
    args = ["train-draft", str(root), "--out", str(tmp_path / "run"), "--draft-vocab-size", "32", "--steps", "1"]
    assert main([*args, "--eval-samples", "4", "--threads", "1"]) == 0
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 5, 7]
    assert cfg["eagle_io"]["target"]["architecture"] == "Glm4MoeLiteForCausalLM"
    capsys.readouterr()
    bad = _dataset(tmp_path / "bad", {**meta, "aux_layer_ids": [1, 5, 7]})
    assert main(["train-draft", str(bad), "--out", str(tmp_path / "run2"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "Glm4MoeLiteForCausalLM setter cannot capture eagle-io ids [1, 5, 7]" in err and "Traceback" not in err
    assert not (tmp_path / "run2" / "model.safetensors").exists()
