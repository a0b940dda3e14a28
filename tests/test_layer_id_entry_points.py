"""Every entry point that takes aux layer ids refuses ids outside the target's range with one clear message and no
traceback: `generate --aux-layer-ids` (HF and SGLang backends), `import-specforge` (ids, default ids of a small
target, and the stored aux width against the recorded ids), `check-serving --trained-layer-ids` (in
test_serving_layer_checks)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.tiny_model import build_tiny_model_dir
from test_specforge import write_like_specforge

import eagle_io
from conftest import make_sample
from eagle_io.capturing.options import CaptureOptions
from eagle_io.capturing.sglang.launch import capture_layer_args
from eagle_io.cli import main
from eagle_io.interop.specforge import import_specforge


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "m", layers=8)


def test_generate_bad_id_syntax_is_one_argparse_error_not_a_traceback(tmp_path):
    cmd = [sys.executable, "-m", "eagle_io.cli", "generate", "--out", str(tmp_path / "o"), "--aux-layer-ids", "2,x"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "argument --aux-layer-ids: expected comma-separated integers, got '2,x'" in r.stderr


@pytest.mark.parametrize("text", ["2,,5", ",2,5", "2,5,", " , "])
def test_layer_ids_arg_refuses_an_empty_item(text):
    """`--aux-layer-ids 2,,5` (a dropped id) used to be read as [2, 5]: a 2-layer capture from a typo."""
    import argparse

    from eagle_io.cli.layer_ids_arg import layer_ids_arg

    with pytest.raises(argparse.ArgumentTypeError, match="empty item"):
        layer_ids_arg(text)
    assert layer_ids_arg(" 2, 5 ,7") == [2, 5, 7]


def test_attach_id_lists_only_joins_dashed_id_lists():
    from eagle_io.cli.layer_ids_arg import attach_id_lists

    argv = [
        "check-serving",
        "--trained-layer-ids",
        "-1, 2,3",
        "--aux-layer-ids",
        "-3",
        "--out",
        "-x",
        "--aux-layer-ids",
    ]
    assert attach_id_lists(argv) == [
        "check-serving", "--trained-layer-ids=-1, 2,3", "--aux-layer-ids=-3", "--out", "-x", "--aux-layer-ids",
    ]  # fmt: skip
    assert attach_id_lists(["--aux-layer-ids", "--out", "x"]) == ["--aux-layer-ids", "--out", "x"]


@pytest.mark.parametrize("bad", ["-1,3,5", "0,3,5", "2,5,9", "5,3"])
@pytest.mark.parametrize("form", ["attached", "separate"])
def test_generate_hf_refuses_ids_outside_the_target(tiny, tmp_path, capsys, bad, form):
    """`--aux-layer-ids -1,3,5` (separate) used to stop in argparse with 'expected one argument'."""
    argv = ["generate", "--model", str(tiny), "--out", str(tmp_path / "o"), "--limit", "1"]
    ids = [f"--aux-layer-ids={bad}"] if form == "attached" else ["--aux-layer-ids", bad]
    assert main([*argv, *ids]) == 2
    err = capsys.readouterr().err  # (transformers' weight-loading progress bar also writes to stderr)
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("eagle-io generate: InvalidArgumentError")
    assert "aux layer id" in err.strip().splitlines()[-1]


def test_generate_sglang_checks_ids_before_launching(tiny, tmp_path, capsys):
    """A Llama target's SGLang forward cannot capture id N = 8: refused before any engine starts (it used to launch
    and fail inside the scheduler)."""
    argv = ["generate", "--backend", "sglang", "--model", str(tiny), "--out", str(tmp_path / "o"), "--limit", "1"]
    assert main([*argv, "--aux-layer-ids", "2,5,8"]) == 2
    err = capsys.readouterr().err
    assert "aux layer id 8 out of range" in err and "final pre-norm output is not captured on this path" in err
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_capture_layer_args_follow_the_targets_setter(tiny, tmp_path):
    assert capture_layer_args(tiny, CaptureOptions(), {}) == {}
    assert capture_layer_args(tiny, CaptureOptions(aux_layer_ids=[2, 4, 5]), {}) == {
        "return_aux_hidden_state_layer_ids": [1, 3, 4]
    }
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    cfg = json.loads((tiny / "config.json").read_text())
    (gpt / "config.json").write_text(json.dumps({**cfg, "architectures": ["GptOssForCausalLM"]}))
    # gpt-oss captures the final boundary; [1, 4, 7] passes SGLang's id < num_layers check and its setter (+1 when
    # the largest id is not N) turns it into [2, 5, 8]
    assert capture_layer_args(gpt, CaptureOptions(aux_layer_ids=[2, 5, 8]), {}) == {
        "return_aux_hidden_state_layer_ids": [1, 4, 7]
    }
    with pytest.raises(eagle_io.InvalidArgumentError, match="contradicts aux_layer_ids"):
        capture_layer_args(
            tiny, CaptureOptions(aux_layer_ids=[2, 4, 5]), {"return_aux_hidden_state_layer_ids": [2, 4, 5]}
        )


def _sf(tmp_path, k=3, n=3):
    for i in range(n):
        write_like_specforge(tmp_path / "sf", i, make_sample(100 + i, 6, k=k))
    return tmp_path / "sf"


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--num-layers", "4"], "SpecForge's default [1, N//2-1, N-4] for N = 4 = [1, 1, 0]"),
        (["--num-layers", "36", "--specforge-aux-layer-ids=-2,5,40"], "aux layer id -1 out of range"),
        (["--num-layers", "36", "--specforge-aux-layer-ids=1,17,36"], "aux layer id 37 out of range"),
        (["--specforge-aux-layer-ids=1,17,32"], "needs --num-layers"),
        (["--num-layers", "30", "--specforge-aux-layer-ids=1,9,17,26"], "name 4 layers, but the SpecForge files"),
    ],
)
def test_import_specforge_refuses_ids_the_target_or_the_files_cannot_have(tmp_path, capsys, extra, match):
    sf = _sf(tmp_path)
    assert main(["import-specforge", str(sf), "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_import_specforge_records_ids_that_match_the_stored_width(tmp_path):
    sf = _sf(tmp_path, k=2)
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"name 3 layers.*64 wide = 2 x hidden 32"):
        import_specforge(sf, tmp_path / "a", metadata={"aux_layer_ids": [2, 15, 27]}, threads=1)
    s = import_specforge(sf, tmp_path / "b", metadata={"aux_layer_ids": [2, 27], "num_layers": 30}, threads=1)
    assert s.imported == 3 and eagle_io.Dataset(tmp_path / "b").metadata["aux_layer_ids"] == [2, 27]
    # DeepSeek-style target: SpecForge's ids [3, 9, 20] are captured unchanged (first id is not 1)
    argv = ["import-specforge", str(_sf(tmp_path / "c")), "--out", str(tmp_path / "c" / "out"), "--num-layers", "30"]
    assert main([*argv, "--specforge-aux-layer-ids", "3,9,20", "--target-architecture", "DeepseekV3ForCausalLM"]) == 0
    meta = eagle_io.Dataset(tmp_path / "c" / "out").metadata
    assert meta["aux_layer_ids"] == [3, 9, 20] and meta["target_model"]["architecture"] == "DeepseekV3ForCausalLM"


@pytest.mark.slow
def test_generate_sglang_captures_explicit_ids_like_the_hf_path(tiny, tmp_path):
    """`generate --backend sglang --aux-layer-ids 1,3,6` on a real CPU Engine: the ids reach SGLang as
    return_aux_hidden_state_layer_ids [0, 2, 5] (Llama's +1 setter) and the stored states are the HF path's for
    [1, 3, 6] (bf16 forward vs float32: within 3% of the max), not those of the neighbouring layers."""
    from helpers.sglang_cpu import cpu_engine_env
    from test_serving_plugin import SGLANG_SKIP
    from test_sglang_generate import CPU_ENGINE, FIXTURE

    if SGLANG_SKIP:
        pytest.skip(SGLANG_SKIP)
    common = ["--model", str(tiny), "--dataset", str(FIXTURE), "--max-length", "128", "--limit", "3", "--threads", "1"]
    sg = tmp_path / "sg"
    cmd = [sys.executable, "-m", "eagle_io.cli", "generate", *common, "--out", str(sg), "--backend", "sglang"]
    cmd += ["--aux-layer-ids", "1,3,6", *[a for kv in CPU_ENGINE for a in ("--sglang-arg", kv)]]
    r = subprocess.run(cmd, capture_output=True, text=True, env=cpu_engine_env(), timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert main(["generate", *common, "--out", str(tmp_path / "hf"), "--aux-layer-ids", "1,3,6"]) == 0
    assert main(["generate", *common, "--out", str(tmp_path / "hf2"), "--aux-layer-ids", "2,4,7"]) == 0
    a, b, c = (eagle_io.Dataset(tmp_path / d) for d in ("sg", "hf", "hf2"))
    assert a.metadata["aux_layer_ids"] == b.metadata["aux_layer_ids"] == [1, 3, 6]
    assert a.metadata["final_state_is_prenorm"] is False and len(a) == len(b) > 0
    for pos in range(len(b)):
        sid = b.entry(pos).sample_id
        x, y, z = a[a.position(sid)], b[pos], c[c.position(sid)]
        ref = y["aux_hidden_states"].float()
        err = (x["aux_hidden_states"].float() - ref).abs().max() / ref.abs().max()
        other = (z["aux_hidden_states"].float() - ref).abs().max() / ref.abs().max()
        assert err <= 0.03 < other, (sid, float(err), float(other))
