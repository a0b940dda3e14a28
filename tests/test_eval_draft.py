"""``eagle-io eval-draft`` end to end on a tiny HF target (tests/helpers/tiny_model.py): `eagle-io generate` on the
ShareGPT fixture slice, `train-draft --ttt-length 2` (which records its training sample ids and writes a
speculation profile), then eval-draft live on held-out conversations and offline, ``--json`` keys, the profile next
to the draft; bad inputs (a draft for another target, dataset metadata that does not match the draft, a draft
without ``d2t``) are errors naming what differs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers.tiny_model import FIXTURE, build_tiny_model_dir
from safetensors.torch import load_file, save_file

import eagle_io
from eagle_io.cli import main
from eagle_io.draft.export import load_draft
from eagle_io.errors import CheckpointError, InvalidArgumentError
from eagle_io.interop.speculation_profile import (
    build_profile,
    expected_accept_length,
    read_profile,
    read_training_samples,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(root, target dir, dataset, draft): 12 samples of <= 96 tokens, a draft trained 20 steps on 8 of them."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("eval")
    target = build_tiny_model_dir(root / "tiny")
    ds, draft = root / "ds", root / "draft"
    common = ["--threads", "1"]
    assert (
        main(
            [
                "generate",
                "--model",
                str(target),
                "--dataset",
                str(FIXTURE),
                "--out",
                str(ds),
                "--max-length",
                "96",
                "--no-disk-check",
                "--skip-bad-records",
                *common,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "train-draft",
                str(ds),
                "--out",
                str(draft),
                "--target-model",
                str(target),
                "--steps",
                "20",
                "--max-length",
                "96",
                "--eval-samples",
                "4",
                "--draft-vocab-size",
                "256",
                "--ttt-length",
                "2",
                "--lr",
                "3e-3",
                "--warmup-steps",
                "3",
                *common,
            ]
        )
        == 0
    )
    return root, target, ds, draft


def one_sample_dataset(root, *, hidden: int, vocab: int):
    """A one-sample EAGLE-3 dataset of an 8-layer target of this hidden size and vocabulary (zero states)."""
    meta = {"hidden_size": hidden, "vocab_size": vocab, "num_layers": 8, "aux_layer_ids": [2, 4, 5]}
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(hidden), meta, threads=1) as w:
        w.write(
            0,
            {
                "input_ids": torch.arange(4),
                "loss_mask": torch.ones(4, dtype=torch.uint8),
                "aux_hidden_states": torch.zeros(4, 3 * hidden, dtype=torch.bfloat16),
                "hidden_states": torch.zeros(4, hidden, dtype=torch.bfloat16),
            },
        )
    return root


def eval_json(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["eval-draft", *args, "--threads", "1", "--json"]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out)
    if res["live"]:  # the live loop shows its progress on stderr (off a terminal: its first and last lines)
        n = res["live"]["prompts"]
        assert "eval-draft live: 100%" in out.err and f"{n}/{n}" in out.err, out.err
    return res


def test_train_draft_records_its_samples_and_a_profile(run):
    _, _, ds, draft = run
    rec = read_training_samples(draft)
    ids = sorted(eagle_io.Dataset(ds).entry(p).sample_id for p in range(len(eagle_io.Dataset(ds))))
    assert sorted(rec["train_sample_ids"] + rec["held_out_sample_ids"]) == ids and len(rec["held_out_sample_ids"]) == 4
    assert rec["source_dataset"] == FIXTURE.name
    prof = read_profile(draft)
    assert prof["source"] == "offline" and prof["num_steps"] == 3 and prof["live"] is None
    assert prof["accept_length"] == prof["offline"]["accept_length"] >= 1.0
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["eagle_io"]["ttt_length"] == 2 and cfg["eagle_io"]["training_samples"] == "training_samples.json"
    summary = json.loads((draft / "train_summary.json").read_text())
    assert len(summary["history"][0]["ttt_step_loss"]) == 2 and "accept_length" in summary["final"]


def test_eval_draft_json_live_and_offline_on_held_out_samples(run, capsys):
    _, target, ds, draft = run
    res = eval_json(
        capsys,
        "--draft",
        str(draft),
        "--target",
        str(target),
        "--dataset",
        str(ds),
        "--prompts",
        "3",
        "--max-new-tokens",
        "12",
    )
    live, off = res["live"], res["offline"]
    for key in ("accept_length", "per_position_accept_rate", "verify_steps", "generated_tokens", "lossless"):
        assert key in live
    for key in ("accept_length", "accept_length_product_of_marginals", "per_position_conditional", "positions"):
        assert key in off
    assert res["num_steps"] == 3 and res["as_algorithm"] == "EAGLE3" and live["lossless"] is True
    assert live["accept_length"] == pytest.approx(1 + sum(live["per_position_accept_rate"]))
    assert 1 <= live["generated_tokens"] <= 36 and live["verify_steps"] >= live["generated_tokens"] // 4 - 3
    held = read_training_samples(draft)["held_out_sample_ids"]
    assert res["held_out"] == "recorded" and res["excluded"] == 8
    assert set(live["sample_ids"]) <= set(held) and off["samples"] == len(held)
    prof = read_profile(draft)  # rewritten from this run: the live figure
    assert prof["source"] == "live" and prof["accept_length"] == live["accept_length"]
    assert prof["data"]["live_sample_ids"] == live["sample_ids"] and prof["target"]["model_id"] == "tiny"
    assert expected_accept_length(prof, 3) == pytest.approx(live["accept_length"])
    eagle = eval_json(
        capsys,
        "--draft",
        str(draft),
        "--target",
        str(target),
        "--dataset",
        str(ds),
        "--prompts",
        "1",
        "--max-new-tokens",
        "6",
        "--as-algorithm",
        "EAGLE",
        "--num-steps",
        "2",
    )
    assert eagle["as_algorithm"] == "EAGLE" and eagle["offline"] is None and eagle["live"]["lossless"] is True
    assert read_profile(draft)["source"] == "live" and read_profile(draft)["num_steps"] == 3, "EAGLE mode writes none"


def test_bad_inputs_name_what_differs(run, capsys, tmp_path):
    _, target, ds, draft = run

    def refused(*args: str) -> str:
        capsys.readouterr()
        assert main(["eval-draft", *args, "--prompts", "0", "--no-profile", "--threads", "1"]) == 2
        return capsys.readouterr().err

    # A draft for another target: the same weights under another name (model_id) ...
    other = shutil.copytree(target, tmp_path / "other-target")
    err = refused("--draft", str(draft), "--target", str(other), "--dataset", str(ds))
    assert "DraftMismatchError" in err and "draft-for-another-target" in err and "'tiny'" in err
    assert "'other-target'" in err and "--allow-other-target" in err
    # ... and a dataset captured from another target (hidden size 16).
    small = one_sample_dataset(tmp_path / "small", hidden=16, vocab=2000)
    err = refused("--draft", str(draft), "--target", str(target), "--dataset", str(small))
    assert "dataset-hidden-size" in err and "hidden_size 16" in err
    # Dataset metadata that does not match the draft (its vocabulary).
    odd = one_sample_dataset(tmp_path / "odd", hidden=32, vocab=999)
    err = refused("--draft", str(draft), "--target", str(target), "--dataset", str(odd))
    # (found by check-serving's dataset-target check, which runs first since the one target identity, 60806f0)
    assert "dataset-target" in err and "vocab_size 999 recorded, 2000 here" in err and str(odd) in err, err[-800:]
    # A draft without d2t (its 256-token vocabulary would be read as target ids 0..255).
    no_map = shutil.copytree(draft, tmp_path / "no-d2t")
    state = load_file(no_map / "model.safetensors")
    save_file({k: v for k, v in state.items() if k not in ("d2t", "t2d")}, no_map / "model.safetensors")
    (no_map / "vocab_map.safetensors").unlink()  # SGLang would read d2t from any *.safetensors of the directory
    err = refused("--draft", str(no_map), "--target", str(target), "--dataset", str(ds))
    assert "d2t-missing" in err and "no d2t tensor" in err
    # The wrong flag has no offline figure (the stored states are EAGLE3's): with no live prompt, nothing is measured.
    err = refused("--draft", str(draft), "--target", str(target), "--dataset", str(ds), "--as-algorithm", "EAGLE")
    assert "InvalidArgumentError" in err and "measured live only" in err and "--prompts >= 1" in err


def test_a_draft_config_without_sglangs_defaulted_keys_loads_as_sglang_builds_it(run, capsys, tmp_path):
    # SpecForge's draft configs name no head_dim and no target_hidden_size: SGLang's LlamaConfig gives
    # hidden_size // heads and llama_eagle3.py hidden_size. eval-draft stopped on a KeyError traceback.
    _, target, ds, draft = run
    sf = shutil.copytree(draft, tmp_path / "specforge-style")
    cfg = json.loads((sf / "config.json").read_text())
    del cfg["head_dim"], cfg["target_hidden_size"]
    (sf / "config.json").write_text(json.dumps(cfg))
    assert load_draft(sf).config == load_draft(draft).config
    args = ["--target", str(target), "--dataset", str(ds), "--prompts", "0", "--no-profile"]
    assert (
        eval_json(capsys, "--draft", str(sf), *args)["offline"]
        == eval_json(capsys, "--draft", str(draft), *args)["offline"]
    )
    del cfg["hidden_size"]
    (sf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config\.json: hidden_size is None"):
        load_draft(sf)


def test_a_live_run_without_a_verify_step_reports_and_profiles_offline(run, capsys, tmp_path):
    # --max-new-tokens 1: every prompt ends at the prefill's token, so no verify step (accept length None). The text
    # report stopped on a TypeError formatting None, and the profile was refused although offline had a figure.
    _, target, ds, draft = run
    mine = shutil.copytree(draft, tmp_path / "draft")
    capsys.readouterr()
    argv = ["--draft", str(mine), "--target", str(target), "--dataset", str(ds), "--prompts", "2"]
    assert main(["eval-draft", *argv, "--max-new-tokens", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "no verify step: each of the 2 prompts ended at its first token" in out and "offline     accept length" in out
    )
    prof = read_profile(mine)
    assert prof["source"] == "offline" and prof["live"]["verify_steps"] == 0
    assert prof["accept_length"] == prof["offline"]["accept_length"] is not None


def test_nothing_to_measure_is_an_error_naming_the_dataset(run, capsys, tmp_path):
    # Held-out samples whose supervised tokens all lie past --max-length: no live prompt, no offline position.
    # eval-draft stopped on a TypeError traceback (formatting accept length None; with a profile, build_profile's
    # CheckpointError built without its path).
    _, target, ds, draft = run
    work = shutil.copytree(draft, tmp_path / "draft")
    for extra in ([], ["--no-profile"]):
        capsys.readouterr()
        args = ["--draft", str(work), "--target", str(target), "--dataset", str(ds), "--max-length", "4", *extra]
        assert main(["eval-draft", *args, "--threads", "1"]) == 2
        err = capsys.readouterr().err
        assert "IncompatibleDatasetError" in err and str(ds) in err and "--max-length" in err
    assert read_profile(work) == read_profile(draft), "no profile is written from nothing"
    with pytest.raises(InvalidArgumentError, match="needs a live or an offline measurement"):
        build_profile(num_steps=3, live=None, offline={"accept_length": None}, data={}, target={})
    # A dataset holding only samples the draft trained on: nothing held out (the record says so: a sample both
    # trained on and held out cannot be, and is refused by read_training_samples).
    rec = read_training_samples(draft)
    everything = rec["train_sample_ids"] + rec["held_out_sample_ids"]
    (work / "training_samples.json").write_text(
        json.dumps({**rec, "train_sample_ids": everything, "held_out_sample_ids": []})
    )
    capsys.readouterr()
    assert (
        main(["eval-draft", "--draft", str(work), "--target", str(target), "--dataset", str(ds), "--threads", "1"]) == 2
    )
    err = capsys.readouterr().err
    assert "IncompatibleDatasetError" in err and "held out" in err and str(ds) in err


def test_json_output_stays_json_when_check_serving_warns(run, capsys, tmp_path):
    # check-serving's warnings were printed to stdout ahead of --json's object: `eval-draft --json | jq` failed.
    _, target, ds, draft = run
    warned = shutil.copytree(draft, tmp_path / "warned")
    cfg = json.loads((warned / "config.json").read_text())
    (warned / "config.json").write_text(json.dumps({**cfg, "rope_theta": cfg["rope_theta"] * 2}))
    capsys.readouterr()
    args = ["--draft", str(warned), "--target", str(target), "--dataset", str(ds), "--prompts", "0", "--no-profile"]
    assert main(["eval-draft", *args, "--threads", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["offline"]["positions"] > 0 and "warning [draft-rope]" in err


@pytest.mark.parametrize("t2d", ["absent", "another size"])
def test_a_draft_whose_t2d_sglang_skips_is_absent_or_another_size_loads(run, capsys, tmp_path, t2d):
    # SGLang reads d2t only (hot_token_id = d2t + arange) and skips t2d; check-serving lets such a draft through
    # (t2d-size is a warning). eval-draft stopped on load_state_dict's RuntimeError traceback (missing key "t2d", or
    # a size mismatch).
    _, target, ds, draft = run
    other = shutil.copytree(draft, tmp_path / "t2d")
    for f in other.glob("*.safetensors"):
        state = {k: v for k, v in load_file(f).items() if k != "t2d"}
        if t2d == "another size" and "d2t" in state:
            state["t2d"] = torch.zeros(7, dtype=torch.bool)
        save_file(state, f)
    want, got = load_draft(draft), load_draft(other)
    assert torch.equal(got.t2d, want.t2d) and torch.equal(got.d2t, want.d2t)
    args = ["--target", str(target), "--dataset", str(ds), "--prompts", "1", "--max-new-tokens", "4", "--no-profile"]
    a, b = eval_json(capsys, "--draft", str(other), *args), eval_json(capsys, "--draft", str(draft), *args)
    assert (
        a["offline"] == b["offline"] and a["live"]["correct_drafts_histogram"] == b["live"]["correct_drafts_histogram"]
    )


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64}},
        {"rope_scaling": {"type": "linear", "factor": 4.0}},
        {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0}},
    ],
)  # fmt: skip
def test_a_rope_scaled_draft_is_refused_not_measured_unscaled(run, capsys, tmp_path, rope):
    # SGLang's llama_eagle3 draft applies its config's rope_scaling; the reference draft has plain RoPE only. A
    # Llama-3.1-style draft (rope_type llama3) was measured with unscaled frequencies (check-serving only warns
    # draft-rope when the target's scaling differs, and not at all when they agree), exit 0.
    _, target, ds, draft = run
    scaled = shutil.copytree(draft, tmp_path / "scaled")
    cfg = json.loads((scaled / "config.json").read_text())
    (scaled / "config.json").write_text(json.dumps({**cfg, **rope}))
    capsys.readouterr()
    args = ["--draft", str(scaled), "--target", str(target), "--dataset", str(ds), "--prompts", "0", "--no-profile"]
    assert main(["eval-draft", *args, "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "DraftMismatchError" in err and "draft-rope-scaling-unsupported" in err
    (scaled / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "default"}}))
    assert main(["eval-draft", *args, "--threads", "1"]) == 0


def test_a_draft_under_the_tensor_names_sglang_loads_is_the_same_draft(run, capsys, tmp_path):
    # SGLang's LlamaForCausalLMEagle3.load_weights takes layers.0.* (speculators' names) as well as midlayer.*, a
    # model. prefix, fused qkv_proj / gate_up_proj, and skips tensors it has no parameter for; check-serving passes
    # such a draft (tensor_problems resolves names the same way). eval-draft stopped on load_state_dict's
    # RuntimeError traceback (missing and unexpected keys).
    _, target, ds, draft = run
    renamed = shutil.copytree(draft, tmp_path / "renamed")
    state = load_file(renamed / "model.safetensors")
    new = {}
    for name, t in state.items():
        if name.startswith("midlayer."):
            name = "model.layers.0." + name[len("midlayer.") :]
        elif name == "fc.weight":
            name = "model.fc.weight"
        new[name] = t
    attn, mlp = "model.layers.0.self_attn.", "model.layers.0.mlp."
    new[attn + "qkv_proj.weight"] = torch.cat([new.pop(attn + f"{p}_proj.weight") for p in "qkv"])
    new[mlp + "gate_up_proj.weight"] = torch.cat([new.pop(mlp + "gate_proj.weight"), new.pop(mlp + "up_proj.weight")])
    new["verifier_lm_head.weight"] = torch.zeros(3, 2)  # no SGLang parameter: skipped by its loader
    save_file(new, renamed / "model.safetensors")
    want, got = load_draft(draft).state_dict(), load_draft(renamed).state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    args = ["--target", str(target), "--dataset", str(ds), "--prompts", "1", "--max-new-tokens", "4", "--no-profile"]
    a, b = eval_json(capsys, "--draft", str(renamed), *args), eval_json(capsys, "--draft", str(draft), *args)
    assert (
        a["offline"] == b["offline"] and a["live"]["correct_drafts_histogram"] == b["live"]["correct_drafts_histogram"]
    )


def test_without_a_source_dataset_only_the_dataset_trained_on_says_what_is_held_out():
    # Sample ids are the source file's record indexes: without a source_dataset on either side, ids of another
    # dataset name other conversations. They were taken as "recorded" (None == None), excluding unrelated samples.
    from types import SimpleNamespace
    from typing import ClassVar

    from eagle_io.spec.evaluate import held_out_positions

    class Data:
        metadata: ClassVar[dict] = {}

        def __len__(self):
            return 4

        def entry(self, p):
            return SimpleNamespace(sample_id=10 + p)

    rec = {"train_sample_ids": [10, 12], "dataset_sha256": "aa", "source_dataset": None}
    assert held_out_positions(Data(), rec, "aa") == (
        [1, 3],
        {"held_out": "recorded", "excluded": 2, "source_dataset": None},
    )
    assert held_out_positions(Data(), rec, "bb") == (
        [0, 1, 2, 3],
        {"held_out": "unknown", "excluded": 0, "source_dataset": None},
    )


def test_a_target_with_other_weights_under_the_same_name_is_refused_unless_allowed(run, capsys, tmp_path):
    # Issue 34 (one target identity): the dataset records the sha256 of its target's files; a target of the same
    # name and shapes with other weights was accepted.
    _, target, ds, draft = run
    other = shutil.copytree(target, tmp_path / "elsewhere" / target.name)
    state = load_file(other / "model.safetensors")
    name = next(k for k in state if k.endswith("input_layernorm.weight"))
    state[name] = state[name] * 1.5
    save_file(state, other / "model.safetensors", metadata={"format": "pt"})
    args = ["eval-draft", "--draft", str(draft), "--target", str(other), "--dataset", str(ds), "--prompts", "0"]
    capsys.readouterr()
    assert main([*args, "--no-profile", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "IncompatibleDatasetError" in err and "sha256 differ: model.safetensors" in err and str(ds) in err
    assert main([*args, "--no-profile", "--threads", "1", "--allow-other-target", "--json"]) == 0


def test_a_damaged_or_nonfinite_draft_is_refused_naming_the_file_or_tensor(run, capsys, tmp_path):
    # Issue 34: a model.safetensors whose header is intact but whose data is cut gave a traceback (kind 4); a draft
    # with NaN/Inf weights was measured without a word (kind 5).
    _, target, ds, draft = run
    args = ["--target", str(target), "--dataset", str(ds), "--prompts", "0", "--no-profile", "--threads", "1"]
    cut = shutil.copytree(draft, tmp_path / "cut")
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size - 1000])
    capsys.readouterr()
    assert main(["eval-draft", "--draft", str(cut), *args]) == 2
    err = capsys.readouterr().err
    assert "CheckpointError" in err and str(weights) in err and "damaged or truncated" in err
    assert "Traceback" not in err
    inf = shutil.copytree(draft, tmp_path / "inf")
    state = load_file(inf / "model.safetensors")
    name = next(k for k in state if k.endswith("o_proj.weight"))
    state[name][0, :3] = float("-inf")
    save_file(state, inf / "model.safetensors", metadata={"format": "pt"})
    assert main(["eval-draft", "--draft", str(inf), *args]) == 2
    err = capsys.readouterr().err
    assert "NaN/Inf" in err and f"{name} (3 of" in err
    with pytest.raises(CheckpointError, match="NaN/Inf"):
        load_draft(inf)


def test_a_profile_that_cannot_be_written_is_refused_before_the_target_loads(run, capsys, tmp_path):
    # issue 47, kind 6: speculation_profile.json goes beside the draft at the end; its write failed after the measure
    _, target, ds, draft = run
    work = shutil.copytree(draft, tmp_path / "draft")
    (work / "speculation_profile.json").unlink()
    (work / "speculation_profile.json").mkdir()
    args = ["eval-draft", "--draft", str(work), "--target", str(target), "--dataset", str(ds), "--threads", "1"]
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert err.strip() == (
        f"eagle-io eval-draft: InvalidArgumentError: the draft's profile (--no-profile: none) "
        f"{work / 'speculation_profile.json'}: is a directory; pass the name of the file to write"
    )
    assert out == ""  # nothing measured
    assert main([*args, "--no-profile"]) == 0  # measured, no profile asked for
