"""Reference EAGLE-3 draft training: the shift contract, a fast smoke run on a tiny synthetic dataset (loss falls),
the SGLang-readable export, the CLI, and (slow) a real run on SmolLM2 states of real ShareGPT whose held-out top-1
agreement with the target must rise far above its start."""

from __future__ import annotations

import json
import os
import time
from itertools import islice

import pytest
import torch
from helpers.checks import damage_record
from safetensors import safe_open

import eagle_io
from eagle_io.cli import main, train_draft_cmd
from eagle_io.draft import TargetHead, TrainConfig, load_draft, make_batch, save_draft, train_draft
from eagle_io.feed import ShardDataset
from eagle_io.interop.vocab import build_vocab_mapping

V, H, K = 256, 32, 3

SGLANG_WEIGHT_NAMES = {
    "fc.weight",
    "midlayer.self_attn.q_proj.weight",
    "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "norm.weight",
    "lm_head.weight",
    "embed_tokens.weight",
    "d2t",
    "t2d",
}


def synthetic_head(seed: int = 0) -> TargetHead:
    g = torch.Generator().manual_seed(seed)
    return TargetHead(
        lm_head=torch.randn(V, H, generator=g),
        embed=torch.randn(V, H, generator=g),
        config={
            "hidden_size": H,
            "vocab_size": V,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
            "intermediate_size": 64,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 512,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "model_id": "synthetic",
        },
    )


def write_synthetic(root, n: int, length: int, nan_at: tuple[int, int] | None = None) -> TargetHead:
    """Writes ``n`` samples of ``length`` tokens whose aux states carry the next position's final state (a learnable
    signal); tokens are the head's argmax, all loss-masked. ``nan_at=(sample_id, row)`` puts a NaN in that final
    state. Returns the head."""
    head = synthetic_head()
    g = torch.Generator().manual_seed(1)
    meta = {"hidden_size": H, "vocab_size": V, "aux_layer_ids": [1, 2, 3], "num_layers": 4}
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H, K), meta, threads=1) as w:
        for i in range(n):
            hid = torch.randn(length, H, generator=g)
            aux = torch.cat([torch.roll(hid, -1, 0), torch.randn(length, 2 * H, generator=g)], 1)
            ids = (hid @ head.lm_head.T).argmax(-1)
            if nan_at is not None and i == nan_at[0]:
                hid[nan_at[1], 3] = float("nan")
            tensors = {"input_ids": ids, "loss_mask": torch.ones(length, dtype=torch.uint8)}
            w.write(i, {**tensors, "aux_hidden_states": aux.bfloat16(), "hidden_states": hid.bfloat16()})
    return head


@pytest.fixture
def synthetic(tmp_path):
    """24 samples of 40 tokens (:func:`write_synthetic`). Returns (root, head)."""
    root = tmp_path / "syn"
    return root, write_synthetic(root, 24, 40)


def test_training_batches_follow_the_shift_contract(tmp_path):
    """make_batch = the feed's PaddingCollator + shift_targets: position t gets token t+1 and state t+1."""
    from eagle_io.feed import ShardDataset

    n = 6
    item = {
        "input_ids": torch.arange(10, 10 + n),
        "loss_mask": torch.tensor([0, 0, 1, 1, 1, 0], dtype=torch.uint8),
        "aux_hidden_states": torch.arange(n * 3, dtype=torch.bfloat16).view(n, 3),
        "hidden_states": torch.arange(n, dtype=torch.bfloat16).view(n, 1),
    }
    with eagle_io.ShardWriter(tmp_path / "d", eagle_io.eagle3_schema(1, 3), {"hidden_size": 1}, threads=1) as w:
        w.write(0, item)
        w.write(1, {k: v[:4] for k, v in item.items()})
    b = make_batch(ShardDataset(tmp_path / "d"), [0, 1])
    assert b["next_ids"][0].tolist() == [11, 12, 13, 14, 15, 0]  # position t is fed token t+1
    assert b["target_hidden"][0].flatten().tolist() == [1, 2, 3, 4, 5, 0]  # ... and trained toward state t+1
    assert b["mask"][0].tolist() == [False, True, True, True, False, False]  # the mask moves with the target
    assert torch.equal(b["aux"][0], item["aux_hidden_states"])  # aux[t] stays at t
    # The shorter sample: its last real position has no target, padding never does.
    assert b["next_ids"][1].tolist() == [11, 12, 13, 0, 0, 0]
    assert b["mask"][1].tolist() == [False, True, True, False, False, False]
    assert b["lengths"].tolist() == [6, 4]
    cut = make_batch(ShardDataset(tmp_path / "d", max_length=3), [0])
    assert cut["next_ids"][0].tolist() == [11, 12, 0] and cut["mask"][0].tolist() == [False, True, False]


