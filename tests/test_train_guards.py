"""Draft training guards: NaN/Inf states or a diverging loss stop training (no metric computed from NaN, nothing
exported); non-finite weights are never exported; a vocabulary map that contradicts --draft-vocab-size is refused."""

from __future__ import annotations

import json
import os

import pytest
import torch
from test_train_draft import H, V, synthetic, synthetic_head, write_synthetic  # noqa: F401  (synthetic is a fixture)

import eagle_io
from eagle_io.cli import main, train_draft_cmd
from eagle_io.draft import TrainConfig, build_draft, save_draft, train_draft
from eagle_io.errors import NonFiniteTrainingError
from eagle_io.interop.vocab import build_vocab_mapping

CFG = TrainConfig(steps=4, batch_size=4, lr=3e-3, warmup_steps=1, eval_samples=4, threads=1, log_every=0)


def _with_nan(tmp_path, sample_id: int, row: int):
    """The synthetic dataset's recipe, 12 samples of 16 tokens, with a NaN in one final state."""
    root = tmp_path / "nan"
    return root, write_synthetic(root, 12, 16, nan_at=(sample_id, row))


@pytest.mark.parametrize(("sample_id", "where"), [(0, r"step \d+"), (5, "evaluation")])  # seed 0 holds out 1, 5, 8, 9
def test_nan_states_stop_training_naming_the_sample(tmp_path, sample_id, where):
    root, head = _with_nan(tmp_path, sample_id, row=6)
    mapping = build_vocab_mapping(root, 64)
    with pytest.raises(NonFiniteTrainingError, match=rf"^{where}: the states of sample id\(s\) \[{sample_id}\] hold"):
        train_draft(root, head, mapping, TrainConfig(**{**CFG.__dict__, "steps": 12}), log=None)


def test_a_diverging_loss_stops_training(synthetic):  # noqa: F811
    root, head = synthetic
    mapping = build_vocab_mapping(root, 64)
    cfg = TrainConfig(**{**CFG.__dict__, "lr": 1e30, "grad_clip": 1e30, "steps": 20})
    with pytest.raises(NonFiniteTrainingError, match=r"step \d+: the training loss is (nan|inf)"):
        train_draft(root, head, mapping, cfg, log=None)


