"""Every knob has a bound (issue 34, kind 1), and nothing is written before the options are checked (kind 4): the
train-draft settings (TTT length and draft steps against --max-length), eval-draft's draft steps (against
--max-new-tokens and the data) and SGLang's tree knobs, check-serving's tree knobs as SGLang can serve them, the
Loader's prefetch (against the batches and the memory available); a dataset whose capture has committed nothing yet
is named as such by train-draft and eval-draft."""

from __future__ import annotations

import time

import pytest
import torch

import eagle_io
from conftest import write_samples
from eagle_io.cli import main
from eagle_io.draft import TrainConfig
from eagle_io.errors import InvalidArgumentError
from eagle_io.feed import Loader, ShardDataset
from eagle_io.sglang.spec_params import max_draft_tokens, speculative_param_problems


def _dataset(root, n: int, *, tokens: int = 6, complete: bool = True, hidden: int = 8):
    meta = {"hidden_size": hidden, "vocab_size": 100, "num_layers": 8, "aux_layer_ids": [2, 4, 5]}
    w = eagle_io.ShardWriter(root, eagle_io.eagle3_schema(hidden), meta, threads=1)
    for i in range(n):
        w.write(
            i,
            {
                "input_ids": torch.arange(tokens),
                "loss_mask": torch.ones(tokens, dtype=torch.uint8),
                "aux_hidden_states": torch.randn(tokens, 3 * hidden).to(torch.bfloat16),
                "hidden_states": torch.randn(tokens, hidden).to(torch.bfloat16),
            },
        )
    w.close(complete=complete)
    return root