def test_smoke_training_loss_decreases_and_agreement_rises(synthetic):
    root, head = synthetic
    mapping = build_vocab_mapping(root, 64)
    cfg = TrainConfig(steps=40, batch_size=4, lr=3e-3, warmup_steps=5, eval_samples=4, threads=1, log_every=0)
    r = train_draft(root, head, mapping, cfg, log=None)
    losses = [h["loss"] for h in r.history]
    assert len(losses) == 40 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) / 5 < 0.85 * sum(losses[:5]) / 5
    assert r.final["loss"] < r.initial["loss"]
    assert r.final["agreement"] > r.initial["agreement"] + 0.05
    assert r.train_samples == 20 and r.eval_samples == 4 and r.initial["positions"] > 0


def test_training_past_a_corrupt_record_when_asked_keeps_rows_and_positions_aligned(synthetic):
    root, head = synthetic
    mapping = build_vocab_mapping(root, 64)  # before the damage: the mapping reads every record
    damage_record(root, 5)
    ds = ShardDataset(root, max_length=512, on_corrupt="skip")
    batch = make_batch(ds, [4, 5, 6])
    assert batch["positions"] == [4, 6] and batch["aux"].shape[0] == 2, "the bad row is left out, not replaced"
    for row, pos in enumerate(batch["positions"]):
        assert torch.equal(batch["aux"][row], ds[pos]["aux_hidden_states"])
    cfg = TrainConfig(steps=8, batch_size=4, eval_samples=4, threads=1, log_every=0)
    r = train_draft(ds, head, mapping, cfg, log=None)
    assert len(ds.skipped) >= 2 and {s.sample_id for s in ds.skipped} == {5}, "skipped on every read, one record"
    assert r.skipped_records == 1 == r.summary()["skipped_corrupt_records"] and r.empty_steps == 0
    # Batches of one: the steps (and held-out chunks) that hold only the bad record make no update, no crash.
    one = TrainConfig(steps=30, batch_size=1, eval_samples=4, threads=1, log_every=0)
    r1 = train_draft(ShardDataset(root, max_length=512, on_corrupt="skip"), head, mapping, one, log=None)
    assert r1.empty_steps >= 1 and len(r1.history) == 30 - r1.empty_steps and r1.skipped_records == 1
    with pytest.raises(eagle_io.CorruptRecordError, match="sample id 5"):
        train_draft(root, head, mapping, cfg, log=None)  # the default raises


