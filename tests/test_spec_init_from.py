"""``train-draft --init-from DRAFT`` (eagle_io.spec.init_from): training continues from the exported draft's weights
on its own vocabulary map, and a draft that does not fit the target, the dataset or the options is refused, each
difference named, before anything is written."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file
from test_train_draft import H, V, synthetic_head, write_synthetic

import eagle_io
from eagle_io.cli import main, train_draft_cmd
from eagle_io.draft import evaluate, load_draft, split_positions
from eagle_io.draft.batches import Teacher
from eagle_io.feed import ShardDataset

COMMON = ["--steps", "4", "--eval-samples", "4", "--threads", "1", "--warmup-steps", "1", "--accept-steps", "2"]


def _head(num_layers: int = 4):
    """The synthetic head with the identity and config.json a real target's head carries (what the draft is checked
    against)."""
    head = synthetic_head()
    c = head.config
    head.identity = {"model_id": "synthetic", "architecture": "LlamaForCausalLM", "num_layers": num_layers,
                     "hidden_size": H, "vocab_size": V}  # fmt: skip
    head.target_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": H,
        "num_hidden_layers": num_layers,
        "vocab_size": V,
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["head_dim"],
        "intermediate_size": c["intermediate_size"],
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_theta": c["rope_theta"],
        "max_position_embeddings": c["max_position_embeddings"],
        "tie_word_embeddings": False,
    }
    return head


def _write(root, aux_ids: list[int], num_layers: int = 4) -> None:
    """8 random samples of 16 tokens captured on ``aux_ids`` of a ``num_layers``-layer target."""
    g = torch.Generator().manual_seed(2)
    meta = {"hidden_size": H, "vocab_size": V, "aux_layer_ids": aux_ids, "num_layers": num_layers}
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H, len(aux_ids)), meta, threads=1) as w:
        for i in range(8):
            hid = torch.randn(16, H, generator=g).bfloat16()
            w.write(i, {"input_ids": torch.randint(0, V, (16,), generator=g),
                        "loss_mask": torch.ones(16, dtype=torch.uint8),
                        "aux_hidden_states": torch.cat([hid] * len(aux_ids), 1), "hidden_states": hid})  # fmt: skip


def _cli(monkeypatch, head):
    import eagle_io.draft as draft_mod
    from eagle_io import cli as cli_mod

    monkeypatch.setitem(cli_mod.COMMANDS, "train-draft", train_draft_cmd)
    monkeypatch.setattr(draft_mod, "load_target_head", lambda model=None: head)


def _summary(out):
    return json.loads((out / "train_summary.json").read_text())


def test_init_from_starts_at_the_exported_drafts_weights_and_keeps_its_map(tmp_path, monkeypatch):
    root = tmp_path / "syn"
    write_synthetic(root, 24, 40)
    head = _head()
    _cli(monkeypatch, head)
    v0, v1 = tmp_path / "v0", tmp_path / "v1"
    assert main(["train-draft", str(root), "--out", str(v0), "--draft-vocab-size", "32", *COMMON, "--steps", "60"]) == 0
    # Another seed: another split and batch order; the step-0 weights are still v0's exported ones.
    assert main(["train-draft", str(root), "--out", str(v1), "--init-from", str(v0), "--seed", "3", *COMMON]) == 0
    s0, s1 = _summary(v0), _summary(v1)
    # v1's held-out figures at step 0 are those of the exported v0 (bfloat16 weights) on v1's held-out samples.
    ds = ShardDataset(root, max_length=512)
    _, eval_pos = split_positions(len(ds), 0.1, 4, 3)
    draft = load_draft(v0)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(head.embed)
    head_w = head.lm_head.float()
    t2d = load_file(v0 / "model.safetensors")["t2d"]
    ev = evaluate(draft.eval(), ds, eval_pos, Teacher(head_w), head_w[t2d].contiguous(), 4, 2)
    assert abs(s1["initial"]["loss"] - ev["loss"]) < 1e-5
    assert s1["initial"]["agreement"] == ev["agreement"]
    assert s1["initial"]["accept_length"] == ev["accept_length"]
    # ... far from a fresh draft's start: v0's own step 0 on its held-out samples, near where v0 ended.
    assert s1["initial"]["loss"] < s0["initial"]["loss"] - 0.3
    assert s1["initial"]["agreement"] > s0["initial"]["agreement"] + 0.2
    # The vocab map is v0's, value for value; the weights moved on from v0's; the record names the init draft.
    a, b = load_file(v0 / "model.safetensors"), load_file(v1 / "model.safetensors")
    assert torch.equal(a["d2t"], b["d2t"]) and torch.equal(a["t2d"], b["t2d"]) and int(b["t2d"].sum()) == 32
    assert not torch.equal(a["fc.weight"], b["fc.weight"])
    rec = json.loads((v1 / "config.json").read_text())["eagle_io"]
    assert rec["init_from"] == str(v0.resolve()) and rec["vocab_map"]["kept_from"] == str(v0.resolve())
    assert not (v1 / "vocab_map.safetensors").exists()


def test_init_from_refuses_a_draft_that_does_not_fit_naming_each_difference(tmp_path, monkeypatch, capsys):
    root = tmp_path / "syn"
    write_synthetic(root, 12, 24)
    _cli(monkeypatch, _head())
    v0 = tmp_path / "v0"
    assert main(["train-draft", str(root), "--out", str(v0), "--draft-vocab-size", "32", *COMMON]) == 0
    capsys.readouterr()
    out = tmp_path / "v1"
    cont = ["train-draft", str(root), "--out", str(out), "--init-from", str(v0), *COMMON]

    def refused(*extra: str) -> str:
        assert main([*cont, *extra]) == 2
        assert not out.exists()
        return capsys.readouterr().err

    err = refused("--intermediate-size", "48", "--draft-vocab-size", "16")
    assert "--intermediate-size 48 (the draft's MLP width is 64)" in err
    assert "--draft-vocab-size 16 (the draft's is 32)" in err
    assert "drop --keep-vocab-map" in refused("--keep-vocab-map", str(v0))
    assert "--init-from" in refused("--keep-vocab-map", str(v0)) and "nowhere" in refused(
        "--init-from", str(tmp_path / "nowhere")
    )
    # A target of another depth than the one v0 was trained for (the dataset records 4 layers: both refuse it).
    _cli(monkeypatch, _head(num_layers=6))
    err = refused("--allow-other-target")
    assert "num_layers" in err
    # A draft trained for another target (6 layers) than the one loaded and the dataset's (4): its record refuses it.
    six = tmp_path / "six-layers"
    _write(six, [1, 2, 3], num_layers=6)
    _cli(monkeypatch, _head(num_layers=6))
    assert main(["train-draft", str(six), "--out", str(tmp_path / "v0-six"), "--draft-vocab-size", "32", *COMMON]) == 0
    _cli(monkeypatch, _head())
    capsys.readouterr()
    err = refused("--init-from", str(tmp_path / "v0-six"))
    assert "[draft-for-another-target] the draft was trained for target num_layers 6" in err, err
    assert "the target loaded has num_layers 4" in err
    # A dataset captured on other aux layers than v0 was trained on: check_dataset_fits names them.
    _cli(monkeypatch, _head())
    other = tmp_path / "other-layers"
    _write(other, [1, 3])
    cont[1] = str(other)
    err = refused()
    assert "cannot continue training this draft on" in err and "fc takes 96" in err, err
    assert os.listdir(v0)  # v0 untouched