def test_non_finite_weights_are_never_exported(tmp_path):
    head = synthetic_head()
    model = build_draft(head, {"hidden_size": H, "vocab_size": V, "aux_layer_ids": [1, 2, 3]}, 16)
    d2t = torch.zeros(16, dtype=torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[:16] = True
    model.set_vocab_mapping(d2t, t2d)
    with torch.no_grad():
        model.midlayer.mlp.up_proj.weight[3, 4] = float("inf")
    with pytest.raises(NonFiniteTrainingError, match=r"draft weight midlayer\.mlp\.up_proj\.weight holds 1 NaN/Inf"):
        save_draft(model, tmp_path / "out", [1, 2, 3])
    assert not (tmp_path / "out").exists()


def _cli(monkeypatch, head):
    import eagle_io.draft as draft_mod
    from eagle_io import cli as cli_mod

    monkeypatch.setitem(cli_mod.COMMANDS, "train-draft", train_draft_cmd)
    monkeypatch.setattr(draft_mod, "load_target_head", lambda model=None: head)


def test_cli_train_draft_on_nan_states_exits_2_and_exports_nothing(tmp_path, monkeypatch, capsys):
    root, head = _with_nan(tmp_path, 5, row=2)
    _cli(monkeypatch, head)
    out = tmp_path / "run"
    args = ["train-draft", str(root), "--out", str(out), "--draft-vocab-size", "32", "--steps", "12"]
    assert main([*args, "--eval-samples", "4", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NonFiniteTrainingError" in err and "sample id(s) [5]" in err
    assert "model.safetensors" not in os.listdir(out) and "train_summary.json" not in os.listdir(out)


def test_cli_refuses_a_vocab_map_that_contradicts_draft_vocab_size(synthetic, tmp_path, monkeypatch, capsys):  # noqa: F811
    root, head = synthetic
    _cli(monkeypatch, head)
    build_vocab_mapping(root, 64).save(tmp_path / "m64.safetensors")
    args = ["train-draft", str(root), "--out", str(tmp_path / "r"), "--vocab-map", str(tmp_path / "m64.safetensors")]
    assert main([*args, "--draft-vocab-size", "32", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "InvalidArgumentError" in err and "64 entries" in err and "--draft-vocab-size 32" in err
    assert not (tmp_path / "r").exists()
    # the same size, or no --draft-vocab-size, is fine: the map decides
    assert main([*args, "--draft-vocab-size", "64", "--steps", "1", "--eval-samples", "4"]) == 0
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 64


def test_keep_vocab_map_trains_on_an_exported_drafts_own_map(synthetic, tmp_path, monkeypatch, capsys):  # noqa: F811
    """``--keep-vocab-map DRAFT``: the successor carries DRAFT's d2t/t2d value for value (what swap-draft requires),
    whatever its own data would have built; contradicting options are refused before anything is written."""
    from safetensors.torch import load_file

    root, head = synthetic
    _cli(monkeypatch, head)
    common = ["--steps", "1", "--eval-samples", "4", "--threads", "1"]
    assert main(["train-draft", str(root), "--out", str(tmp_path / "v0"), "--draft-vocab-size", "32", *common]) == 0
    keep = ["train-draft", str(root), "--out", str(tmp_path / "v1"), "--keep-vocab-map", str(tmp_path / "v0")]
    assert main([*keep, "--draft-vocab-size", "16", *common]) == 2
    assert "--keep-vocab-map" in capsys.readouterr().err and not (tmp_path / "v1").exists()
    build_vocab_mapping(root, 32).save(tmp_path / "m.safetensors")
    assert main([*keep, "--vocab-map", str(tmp_path / "m.safetensors"), *common]) == 2
    assert "pick one" in capsys.readouterr().err and not (tmp_path / "v1").exists()
    assert main([*keep, "--seed", "3", *common]) == 0
    a, b = load_file(tmp_path / "v0" / "model.safetensors"), load_file(tmp_path / "v1" / "model.safetensors")
    assert torch.equal(a["d2t"], b["d2t"]) and torch.equal(a["t2d"], b["t2d"]) and int(b["t2d"].sum()) == 32
    assert not torch.equal(a["fc.weight"], b["fc.weight"])
    cfg = json.loads((tmp_path / "v1" / "config.json").read_text())
    assert cfg["eagle_io"]["vocab_map"]["kept_from"] == str((tmp_path / "v0").resolve())


def test_a_held_out_set_without_supervision_is_refused_before_training(tmp_path, monkeypatch, capsys):
    # Held-out samples whose supervised tokens all lie past max_length: every held-out metric is computed over no
    # position (loss 0, agreement 0), and train-draft stopped after training on build_profile's error (a TypeError
    # traceback: no train_summary.json) for an offline accept length of None.
    head, g = synthetic_head(), torch.Generator().manual_seed(3)
    root = tmp_path / "late-held-out"
    meta = {"hidden_size": H, "vocab_size": V, "aux_layer_ids": [1, 2, 3], "num_layers": 4}
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H, 3), meta, threads=1) as w:
        for i in range(10):  # seed 0 holds out positions 7 and 8 of 10 (eval_samples 2)
            mask = torch.zeros(30, dtype=torch.uint8)
            mask[20 if i in (7, 8) else 3 :] = 1
            hid = torch.randn(30, H, generator=g).bfloat16()
            w.write(i, {"input_ids": torch.randint(0, V, (30,), generator=g), "loss_mask": mask,
                        "aux_hidden_states": torch.cat([hid] * 3, 1), "hidden_states": hid})  # fmt: skip
    cfg = TrainConfig(**{**CFG.__dict__, "eval_samples": 2, "seq_length": 16, "steps": 2})
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"the 2 held-out samples .*none of the 2 samples"):
        train_draft(root, head, build_vocab_mapping(root, 16), cfg, log=None)
    _cli(monkeypatch, head)
    out = tmp_path / "run"
    args = ["train-draft", str(root), "--out", str(out), "--max-length", "16", "--draft-vocab-size", "16"]
    assert main([*args, "--steps", "2", "--eval-samples", "2", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "IncompatibleDatasetError" in err and "held-out" in err and "--eval-samples" in err
    assert not (out / "model.safetensors").exists()