def test_export_is_what_sglang_reads(synthetic, tmp_path):
    root, head = synthetic
    mapping = build_vocab_mapping(root, 64)
    r = train_draft(root, head, mapping, TrainConfig(steps=2, eval_samples=4, threads=1, log_every=0), log=None)
    paths = save_draft(r.model, tmp_path / "draft", [1, 2, 3], bos_token_id=1, eos_token_id=2)
    cfg = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    # eagle-io [1, 2, 3] -> SGLang Llama explicit ids (its setter adds +1) [0, 1, 2]
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}
    assert cfg["target_hidden_size"] == H and cfg["hidden_size"] == H and cfg["vocab_size"] == V
    assert cfg["draft_vocab_size"] == 64 and cfg["num_hidden_layers"] == 1
    assert cfg["tie_word_embeddings"] is False and cfg["torch_dtype"] == "bfloat16"
    with safe_open(paths["weights"], framework="pt") as f:
        names = set(f.keys())
        assert names == SGLANG_WEIGHT_NAMES
        assert f.get_slice("fc.weight").get_shape() == [H, K * H]  # SGLang: fc in = 3 * target_hidden_size
        assert f.get_slice("midlayer.self_attn.q_proj.weight").get_shape() == [4 * 8, 2 * H]
        assert f.get_slice("lm_head.weight").get_shape() == [64, H]
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert int(t2d.sum()) == len(d2t) == 64 and torch.equal(d2t, mapping.d2t)
    assert torch.equal(t2d.nonzero().flatten(), d2t + torch.arange(64))  # SGLang's hot_token_id
    back = load_draft(tmp_path / "draft")
    x, ids = torch.randn(1, 7, K * H), torch.randint(0, V, (1, 7))
    with torch.no_grad():
        a, b = r.model.eval()(x, ids), back.eval()(x, ids)
    assert torch.allclose(a, b, atol=0.1, rtol=0.05)  # bf16 weights
    with pytest.raises(ValueError, match="2 aux layer ids for a draft trained on 3"):
        save_draft(r.model, tmp_path / "bad", [1, 2])


def test_export_passes_the_serving_preflight(synthetic, tmp_path):
    """eagle_io.serving's check (fc width, layer ids with SGLang's +1, d2t, algorithm) accepts the export."""
    from transformers import LlamaConfig

    from eagle_io.serving.preflight import ERROR, check_serving

    root, head = synthetic
    r = train_draft(root, head, build_vocab_mapping(root, 64), TrainConfig(steps=1, eval_samples=4), log=None)
    save_draft(r.model, tmp_path / "draft", [1, 2, 3])
    LlamaConfig(  # the draft inherits the target head's 512 positions: serve a 512-position target
        vocab_size=V,
        hidden_size=H,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    ).save_pretrained(tmp_path / "target")
    ok = check_serving(tmp_path / "target", tmp_path / "draft", algorithm="EAGLE3", layer_ids=[1, 2, 3])
    assert [f for f in ok if f.severity == ERROR] == []
    wrong = check_serving(tmp_path / "target", tmp_path / "draft", algorithm="EAGLE", layer_ids=[1, 2, 3])
    assert [f.code for f in wrong if f.severity == ERROR] == ["eagle3-draft-wrong-algorithm"]


