"""eagle_io.capture and `eagle-io generate`: states stored per sample, resume, rank split,
non-finite policy; end to end on a tiny random Llama and (slow) on the real SmolLM2 + ShareGPT."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import checks
from helpers.tiny_model import tiny_llama_config

import eagle_io
from eagle_io.cli import generate_cmd, main

FIXTURE = Path(__file__).parent / "fixtures" / "data" / "sharegpt_real_slice.json"


def tiny_target(vocab: int = 512, layers: int = 8, hidden: int = 64):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = tiny_llama_config(vocab, hidden, layers)
    model = LlamaForCausalLM(cfg).eval()
    info = {
        "model_id": "tiny",
        "architecture": "LlamaForCausalLM",
        "num_layers": layers,
        "hidden_size": hidden,
        "vocab_size": vocab,
    }
    return model, info


def samples(lengths, vocab=512, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [
        SimpleNamespace(
            index=i,
            id=f"c{i}",
            input_ids=torch.randint(0, vocab, (n,), generator=g),
            loss_mask=(torch.arange(n) % 3 == 0).long(),
        )
        for i, n in enumerate(lengths)
    ]


def stored(root) -> dict[int, dict]:
    ds = eagle_io.Dataset(root)
    return {item["sample_id"]: item for item in (ds[p] for p in range(len(ds)))}


def test_capture_stores_each_sample_unpadded_with_metadata(tmp_path):
    model, info = tiny_target()
    batch = samples([7, 7, 7, 7])
    with eagle_io.capture(model, tmp_path / "b", target_info=info, threads=1) as cap:
        cap.submit(batch)
    assert isinstance(cap, eagle_io.Capture) and cap.merge_warnings is None and cap.upload_report is None
    assert cap.forward_seconds > 0 and cap.stats()["samples"] == 4 and cap.counts["written"] == 4
    for s in batch:  # one forward per sample: the reference
        with eagle_io.capture(model, tmp_path / f"s{s.index}", target_info=info, threads=1) as cap:
            cap.submit([s])
    with eagle_io.capture(model, tmp_path / "again", target_info=info, threads=1) as cap:
        cap.submit(batch)  # the same batch again: the one case where bit-identity is guaranteed
    got, again = stored(tmp_path / "b"), stored(tmp_path / "again")
    for s in batch:
        alone = stored(tmp_path / f"s{s.index}")[s.index]
        item = got[s.index]
        assert torch.equal(item["input_ids"], s.input_ids)
        assert torch.equal(item["loss_mask"], s.loss_mask.to(torch.uint8))
        for name in ("aux_hidden_states", "hidden_states"):
            assert checks.same(item[name], again[s.index][name]), (s.index, name)
            # Alone vs in a batch of 4: CPU kernels are not batch-invariant, so within one bf16 ulp.
            assert checks.within_one_bf16_ulp(item[name], alone[name]), (s.index, name)
    meta = eagle_io.Dataset(tmp_path / "b").metadata
    assert meta["aux_layer_ids"] == [2, 4, 5] and meta["hidden_states_post_norm"] is True
    assert meta["aux_layer_convention"].startswith("input of 0-based decoder layer i")
    assert got[0]["aux_hidden_states"].shape == (7, 3 * 64) and got[0]["hidden_states"].dtype == torch.bfloat16


def test_padded_batch_matches_single_within_one_bf16_ulp(tmp_path):
    model, info = tiny_target()
    batch = samples([3, 11, 6, 9])
    with eagle_io.capture(model, tmp_path / "b", target_info=info, threads=1) as cap:
        cap.submit(batch)
    with eagle_io.capture(model, tmp_path / "s", target_info=info, threads=1) as cap:
        for s in batch:
            cap.submit([s])
    got, alone = stored(tmp_path / "b"), stored(tmp_path / "s")
    for s in batch:
        a, b = got[s.index]["aux_hidden_states"], alone[s.index]["aux_hidden_states"]
        assert a.shape == (len(s.input_ids), 192), "padding is never stored"
        # Attention over a padded length reduces in another order: at most one bf16 ulp (2^-7 relative).
        assert checks.within_one_bf16_ulp(a, b)


def test_resume_skips_committed_samples(tmp_path):
    model, info = tiny_target()
    batch = samples([5, 6, 7, 8, 9, 10])
    with eagle_io.capture(model, tmp_path, target_info=info, threads=1) as cap:
        cap.submit(batch[:3])
    with eagle_io.capture(model, tmp_path, target_info=info, threads=1, resume=True) as cap:
        assert cap.done == {0, 1, 2}
        cap.submit(batch)
        assert cap.counts["already_done"] == 3 and cap.counts["written"] == 3
    assert sorted(stored(tmp_path)) == list(range(6))


def test_bad_batches_are_refused_before_the_forward_and_lists_are_accepted(tmp_path):
    """Float token ids used to be truncated into the forward and the shards; an id twice in a batch lost its second
    sample as "already_done"; a non-str id failed after the forward; list ids raised a TypeError."""
    from eagle_io.errors import ArgumentTypeError

    model, info = tiny_target()
    a, b = samples([4, 5])
    with eagle_io.capture(model, tmp_path, target_info=info, threads=1) as cap:
        floats = SimpleNamespace(index=7, id=None, input_ids=torch.tensor([1.7, 2.2]), loss_mask=torch.ones(2))
        with pytest.raises(eagle_io.SchemaError, match="sample 7: its input_ids are float32, not integers"):
            cap.submit([a, floats])
        with pytest.raises(eagle_io.SchemaError, match="sample 1: it appears twice in this batch"):
            cap.submit(
                [a, b, SimpleNamespace(**{**vars(b), "input_ids": b.input_ids[:3], "loss_mask": b.loss_mask[:3]})]
            )
        with pytest.raises(ArgumentTypeError, match=r"sample 1: its id .* must be a str or None, not int"):
            cap.submit([a, SimpleNamespace(**{**vars(b), "id": 12})])
        assert cap.counts["written"] == 0, "nothing of a refused batch is written"
        cap.submit([a, SimpleNamespace(**{**vars(b), "input_ids": b.input_ids.tolist(), "loss_mask": [1, 0, 0, 1, 0]})])
    got = stored(tmp_path)
    assert sorted(got) == [0, 1] and got[1]["input_ids"].tolist() == b.input_ids.tolist()
    assert got[1]["loss_mask"].tolist() == [1, 0, 0, 1, 0]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"state_dtype": torch.int8}, "states are stored as one of bfloat16, float16, float32"),
        ({"target_info": {"num_layers": 8, "vocab_size": 512}}, r"target_info\['hidden_size'\] .* it lacks it"),
        ({"target_info": {"num_layers": 8, "hidden_size": 0, "vocab_size": 512}}, "it holds 0"),
        ({"ring_bytes": -5}, "ring_bytes must be an integer >= 1"),  # OverflowError, after the writer was created
        ({"ring_bytes": 0}, "ring_bytes must be an integer >= 1"),  # every sample then "did not fit"
        ({"timeout_s": float("nan")}, "timeout_s must be a number"),
    ],
)
def test_capture_options_are_refused_before_a_dataset_is_created(tmp_path, options, match):
    model, info = tiny_target()
    with pytest.raises(eagle_io.InvalidArgumentError, match=match):
        eagle_io.capture(model, tmp_path / "d", **{"target_info": info, **options})
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_nonfinite_states_raise_or_skip_and_count(tmp_path, policy):
    model, info = tiny_target()
    batch = samples([6, 6, 6])

    def poison(module, args, output):  # a NaN in sample 1's final state at token row 4
        output[1, 4, 0] = float("nan")

    model.model.norm.register_forward_hook(poison)
    cap = eagle_io.capture(model, tmp_path, target_info=info, threads=1, nonfinite=policy)
    with cap:
        if policy == "raise":
            with pytest.raises(eagle_io.NonFiniteStatesError, match="sample 1: NaN/Inf") as e:
                cap.submit(batch)
            assert (e.value.sample_id, e.value.row) == (1, 4)
        else:
            cap.submit(batch)
            assert cap.counts["nonfinite_skipped"] == 1
    assert 1 not in stored(tmp_path) and 0 in stored(tmp_path)


def test_rank_split_is_disjoint_and_complete():
    items = [SimpleNamespace(index=i) for i in range(103)]
    shares = [[c.index for c in generate_cmd._mine(iter(items), r, 4)] for r in range(4)]
    flat = sorted(i for s in shares for i in s)
    assert flat == list(range(103)) and all(len(set(a) & set(b)) == 0 for a in shares for b in shares if a is not b)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama saved as an HF directory with SmolLM2's real tokenizer and chat template."""
    from eagle_io.data import load_default_tokenizer

    tok = load_default_tokenizer()
    model, _ = tiny_target(vocab=len(tok))
    d = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_generate_cli_then_resume_then_verify(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    base = [
        "generate",
        "--model",
        str(tiny_model_dir),
        "--dataset",
        str(FIXTURE),
        "--out",
        str(out),
        "--max-length",
        "256",
        "--batch-size",
        "3",
        "--threads",
        "1",
    ]
    assert main([*base, "--limit", "6"]) == 0
    first = stored(out)
    assert main([*base, "--limit", "21", "--resume", "--summary-json", str(tmp_path / "s.json")]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    after = stored(out)
    assert set(first) <= set(after) and len(after) == summary["samples_written"] + len(first)
    assert summary["records_skipped"], "the real slice holds records that are skipped and counted"
    assert sum(summary["records_skipped"].values()) + len(after) == 21
    ds = eagle_io.Dataset(out)
    assert ds.entry(0).key  # the source record's id is carried
    assert main(["verify", str(out)]) == 0
    assert "verified" in capsys.readouterr().out


def test_drop_when_full_goes_from_the_command_line_to_the_capture_options(tiny_model_dir):
    """``generate --drop-when-full`` / ``--no-drop-when-full`` reach the capture's options; left out, the default of
    eagle_io.defaults (the ring's own, _native.DEFAULTS)."""
    from transformers import AutoTokenizer

    from eagle_io import _native, defaults
    from eagle_io.cli import build_parser

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert defaults.DROP_WHEN_FULL is _native.DEFAULTS["drop_when_full"] is False
    for flags, want in (([], False), (["--drop-when-full"], True), (["--no-drop-when-full"], False)):
        args = build_parser().parse_args(["generate", "--out", "unused", *flags])
        args.remote = None  # run() sets it (the --out URL, or None)
        assert generate_cmd._capture_options(args, "d.json", None, {}, tok).drop_when_full is want, flags


@pytest.mark.slow
def test_generate_on_the_embedded_real_model_and_sharegpt(tmp_path, capsys):
    out = tmp_path / "real"
    args = [
        "generate",
        "--out",
        str(out),
        "--limit",
        "6",
        "--max-length",
        "256",
        "--batch-size",
        "3",
        "--skip-bad-records",
        "--summary-json",
        str(tmp_path / "s.json"),
    ]
    assert main(args) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["samples_written"] >= 4 and 1.3 < summary["ratio"] < 2.0
    ds = eagle_io.Dataset(out)
    assert ds.metadata["num_layers"] == 30 and ds.metadata["aux_layer_ids"] == [2, 15, 27]
    assert ds[0]["aux_hidden_states"].shape[1] == 3 * 576
    assert main(["verify", str(out)]) == 0