def _refused(capsys, *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 2
    return capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- train-draft


@pytest.mark.parametrize(
    ("option", "value", "text"),
    [
        ("--ttt-length", "64", "--ttt-length 64 (must be an integer in [1, 31]"),
        ("--accept-steps", "40", "--accept-steps 40 (must be an integer in [0, 31]"),
        ("--ttt-length", "0", "--ttt-length 0 (must be an integer in [1, 31]"),
        ("--batch-size", "0", "--batch-size 0 (must be an integer >= 1)"),
        ("--lr", "nan", "--lr nan (must be a finite number > 0)"),
    ],
)
def test_train_draft_bounds_are_checked_before_anything_is_read_or_written(tmp_path, capsys, option, value, text):
    out = tmp_path / "out"
    err = _refused(
        capsys, "train-draft", str(tmp_path / "no-dataset"), "--out", str(out), "--max-length", "32", option, value
    )
    assert "InvalidArgumentError" in err and text in err
    assert not out.exists(), "nothing written before the options were checked"


def test_train_config_bounds_the_unroll_by_its_sequence_length():
    TrainConfig(seq_length=8, ttt_length=7, accept_steps=7)
    with pytest.raises(InvalidArgumentError, match=r"--ttt-length 8 .*\[1, 7\]"):
        TrainConfig(seq_length=8, ttt_length=8)
    with pytest.raises(InvalidArgumentError, match=r"--max-length 1 \(must be an integer >= 2"):
        TrainConfig(seq_length=1)


def test_train_draft_on_a_capture_with_nothing_committed_says_so_and_writes_nothing(tmp_path, capsys):
    ds, out = _dataset(tmp_path / "running", 0, complete=False), tmp_path / "out"
    err = _refused(capsys, "train-draft", str(ds), "--out", str(out), "--threads", "1")
    assert "holds 0" in err and "not marked complete" in err and "cannot hold out" not in err
    assert not out.exists()
    # one sample of a completed capture: too few to hold one out and train on another, said before the vocab map
    one = _dataset(tmp_path / "one", 1)
    err = _refused(capsys, "train-draft", str(one), "--out", str(out), "--threads", "1")
    assert "needs at least 2" in err and "holds 1" in err and "completed" in err
    assert not out.exists()


# ------------------------------------------------------------------------------------------------- eval-draft


def test_eval_draft_steps_are_bounded_by_the_tokens_generated_and_the_data(tmp_path, capsys):
    ds = _dataset(tmp_path / "ds", 2, tokens=5)
    base = ["eval-draft", "--draft", str(tmp_path / "no-draft"), "--dataset", str(ds), "--threads", "1"]
    t0 = time.monotonic()
    err = _refused(capsys, *base, "--num-steps", "500", "--max-new-tokens", "16")
    assert "--num-steps 500" in err and "--max-new-tokens 16" in err and "at most 15" in err
    # offline only: bounded by the longest sample (5 tokens)
    err = _refused(capsys, *base, "--prompts", "0", "--num-steps", "9")
    assert "the longest sample" in err and "has 5 tokens" in err and "at most 4" in err
    # SGLang's tree bounds, before an engine could start
    err = _refused(capsys, *base, "--engine", "sglang", "--speculative-eagle-topk", "-2")
    assert "--speculative-eagle-topk -2: must be an integer >= 1" in err
    err = _refused(
        capsys, *base, "--engine", "sglang", "--num-steps", "2", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "40",
    )  # fmt: skip
    assert "at most 7 tokens" in err
    assert time.monotonic() - t0 < 20, "refused at once, not after loading or decoding"


def test_eval_draft_on_a_capture_with_nothing_committed_says_so(tmp_path, capsys):
    ds = _dataset(tmp_path / "running", 0, complete=False)
    err = _refused(capsys, "eval-draft", "--draft", str(tmp_path / "d"), "--dataset", str(ds), "--prompts", "0")
    assert "holds 0" in err and "not marked complete" in err and "trained on all" not in err


def test_speculative_param_bounds():
    assert max_draft_tokens(3, 1) == 4 and max_draft_tokens(3, 4) == 4 + 2 * 16 + 1
    assert speculative_param_problems(3, 1, 4) == []
    assert speculative_param_problems(None, None, None) == []
    (p,) = speculative_param_problems(4, 0, None)
    assert "topk 0" in p
    (p,) = speculative_param_problems(3, 8, None, draft_vocab_size=4)
    assert "more than the draft's 4 vocabulary entries" in p
    (p,) = speculative_param_problems(2048, 1, None, context_length=2048)
    assert "below the context length 2048" in p
    (p,) = speculative_param_problems(2, 3, 1)
    assert "must be an integer >= 2" in p


# ------------------------------------------------------------------------------------------------- check-serving


def test_check_serving_refuses_tree_knobs_sglang_cannot_serve(tmp_path):
    from test_serving_preflight import eagle3_draft, llama_target

    from eagle_io.serving import check_serving

    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    ok = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16"]
    assert check_serving(t, d, algorithm="EAGLE3", server_args=ok) == []
    for bad, text in (
        (["--speculative-eagle-topk", "-3"], "--speculative-eagle-topk -3: must be an integer >= 1"),
        (["--speculative-eagle-topk", "501"], "more than the draft's 500 vocabulary entries"),
        (["--speculative-num-steps", "2", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "9"],
         "at most 7 tokens"),
        (["--speculative-num-steps", "0"], "--speculative-num-steps 0: must be an integer >= 1"),
    ):  # fmt: skip
        fs = [f for f in check_serving(t, d, algorithm="EAGLE3", server_args=bad) if f.code == "speculative-params"]
        assert len(fs) == 1 and fs[0].severity == "error" and text in fs[0].message, (bad, fs)


# ------------------------------------------------------------------------------------------------- the Loader


def test_loader_prefetch_is_bounded_by_the_batches(tmp_path):
    root = tmp_path / "ds"
    write_samples(root, 0, [3, 5, 7, 2, 4, 6, 8, 1, 9], 8)
    t0 = time.monotonic()
    loader = Loader(ShardDataset(root), batch_size=4, prefetch=2**45, keep=2**40)
    assert (loader.prefetch, loader.keep) == (3, 3) and len(loader) == 3
    assert sum(len(b["sample_ids"]) for b in loader) == 9
    assert time.monotonic() - t0 < 10


def test_loader_prefetch_beyond_memory_is_refused_with_the_figures(tmp_path):
    root = tmp_path / "ds"
    write_samples(root, 0, [3, 5], 8)
    with pytest.raises(InvalidArgumentError, match=r"batch buffers .* need about [\d,]+ bytes, more than the"):
        Loader(ShardDataset(root, follow=True, timeout_s=1), batch_size=2, prefetch=2**45)


# ------------------------------------------------------------------------------------------------- generate


@pytest.mark.parametrize(
    ("more", "text"),
    [
        (["--batch-size", "0"], "--batch-size 0 (must be >= 1)"),
        (["--limit", "-3"], "--limit -3 (must be >= 1"),
        (["--threads", "-2", "--shard-bytes", "0"], "--shard-bytes 0 (must be >= 1); --threads -2 (must be >= 0)"),
        (["--regenerate", "--temperature", "nan"], "--temperature nan (must be a finite number >= 0)"),
        (["--ring-bytes", str(10**16)], "the capture ring is allocated at once, and only"),
    ],
)
def test_generate_checks_every_number_before_anything_is_loaded_or_written(tmp_path, capsys, more, text):
    out = tmp_path / "run"
    err = _refused(capsys, "generate", "--model", str(tmp_path / "no-model"), "--out", str(out), *more)
    assert "InvalidArgumentError" in err and text in err
    assert not out.exists()


def test_the_capture_ring_is_refused_past_the_memory_available_by_the_process_that_allocates_it(tmp_path):
    """The options travel to the process that allocates the ring (an SGLang scheduler, for a server capture), which
    judges them against its own memory; the client's machine does not. Refused before anything is written."""
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.store import SampleStore

    huge = CaptureOptions(ring_bytes=10**18 // 1000, target_info={"num_layers": 8, "hidden_size": 8, "vocab_size": 9})
    with pytest.raises(InvalidArgumentError, match=r"ring_bytes 1,000,000,000,000,000 \(1,000.00 TB\)"):
        SampleStore.create(tmp_path / "d", huge, aux_layer_ids=[2, 4, 5])
    assert not (tmp_path / "d").exists()


def test_a_draft_too_large_for_the_memory_is_refused_with_the_figures_before_it_is_built(tmp_path):
    from test_train_draft import write_synthetic

    from eagle_io.draft import train_draft
    from eagle_io.interop.vocab import build_vocab_mapping

    root = tmp_path / "syn"
    head = write_synthetic(root, 4, 8)
    cfg = TrainConfig(steps=1, eval_samples=1, intermediate_size=10**12, threads=1)
    t0 = time.monotonic()
    with pytest.raises(InvalidArgumentError, match=r"the draft would need about [\d,.]+ TB to train .* intermediate"):
        train_draft(root, head, build_vocab_mapping(root, 16), cfg, log=None)
    assert time.monotonic() - t0 < 10