def test_cli_train_draft(synthetic, tmp_path, monkeypatch, capsys):
    import eagle_io.draft as draft_mod
    from eagle_io import cli as cli_mod

    root, head = synthetic
    monkeypatch.setitem(cli_mod.COMMANDS, "train-draft", train_draft_cmd)
    monkeypatch.setattr(draft_mod, "load_target_head", lambda model=None: head)
    out = tmp_path / "run"
    args = ["train-draft", str(root), "--out", str(out), "--draft-vocab-size", "32", "--steps", "3"]
    assert main([*args, "--eval-samples", "4", "--threads", "1"]) == 0
    assert {"model.safetensors", "config.json", "train_summary.json", "vocab_map.safetensors"} <= set(os.listdir(out))
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 3 and len(summary["history"]) == 3 and "agreement" in summary["final"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 32 and cfg["eagle_io"]["vocab_map"]["draft_vocab_size"] == 32
    # A stored mapping is used when its key fits this dataset; one keyed to another dataset is refused.
    other = build_vocab_mapping(root, 16)
    other.save(tmp_path / "m16.safetensors")
    assert main([*args[:4], "--vocab-map", str(tmp_path / "m16.safetensors"), "--steps", "1"]) == 0
    # The same map with a float d2t (offsets + 0.25) was cast to integers and trained on; it cannot be a vocab map
    # (issue 47): refused naming the file and the field, before training.
    torch.save({"d2t": other.d2t.float() + 0.25, "t2d": other.t2d, "eagle_io_key": dict(other.key)}, tmp_path / "f.pt")
    capsys.readouterr()
    assert main([*args[:4], "--vocab-map", str(tmp_path / "f.pt"), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert f"CheckpointError: {tmp_path / 'f.pt'}: d2t must be a 1-D integer tensor (SGLang indexes with " in err
    fewer = tmp_path / "fewer"  # another dataset: 6 of the samples
    write_synthetic(fewer, 6, 40)
    bad = ["train-draft", str(fewer), "--out", str(tmp_path / "r2"), "--vocab-map", str(tmp_path / "m16.safetensors")]
    assert main(bad) == 2
    assert "dataset_sha256: mapping has" in capsys.readouterr().err
    # An empty dataset is refused as such, before anything is written (issue 34).
    empty = tmp_path / "empty"
    with eagle_io.ShardWriter(
        empty,
        eagle_io.eagle3_schema(H, K),
        {"hidden_size": H, "vocab_size": V, "aux_layer_ids": [1, 2, 3], "num_layers": 4},
        threads=1,
    ):
        pass
    assert main(["train-draft", str(empty), "--out", str(tmp_path / "r3")]) == 2
    assert "the dataset holds 0" in capsys.readouterr().err and not (tmp_path / "r3").exists()


def test_supervision_lost_to_max_length_is_skipped_counted_and_an_empty_run_fails(tmp_path, monkeypatch, capsys):
    """30-token samples supervised only from token 20 on, under max_length 16: each is left out of its batch and
    counted (it trained on nothing, silently); a run where no sample keeps a supervised token fails naming
    --max-length and exports nothing (it "trained" and exited 0)."""
    import eagle_io.draft as draft_mod
    from eagle_io import cli as cli_mod
    from eagle_io.feed import PaddingCollator

    head, g = synthetic_head(), torch.Generator().manual_seed(3)

    def write(root, late: int, early: int):
        """``late`` samples supervised from token 20, then ``early`` from token 3."""
        meta = {"hidden_size": H, "vocab_size": V, "aux_layer_ids": [1, 2, 3], "num_layers": 4}
        with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H, K), meta, threads=1) as w:
            for i in range(late + early):
                mask = torch.zeros(30, dtype=torch.uint8)
                mask[20 if i < late else 3 :] = 1
                hid = torch.randn(30, H, generator=g).bfloat16()
                w.write(i, {"input_ids": torch.randint(0, V, (30,), generator=g), "loss_mask": mask,
                            "aux_hidden_states": torch.cat([hid] * 3, 1), "hidden_states": hid})  # fmt: skip
        return root

    root = write(tmp_path / "late", 7, 3)
    ds = ShardDataset(root, max_length=16)
    batch = PaddingCollator().collate_from(ds, [0, 8, 1, 9])
    assert batch["sample_ids"] == [8, 9] and batch["input_ids"].shape == (2, 16)
    assert [(u["sample_id"], u["reason"], u["stored_tokens"]) for u in batch["unsupervised"]] == [
        (0, "no_supervised_token_within_max_length", 30), (1, "no_supervised_token_within_max_length", 30)]  # fmt: skip
    assert torch.equal(batch["loss_mask"][0], ds[8]["loss_mask"]) and len(ds.unsupervised) == 2
    r = train_draft(ds, head, build_vocab_mapping(root, 64), TrainConfig(steps=2, eval_samples=2, batch_size=4,
                    log_every=0, threads=1), log=None)  # fmt: skip
    assert r.unsupervised_samples >= 1 and r.summary()["unsupervised_samples_skipped"] == r.unsupervised_samples
    late = ShardDataset(root, max_length=16, filter=lambda info, meta: info.sample_id < 7)
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"none of the 7 samples has a supervised token"):
        late.require_supervision(option="--max-length")
    ShardDataset(root, max_length=16).require_supervision()  # samples 7..9 keep theirs
    monkeypatch.setitem(cli_mod.COMMANDS, "train-draft", train_draft_cmd)
    monkeypatch.setattr(draft_mod, "load_target_head", lambda model=None: head)
    out = tmp_path / "run"
    only_late = write(tmp_path / "only-late", 7, 0)
    args = ["train-draft", str(only_late), "--out", str(out), "--max-length", "16", "--draft-vocab-size", "16"]
    assert main([*args, "--steps", "2", "--eval-samples", "2", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "none of the 5 samples" in err and "5 are longer and cut by it (5 of them have supervised tokens past" in err
    assert "Raise max_length (train-draft --max-length)" in err and not (out / "model.safetensors").exists()


def test_cli_train_draft_past_a_corrupt_record_only_when_asked(synthetic, tmp_path, monkeypatch, capsys):
    import eagle_io.draft as draft_mod
    from eagle_io import cli as cli_mod

    root, head = synthetic
    damage_record(root, 5)
    monkeypatch.setitem(cli_mod.COMMANDS, "train-draft", train_draft_cmd)
    monkeypatch.setattr(draft_mod, "load_target_head", lambda model=None: head)
    args = ["train-draft", str(root), "--draft-vocab-size", "32", "--steps", "6", "--eval-samples", "4"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    assert "sample id 5" in capsys.readouterr().err, "the default names the bad record and stops"
    assert main([*args, "--out", str(tmp_path / "b"), "--on-corrupt", "skip"]) == 0
    summary = json.loads((tmp_path / "b" / "train_summary.json").read_text())
    assert summary["skipped_corrupt_records"] == 1
    with safe_open(tmp_path / "b" / "vocab_map.safetensors", framework="pt") as f:
        key = json.loads(f.metadata()["eagle_io_vocab_map"])
    assert key["skipped_corrupt_sample_ids"] == [5] and key["dataset_samples"] == 23


# --- slow: the real target, real ShareGPT ----------------------------------------------------------------

REAL_SAMPLES, REAL_STEPS, REAL_MAX_LENGTH = 48, 100, 192


@pytest.mark.slow
def test_draft_trained_on_real_smollm2_states_agrees_far_more(tmp_path):
    """Capture SmolLM2 states for the first 48 usable ShareGPT conversations (192 tokens), train 100 steps, and
    measure held-out top-1 agreement with the target (the measured numbers are in docs/TRAINING.md)."""
    from eagle_io.capturing.models import load_target
    from eagle_io.data import (
        SkipStats,
        chat_template_identity,
        default_dataset_path,
        iter_conversations,
        iter_tokenized,
    )

    t0 = time.perf_counter()
    model, tok, info = load_target()
    stats = SkipStats()
    convs = iter_conversations(default_dataset_path(), on_error="skip", stats=stats)
    samples = list(islice(iter_tokenized(convs, tok, stats=stats, max_length=REAL_MAX_LENGTH), REAL_SAMPLES))
    root = tmp_path / "real"
    with eagle_io.capture(
        model,
        root,
        target_info=info,
        tokenizer_identity=chat_template_identity(tok),
        max_length=REAL_MAX_LENGTH,
        threads=1,
    ) as cap:
        samples.sort(key=lambda s: len(s.input_ids))
        for i in range(0, len(samples), 4):
            cap.submit(samples[i : i + 4])
    head = TargetHead.from_model(model, info["model_id"])
    del model
    t_capture = time.perf_counter() - t0
    mapping = build_vocab_mapping(root, 2048)
    cfg = TrainConfig(steps=REAL_STEPS, batch_size=4, seq_length=REAL_MAX_LENGTH, warmup_steps=10, eval_samples=8)
    r = train_draft(root, head, mapping, cfg)
    print(json.dumps({**r.summary(), "capture_seconds": round(t_capture, 1), "vocab": dict(mapping.key)}, indent=2))
    # Measured (docs/TRAINING.md): 0.000 -> 0.219 with exactly these settings; 0.12 leaves margin.
    assert r.final["agreement"] >= 3 * r.initial["agreement"]
    assert r.final["agreement"] >= r.initial["agreement"] + 0.10
    assert r.final["agreement"] >= 0.12
    assert r.final["loss"] < r.initial["loss"]
