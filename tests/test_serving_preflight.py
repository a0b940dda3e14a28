"""`eagle-io check-serving` / `eagle_io.serving.check_serving` on real-looking checkpoint directories.

Each directory is a config.json plus a real safetensors file written by the `safetensors` library; only the
header is read by the check. The Kimi-K2.5-shaped case uses the real widths (hidden 7168, 61 layers, 3 x 7168 =
21504 fc input) with a small first dimension: the check reads shapes, not values.
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.sparse_safetensors import write_safetensors
from safetensors import safe_open
from safetensors.torch import save_file

import eagle_io
from eagle_io.cli import COMMANDS, check_serving_cmd
from eagle_io.serving import check_serving, format_findings, read_draft, read_safetensors_header
from eagle_io.sglang.checkpoint import CheckpointError
from eagle_io.sglang.compat import resolve_algorithm
from eagle_io.sglang.draft_build import draft_build
from eagle_io.sglang.launch_args import launch_args
from eagle_io.sglang.setters import explicit_ids_for, served_aux_layer_ids
from eagle_io.store.metadata import eagle3_metadata

H, N, V = 64, 8, 1000  # tiny Llama target: hidden, layers, vocab


def llama_target(root: Path, *, hidden: int = H, layers: int = N, vocab: int = V, max_pos: int = 4096) -> Path:
    d = root / "target"
    d.mkdir(parents=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
    }
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def eagle3_draft(
    root: Path,
    *,
    fc_in: int | None = 3 * H,
    hidden: int = H,
    arch: str = "LlamaForCausalLMEagle3",
    eagle_ids: list[int] | None = None,
    top_level_ids: list[int] | None = None,
    draft_vocab: int | None = 500,
    d2t: int | None = 500,
    lm_head_rows: int | None = 500,
    target_hidden: int | None = H,
    vocab: int = V,
    max_pos: int = 4096,
    name: str = "draft",
    fc_rows: int | None = None,
    extra_config: dict | None = None,
    extra_tensors: dict | None = None,
    drop: tuple[str, ...] = (),
    d2t_values: torch.Tensor | None = None,
) -> Path:
    """An EAGLE-3 draft directory in SpecForge's layout: every tensor SGLang's LlamaForCausalLMEagle3 loads
    (fc, midlayer attention/MLP/norms, norm, lm_head) with real shapes (sparse: large tensors cost no disk), and a
    consistent vocab map (d2t = 0: draft id i -> target id i; t2d True there)."""
    d = root / name
    d.mkdir(parents=True)
    heads, kv = 4, 2
    hd, inter = hidden // heads, 2 * hidden
    cfg: dict = {
        "architectures": [arch],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
    }
    if draft_vocab is not None:
        cfg["draft_vocab_size"] = draft_vocab
    if target_hidden is not None:
        cfg["target_hidden_size"] = target_hidden
    if eagle_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": eagle_ids, "use_aux_hidden_state": True}
    if top_level_ids is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top_level_ids
    cfg.update(extra_config or {})
    (d / "config.json").write_text(json.dumps(cfg))
    bf = "BF16"
    t: dict = {
        "midlayer.self_attn.q_proj.weight": (bf, (heads * hd, 2 * hidden)),
        "midlayer.self_attn.k_proj.weight": (bf, (kv * hd, 2 * hidden)),
        "midlayer.self_attn.v_proj.weight": (bf, (kv * hd, 2 * hidden)),
        "midlayer.self_attn.o_proj.weight": (bf, (hidden, heads * hd)),
        "midlayer.mlp.gate_proj.weight": (bf, (inter, hidden)),
        "midlayer.mlp.up_proj.weight": (bf, (inter, hidden)),
        "midlayer.mlp.down_proj.weight": (bf, (hidden, inter)),
        "midlayer.input_layernorm.weight": (bf, (hidden,)),
        "midlayer.hidden_norm.weight": (bf, (hidden,)),
        "midlayer.post_attention_layernorm.weight": (bf, (hidden,)),
        "norm.weight": (bf, (hidden,)),
    }
    if fc_in is not None:
        t["fc.weight"] = (bf, (fc_rows if fc_rows is not None else hidden, fc_in))
    if d2t is not None:
        t["d2t"] = d2t_values if d2t_values is not None else torch.zeros(d2t, dtype=torch.int64)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[: min(d2t, vocab)] = True
        t["t2d"] = t2d
    if lm_head_rows is not None:
        t["lm_head.weight"] = (bf, (lm_head_rows, hidden))
    t.update(extra_tensors or {})
    for k in drop:
        t.pop(k)
    write_safetensors(d / "model.safetensors", t)
    return d


def issues(findings) -> dict[str, str]:
    """Codes of the errors and warnings (info findings left out)."""
    return {f.code: f.severity for f in findings if f.severity != "info"}


def eagle1_draft(root: Path) -> Path:
    """An EAGLE-1/2 draft: fc over cat(embedding, hidden) = [H, 2H], no EAGLE-3 keys."""
    d = root / "eagle1"
    d.mkdir(parents=True)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle"],
        "hidden_size": H,
        "num_hidden_layers": 1,
        "vocab_size": V,
        "max_position_embeddings": 4096,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    save_file({"fc.weight": torch.zeros(H, 2 * H, dtype=torch.bfloat16)}, str(d / "model.safetensors"))
    return d


def codes(findings) -> dict[str, str]:
    return {f.code: f.severity for f in findings}


def by_code(findings, code):
    (f,) = [f for f in findings if f.code == code]
    return f


# ---------------------------------------------------------------------------------------------- header reading


def test_header_reader_matches_safetensors_library(tmp_path):
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    ours = read_safetensors_header(d / "model.safetensors")
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in keys}
        dtypes = {k: f.get_slice(k).get_dtype() for k in keys}
    assert set(ours) == keys and len(keys) == 15
    assert {"fc.weight", "d2t", "t2d", "lm_head.weight", "midlayer.input_layernorm.weight"} <= keys
    assert {k: v.shape for k, v in ours.items()} == shapes
    assert {k: v.dtype for k, v in ours.items()} == dtypes
    assert ours["fc.weight"].shape == (64, 192) and ours["fc.weight"].dtype == "BF16"
    assert ours["d2t"].shape == (500,) and ours["d2t"].dtype == "I64"


def test_header_reader_rejects_truncated_and_garbage(tmp_path):
    d = eagle3_draft(tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[: 8 + n // 2])
    with pytest.raises(CheckpointError, match="header length"):
        read_safetensors_header(cut)
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="8-byte header length"):
        read_safetensors_header(short)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 4) + b"nope")
    with pytest.raises(CheckpointError, match="not JSON"):
        read_safetensors_header(garbage)


def test_read_draft_facts(tmp_path):
    d = read_draft(eagle3_draft(tmp_path, eagle_ids=[1, 3, 4]))
    assert d.fc_in_width == 192 and d.fc is not None and d.fc.shape == (64, 192)
    assert d.d2t is not None and d.d2t.shape == (500,)
    assert d.eagle_layer_ids == [1, 3, 4] and d.top_level_layer_ids is None
    assert d.draft_vocab_size == 500 and d.target_hidden_size == 64 and d.has_midlayer
    assert d.weight_files == ["model.safetensors"]


def test_missing_dirs_are_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        check_serving(tmp_path / "nope", tmp_path / "nope2", algorithm="EAGLE3")
    assert issubclass(CheckpointError, eagle_io.EagleIOError)


@pytest.mark.parametrize(
    ("which", "change", "match"),
    [
        ("target", {"hidden_size": 0}, "hidden_size must be a positive integer, found 0"),  # ZeroDivisionError
        ("target", {"hidden_size": "64"}, "hidden_size must be a positive integer, found '64'"),  # checks skipped
        ("target", {"num_hidden_layers": -1}, "num_hidden_layers must be a positive integer, found -1"),
        ("draft", {"eagle_config": "x"}, "eagle_config must be a JSON object, found 'x'"),
        ("draft", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": ["1", "3", "5"]}}, "must be a list of integ"),
        ("draft", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [True, 3, 5]}}, "must be a list of integ"),
        ("draft", {"eagle_config": {"eagle_aux_hidden_state_layer_ids": 3}}, "must be a list of integers, found 3"),
    ],
)
def test_malformed_config_values_are_unreadable_not_ignored(tmp_path, capsys, which, change, match):
    """A target hidden_size of 0 crashed check-serving (ZeroDivisionError); a malformed draft id list (strings,
    booleans, a number) was read as "no ids" and reported SGLang's default layers, with exit 0."""
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path)
    cfg_path = (t if which == "target" else d) / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **change}))
    argv = ["check-serving", "--target", str(t), "--draft", str(d), "--speculative-algorithm", "EAGLE3"]
    assert eagle_io.cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"eagle-io check-serving: CheckpointError: {cfg_path}: ") and match in err


# ---------------------------------------------------------------------------------------------- SGLang rules


def test_sglang_rules():
    assert resolve_algorithm("NEXTN") == "EAGLE" and resolve_algorithm("eagle3") == "EAGLE3"
    assert resolve_algorithm(None) is None
    # Llama setter: default [2, N//2, N-3]; explicit ids +1 (srt/models/llama.py).
    assert served_aux_layer_ids("LlamaForCausalLM", 32, None) == [2, 16, 29]
    assert served_aux_layer_ids("LlamaForCausalLM", 32, [1, 15, 28]) == [2, 16, 29]
    assert served_aux_layer_ids("LlamaForCausalLM", 32, [2, 16, 29]) == [3, 17, 30]
    # DeepSeek/Kimi setter: +1 only when ids[0] == 1 (srt/models/deepseek_v2.py).
    assert served_aux_layer_ids("KimiK25ForConditionalGeneration", 61, None) == [2, 30, 58]
    assert served_aux_layer_ids("DeepseekV3ForCausalLM", 61, [1, 29, 57]) == [2, 30, 58]
    assert served_aux_layer_ids("DeepseekV3ForCausalLM", 61, [2, 30, 58]) == [2, 30, 58]
    # gpt-oss keeps ids that reach the final boundary (srt/models/gpt_oss.py).
    assert served_aux_layer_ids("GptOssForCausalLM", 24, [1, 11, 24]) == [1, 11, 24]
    assert served_aux_layer_ids("GptOssForCausalLM", 24, [1, 11, 20]) == [2, 12, 21]
    assert explicit_ids_for("LlamaForCausalLM", 32, [2, 16, 29]) == [1, 15, 28]
    assert explicit_ids_for("DeepseekV3ForCausalLM", 61, [2, 30, 58]) == [1, 29, 57]
    assert explicit_ids_for("DeepseekV3ForCausalLM", 61, [3, 30, 58]) == [3, 30, 58]
    assert explicit_ids_for("DeepseekV3ForCausalLM", 61, [1, 30, 58]) is None  # [0,..] stays, [1,..] shifts
    ec = {"eagle_aux_hidden_state_layer_ids": [1]}
    b = draft_build({"num_aux_hidden_states": 4, "eagle_config": ec})
    assert (b.num_aux, b.num_aux_source) == (4, "num_aux_hidden_states")
    assert draft_build({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}).num_aux == 2
    b = draft_build({})
    assert (b.num_aux, b.num_aux_source) == (3, "SGLang's default of 3 aux layers")


def test_launch_args_from_raw_cli():
    la = launch_args(
        [
            "--model-path",
            "/m",
            "--speculative-algorithm",
            "NEXTN",
            "--speculative-draft-model-path",
            "/d",
            "--tp",
            "8",
            "--context-length",
            "8192",
            "--mem-fraction-static",
            "0.8",
        ]
    )
    assert (la.model_path, la.draft_path, la.algorithm, la.resolved_algorithm, la.context_length) == (
        "/m",
        "/d",
        "NEXTN",
        "EAGLE",
        8192,
    )
    la = launch_args({"model_path": "/m", "speculative_algorithm": "EAGLE3"})
    assert la.resolved_algorithm == "EAGLE3" and la.draft_path is None


def test_launch_args_are_parsed_by_sglangs_own_parser(tmp_path, monkeypatch):
    """Abbreviations (``--speculative-algo``, common in SGLang's docs and issues) and ``--config launch.yaml``
    read as SGLang reads them; the command line beats the config file; what SGLang refuses is refused."""
    pytest.importorskip("sglang.srt.server_args", reason="SGLang's parser needs SGLang installed")
    for algo in ("EAGLE3", "EAGLE"):
        la = launch_args(["--model", "/m", "--speculative-algo", algo, "--speculative-draft-model", "/d"])
        assert (la.algorithm, la.draft_path, la.parser) == (algo, "/d", "sglang")
    cfg = tmp_path / "launch.yaml"
    cfg.write_text("model-path: /from-config\nspeculative-algorithm: NEXTN\nspeculative-draft-model-path: /d\ntp: 8\n")
    la = launch_args(["--config", str(cfg)])
    assert (la.model_path, la.draft_path, la.resolved_algorithm) == ("/from-config", "/d", "EAGLE")
    la = launch_args(["--config", str(cfg), "--speculative-algorithm", "EAGLE3", "--use-ray"])
    assert (la.model_path, la.resolved_algorithm, la.use_ray) == ("/from-config", "EAGLE3", True)
    with pytest.raises(eagle_io.InvalidArgumentError, match="unrecognized arguments: --no-such-flag"):
        launch_args(["--model-path", "/m", "--no-such-flag", "1"])
    with pytest.raises(eagle_io.InvalidArgumentError, match="ambiguous option: --speculative-draft could match"):
        launch_args(["--model-path", "/m", "--speculative-draft", "/d"])  # what SGLang itself refuses
    with pytest.raises(eagle_io.InvalidArgumentError, match="--config: SGLang's config merge refuses it"):
        launch_args(["--config", str(tmp_path / "launch.json")])
    for help_flag in ("-h", "--help"):  # SGLang's parser printed its help and exited 0: check-serving said "no error"
        with pytest.raises(eagle_io.InvalidArgumentError, match=f"unrecognized arguments: {help_flag}"):
            launch_args(["--model-path", "/m", "--speculative-algorithm", "EAGLE", help_flag])
    assert launch_args(["--config", str(cfg)]).config_ignored is None
    for argv in (["--config=" + str(cfg)], ["--conf", str(cfg)]):  # SGLang parses these and never reads the file
        la = launch_args(["--model-path", "/m", *argv])
        assert (la.model_path, la.draft_path, la.config_ignored) == ("/m", None, str(cfg)), argv
    # Beside an exact --config b.yaml (merged), a --config=a.yaml is parsed and never read: no warning before.
    other = tmp_path / "other.yaml"
    other.write_text("speculative-algorithm: EAGLE3\n")
    for argv in ([f"--config={cfg}", "--config", str(other)], ["--config", str(other), f"--config={cfg}"]):
        la = launch_args(["--model-path", "/m", *argv])
        assert (la.resolved_algorithm, la.draft_path, la.config_ignored) == ("EAGLE3", None, str(cfg)), argv
    assert launch_args(["--model-path", "/m", f"--config={cfg}", "--config", str(cfg)]).config_ignored is None
    # What SGLang's own prepare_server_args makes of it: the file's settings are not there.
    from sglang.srt.server_args import prepare_server_args

    assert prepare_server_args(["--model-path", "/m", f"--config={cfg}"]).speculative_algorithm is None
    both = prepare_server_args(["--model-path", "/m", f"--config={cfg}", "--config", str(other)])
    assert (both.speculative_algorithm, both.speculative_draft_model_path) == ("EAGLE3", None)


def test_a_launch_config_that_is_not_valid_yaml_is_refused_naming_the_file(tmp_path):
    """SGLang's ConfigArgumentMerger re-raises yaml's own error for a malformed file: it was a traceback out of
    `eagle-io check-serving -- --config launch.yaml` (only ValueError / OSError were turned into a clear error)."""
    pytest.importorskip("sglang.srt.server_args", reason="SGLang's parser needs SGLang installed")
    cfg = tmp_path / "launch.yaml"
    cfg.write_text("speculative-algorithm: [EAGLE3\nmodel-path: /m\n")
    with pytest.raises(eagle_io.InvalidArgumentError, match=f"(?s)--config: SGLang's config merge refuses it: .*{cfg}"):
        launch_args(["--config", str(cfg)])


def test_launch_args_without_sglang_refuse_what_they_cannot_read_as_sglang_does(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sglang(name, *a, **k):
        if name.startswith("sglang"):
            raise ImportError(f"No module named {name!r} (test: SGLang not installed)")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_sglang)
    la = launch_args(["--model-path", "/m", "--speculative-algorithm", "EAGLE3", "--tp", "8", "--use-ray"])
    assert (la.model_path, la.resolved_algorithm, la.use_ray, la.parser) == ("/m", "EAGLE3", True, "eagle-io")
    with pytest.raises(eagle_io.InvalidArgumentError, match="cannot resolve abbreviations: spell the flag out"):
        launch_args(["--model-path", "/m", "--speculative-algo", "EAGLE3"])
    with pytest.raises(eagle_io.InvalidArgumentError, match="--config: reading a launch config file"):
        launch_args(["--config", "launch.yaml"])
    # SGLang reads --context-length 32k as 32000 (human_readable_int); the fallback stopped on argparse's SystemExit.
    for text, tokens in (("32k", 32000), ("25.6k", 25600), ("32Ki", 32768), ("4096", 4096)):
        assert launch_args(["--model-path", "/m", "--context-length", text]).context_length == tokens
    for bad in ("lots", "1.5Ki"):  # SGLang allows decimals with SI suffixes only
        with pytest.raises(eagle_io.InvalidArgumentError, match=r"do not parse .*--context-length"):
            launch_args(["--model-path", "/m", "--context-length", bad])
    # --use-r is SGLang's abbreviation of --use-ray: it was ignored, and with it the ray-no-guard warning.
    with pytest.raises(eagle_io.InvalidArgumentError, match=r"--use-r: SGLang may take it .*--use-ray"):
        launch_args(["--model-path", "/m", "--use-r"])


# ---------------------------------------------------------------------------------------------- the findings


def test_correct_eagle3_launch_is_clean(tmp_path):
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    assert check_serving(t, d, algorithm="EAGLE3") == []
    assert format_findings([]) == "OK: no problems found"


@pytest.mark.parametrize("algo", ["EAGLE", "NEXTN", "eagle", None])
def test_eagle3_draft_under_eagle_is_an_error(tmp_path, algo):
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    fs = check_serving(t, d, algorithm=algo)
    f = by_code(fs, "eagle3-draft-wrong-algorithm")
    assert f.severity == "error" and f.fix == "launch with --speculative-algorithm EAGLE3"
    assert "fc.weight input width 192 = 3 x target hidden 64" in f.message
    assert "64-wide final states instead of 192 wide" in f.message
    if algo == "NEXTN":
        assert "SGLang resolves NEXTN to EAGLE" in f.message
    if algo is None:
        assert "no --speculative-algorithm" in f.message


def test_eagle3_detected_from_fc_width_alone(tmp_path):
    """A draft declaring plain LlamaForCausalLM with no EAGLE-3 config keys: the fc width still gives it away."""
    t = llama_target(tmp_path)
    d = eagle3_draft(
        tmp_path, arch="LlamaForCausalLM", draft_vocab=None, d2t=None, lm_head_rows=None, target_hidden=None
    )
    (d / "model.safetensors").unlink()
    save_file({"fc.weight": torch.zeros(H, 3 * H, dtype=torch.bfloat16)}, str(d / "model.safetensors"))
    f = by_code(check_serving(t, d, algorithm="EAGLE"), "eagle3-draft-wrong-algorithm")
    assert "fc.weight input width 192 = 3 x target hidden 64" in f.message
    assert "architecture" not in f.message  # not detected through the name
    # Under EAGLE3, SGLang 0.5.23 builds architectures[0] = a plain LlamaForCausalLM: no fc, aux states unused.
    fs = check_serving(t, d, algorithm="EAGLE3")
    assert issues(fs) == {"draft-architecture": "error", "layer-ids-default": "warning"}
    assert "'LlamaForCausalLM'" in by_code(fs, "draft-architecture").message
    assert "LlamaForCausalLMEagle3" in by_code(fs, "draft-architecture").fix


def test_eagle1_draft(tmp_path):
    t, d = llama_target(tmp_path), eagle1_draft(tmp_path)
    assert check_serving(t, d, algorithm="EAGLE") == []
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "eagle-draft-under-eagle3")
    assert f.severity == "error" and "--speculative-algorithm EAGLE" in f.fix


def test_fc_width_vs_number_of_aux_layers(tmp_path):
    t = llama_target(tmp_path)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 4])  # 2 ids in the config, fc trained on 3 x 64
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "fc-width")
    assert f.severity == "error"
    assert "fc input width 192 != 2 aux layers (len(eagle_config.eagle_aux_hidden_state_layer_ids))" in f.message
    assert "x target hidden 64 = 128" in f.message
    assert "trained on 3 aux layers" in f.fix


def test_draft_for_another_target(tmp_path):
    t = llama_target(tmp_path)
    d = eagle3_draft(tmp_path, fc_in=3 * 96, target_hidden=96, eagle_ids=[1, 3, 4])
    fs = check_serving(t, d, algorithm="EAGLE3")
    assert codes(fs)["target-hidden-size"] == "error" and codes(fs)["fc-width"] == "error"
    # the draft's own config names the target it was trained for (target_hidden_size 96): that is the cause
    assert "trained for a target of hidden size 96 (3 aux layers x 96 = fc input 288" in by_code(fs, "fc-width").fix


def test_off_by_one_between_conventions_names_both(tmp_path):
    """The draft config records eagle-io ids [2, 4, 5] (input of layer i) in eagle_config, which SGLang's Llama
    setter reads as 'output of layer i' and shifts to [3, 5, 6]; the training data (a real eagle-io manifest) says
    [2, 4, 5]."""
    t = llama_target(tmp_path)
    d = eagle3_draft(tmp_path, eagle_ids=[2, 4, 5])
    ds = one_sample_dataset(tmp_path / "ds")
    fs = check_serving(t, d, algorithm="EAGLE3", dataset_manifest=ds)
    f = by_code(fs, "layer-ids-off-by-one")
    assert f.severity == "error"
    assert "off by +1" in f.message and "[3, 5, 6]" in f.message and "[2, 4, 5]" in f.message
    assert "input of 0-based layer i" in f.message and "output of layer i" in f.message
    assert '"eagle_aux_hidden_state_layer_ids": [1, 3, 4]' in f.fix
    # The same ids given directly, and the fixed config is clean.
    assert "layer-ids-off-by-one" in codes(check_serving(t, d, algorithm="EAGLE3", layer_ids=[2, 4, 5]))
    d2 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], name="fixed")
    assert check_serving(t, d2, algorithm="EAGLE3", dataset_manifest=ds / "manifest.json") == []


def test_layer_mismatch_with_default_ids(tmp_path):
    t = llama_target(tmp_path, layers=32)
    d = eagle3_draft(tmp_path)  # no eagle_config: SGLang captures its default [2, 16, 29]
    f = by_code(check_serving(t, d, algorithm="EAGLE3", layer_ids=[3, 10, 20]), "layer-ids-default")
    assert f.severity == "error" and "default [2, 16, 29]" in f.message and "[2, N//2, N-3]" in f.message
    assert '"eagle_aux_hidden_state_layer_ids": [2, 9, 19]' in f.fix
    (info,) = check_serving(t, d, algorithm="EAGLE3", layer_ids=[2, 16, 29])
    assert info.code == "layer-ids-default" and info.severity == "info" and "[2, 16, 29]" in info.message


def test_layer_ids_out_of_range(tmp_path):
    t = llama_target(tmp_path)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 4, 7])  # Llama +1 -> [2, 5, 8]; 8 = N is never captured
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "layer-ids-out-of-range")
    assert "[8] lie outside 1..7" in f.message and "only 2 of 3 states" in f.message


def test_target_without_layer_count_says_the_layer_checks_were_not_run(tmp_path):
    """A target config.json without num_hidden_layers skipped every layer-id check and reported nothing."""
    t = llama_target(tmp_path)
    cfg = json.loads((t / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (t / "config.json").write_text(json.dumps(cfg))
    d = eagle3_draft(tmp_path, eagle_ids=[1, 4, 7])
    (f,) = check_serving(t, d, algorithm="EAGLE3")
    assert f.code == "layer-ids-unknown" and f.severity == "warning" and "no num_hidden_layers" in f.message


def test_top_level_layer_ids_are_ignored_by_sglang(tmp_path):
    t = llama_target(tmp_path, layers=32)
    d = eagle3_draft(tmp_path, top_level_ids=[0, 9, 19])
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "layer-ids-top-level-ignored")
    assert f.severity == "error" and "default [2, 16, 29]" in f.message and "eagle_config" in f.fix
    d2 = eagle3_draft(tmp_path, top_level_ids=[1, 15, 28], name="d2")  # same layers as the default: a warning
    assert issues(check_serving(t, d2, algorithm="EAGLE3")) == {"layer-ids-top-level-ignored": "warning"}


def test_vocab_map_disagreements(tmp_path):
    t = llama_target(tmp_path)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], d2t=400)
    fs = check_serving(t, d, algorithm="EAGLE3")
    f = by_code(fs, "d2t-size")
    assert "d2t has shape [400]" in f.message and "draft_vocab_size is 500" in f.message
    assert '"draft_vocab_size": 400' in f.fix
    assert "lm-head-size" not in codes(fs)
    d2 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], d2t=None, name="nod2t")
    assert codes(check_serving(t, d2, algorithm="EAGLE3")) == {"d2t-missing": "error"}
    d3 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], lm_head_rows=32000, name="head")
    assert codes(check_serving(t, d3, algorithm="EAGLE3")) == {"lm-head-size": "error"}


def test_draft_max_positions(tmp_path):
    t = llama_target(tmp_path, max_pos=131072)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], max_pos=2048)
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "draft-max-positions")
    # SGLang gives the draft the target's context length and refuses a longer one than the draft's own
    # (ModelConfig._derive_context_length) unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: an error.
    assert f.severity == "error" and "--context-length 2048" in f.fix and "131072" in f.message
    assert check_serving(t, d, algorithm="EAGLE3", server_args=["--context-length", "2048"]) == []
    d2 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], max_pos=131072, name="d2")
    assert check_serving(t, d2, algorithm="EAGLE3") == []


def kimi_k25(root: Path, *, algo_ids: list[int] | None = None) -> tuple[Path, Path]:
    """Kimi-K2.5-shaped target (DeepSeek-V3 text model inside a VLM wrapper) and EAGLE-3 draft."""
    t = root / "kimi-k2.5"
    t.mkdir()
    text = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "vocab_size": 163840,
        "max_position_embeddings": 262144,
        "n_routed_experts": 384,
        "num_experts_per_tok": 8,
        "kv_lora_rank": 512,
    }
    cfg = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": {"hidden_size": 1152},
    }
    (t / "config.json").write_text(json.dumps(cfg))
    d = eagle3_draft(
        root,
        fc_in=21504,
        hidden=7168,
        vocab=163840,
        draft_vocab=32000,
        d2t=32000,
        lm_head_rows=32000,
        target_hidden=7168,
        eagle_ids=algo_ids,
        max_pos=262144,
        name="kimi-eagle3",
    )
    return t, d


def test_kimi_k25_shapes(tmp_path):
    t, d = kimi_k25(tmp_path, algo_ids=[1, 29, 57])  # SpecForge-style ids: DeepSeek setter -> [2, 30, 58]
    assert read_draft(d).fc_in_width == 21504 == 3 * 7168
    assert check_serving(t, d, algorithm="EAGLE3") == []
    f = by_code(check_serving(t, d, algorithm="NEXTN"), "eagle3-draft-wrong-algorithm")
    assert "fc.weight input width 21504 = 3 x target hidden 7168" in f.message
    assert "7168-wide final states instead of 21504 wide" in f.message
    # Trained on eagle-io ids [2, 30, 58] (the default layers): clean; on [3, 31, 59]: off by one.
    assert check_serving(t, d, algorithm="EAGLE3", layer_ids=[2, 30, 58]) == []
    f = by_code(check_serving(t, d, algorithm="EAGLE3", layer_ids=[3, 31, 59]), "layer-ids-off-by-one")
    assert "off by -1" in f.message
    assert '"eagle_aux_hidden_state_layer_ids": [3, 31, 59]' in f.fix  # DeepSeek setter keeps ids not starting at 1


# ---------------------------------------------------------------------------------------------- the CLI


def cli(argv: list[str]) -> int:
    """Runs the subcommand module as `eagle-io check-serving` does (independent of its registration)."""
    p = argparse.ArgumentParser(prog="eagle-io check-serving")
    check_serving_cmd.add_parser(p)
    return check_serving_cmd.run(p.parse_args(argv))


def test_cli_exit_codes_and_json(tmp_path, capsys):
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    assert cli(["--target", str(t), "--draft", str(d), "--speculative-algorithm", "EAGLE3"]) == 0
    assert "OK: no problems found" in capsys.readouterr().out
    assert cli(["--target", str(t), "--draft", str(d), "--speculative-algorithm", "eagle", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [f["code"] for f in out] == ["eagle3-draft-wrong-algorithm"]
    assert out[0]["fix"] == "launch with --speculative-algorithm EAGLE3"


def test_cli_target_may_be_a_gguf_package_dir_served_from_its_hf_checkpoint(tmp_path, monkeypatch, capsys):
    from eagle_io.capturing import models

    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    package = tmp_path / "llm_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    gguf = package / "m.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    converted = []
    monkeypatch.setattr(models, "target_checkpoint", lambda m: (converted.append(m), t, None, {})[1:])
    for target in (package, gguf):  # the package directory, or its .gguf file
        assert cli(["--target", str(target), "--draft", str(d), "--speculative-algorithm", "EAGLE3"]) == 0
        out, err = capsys.readouterr()
        assert "OK: no problems found" in out and f"served from its HF checkpoint {t} (pass that to SGLang" in err
    assert converted == [gguf, gguf]
    (package / "other.gguf").write_bytes(b"GGUF")
    (tmp_path / "empty").mkdir()
    for bad, found in ((package, "2 .gguf files"), (tmp_path / "empty", "no .gguf file")):
        with pytest.raises(CheckpointError, match=f"no config.json and {found}: pass an HF model directory"):
            cli(["--target", str(bad), "--draft", str(d)])


def test_cli_reads_sglang_launch_args_after_dashdash(tmp_path, capsys):
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    argv = [
        "--",
        "--model-path",
        str(t),
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-draft-model-path",
        str(d),
        "--tp",
        "8",
        "--speculative-num-steps",
        "3",
    ]
    assert cli(argv) == 1
    out = capsys.readouterr().out
    assert "ERROR [eagle3-draft-wrong-algorithm]" in out and "fix: launch with --speculative-algorithm EAGLE3" in out
    assert (
        cli(
            [
                "--speculative-algorithm",
                "EAGLE3",
                "--",
                "--model-path",
                str(t),
                "--speculative-algorithm",
                "EAGLE",
                "--speculative-draft-model-path",
                str(d),
            ]
        )
        == 1
    )  # conflicting algorithm
    assert "launch-args-conflict" in capsys.readouterr().out


def test_an_abbreviated_correct_launch_is_not_refused_and_ray_is_warned(tmp_path):
    """``--speculative-algo EAGLE3`` is SGLang's ``--speculative-algorithm EAGLE3``: no false
    eagle3-draft-wrong-algorithm (the old parser, allow_abbrev=False, saw no algorithm at all); ``--use-ray`` gets the
    warning that the plugin cannot guard that launch, ``--config=FILE`` the one that SGLang never reads that file."""
    pytest.importorskip("sglang.srt.server_args", reason="SGLang's parser needs SGLang installed")
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    raw = ["--model-path", str(t), "--speculative-algo", "EAGLE3", "--speculative-draft-model-path", str(d)]
    fs = check_serving(None, None, server_args=raw)
    assert issues(fs) == {}
    fs = check_serving(None, None, server_args=[*raw, "--use-ray"])
    assert issues(fs) == {"ray-no-guard": "warning"} and "never call load_plugins()" in fs[0].message
    cfg = tmp_path / "launch.yaml"
    cfg.write_text("speculative-num-steps: 5\n")
    fs = check_serving(None, None, server_args=[*raw, f"--config={cfg}"])
    assert issues(fs) == {"config-ignored": "warning"} and f"--config {cfg} (two tokens)" in fs[0].fix
    assert issues(check_serving(None, None, server_args=[*raw, "--config", str(cfg)])) == {}
    wrong = ["--model", str(t), "--speculative-algo", "EAGLE", "--speculative-draft-model", str(d)]
    fs = check_serving(None, None, server_args=wrong)
    assert issues(fs) == {"eagle3-draft-wrong-algorithm": "error"}


def test_a_hub_id_is_checked_at_the_revision_sglang_loads(tmp_path, monkeypatch):
    """``--speculative-draft-model-path org/d --speculative-draft-model-revision v2``: SGLang loads the v2 snapshot;
    the check read the cached ``main`` snapshot instead (``try_to_load_from_cache`` without a revision), so a
    broken v2 draft passed when ``main`` was fine, and the other way round."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    t = llama_target(tmp_path)
    repo = tmp_path / "hub" / "models--org--d"
    (repo / "refs").mkdir(parents=True)
    (repo / "snapshots").mkdir()
    for rev, commit, fc_in in (("main", "a" * 40, 3 * H), ("v2", "b" * 40, 2 * H)):  # v2: another fc width
        eagle3_draft(tmp_path, name=rev, eagle_ids=[1, 3, 4], fc_in=fc_in).rename(repo / "snapshots" / commit)
        (repo / "refs" / rev).write_text(commit)
    raw = ["--model-path", str(t), "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "org/d"]
    assert issues(check_serving(None, None, server_args=raw)) == {}
    v2 = [*raw, "--speculative-draft-model-revision", "v2"]
    assert launch_args(v2).draft_revision == "v2"
    assert "fc-width" in issues(check_serving(None, None, server_args=v2))
    with pytest.raises(CheckpointError, match="org/d at revision v3: not a checkpoint directory"):
        check_serving(None, None, server_args=[*raw, "--speculative-draft-model-revision", "v3"])


def test_cli_registered_console_script(tmp_path):
    assert COMMANDS["check-serving"] is check_serving_cmd
    t, d = llama_target(tmp_path), eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle_io.cli",
            "check-serving",
            "--target",
            str(t),
            "--draft",
            str(d),
            "--speculative-algorithm",
            "EAGLE",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "eagle3-draft-wrong-algorithm" in r.stdout
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "eagle_io.cli",
            "check-serving",
            "--target",
            str(tmp_path / "x"),
            "--draft",
            str(d),
            "--speculative-algorithm",
            "EAGLE3",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "not a checkpoint directory" in r.stderr


def one_sample_dataset(root: Path) -> Path:
    """An eagle-io dataset of the tiny target (aux layers [2, 4, 5], bf16) holding one 3-token sample."""
    meta = eagle3_metadata(
        target_info={"num_layers": N, "hidden_size": H, "vocab_size": V},
        aux_layer_ids=[2, 4, 5],
        dtype="bfloat16",
        tokenizer_identity=None,
        max_length=None,
    )
    with eagle_io.ShardWriter(root, eagle_io.eagle3_schema(H), meta) as w:
        w.write(0, {"input_ids": torch.arange(3), "loss_mask": torch.ones(3, dtype=torch.uint8),
                    "aux_hidden_states": torch.zeros(3, 3 * H, dtype=torch.bfloat16),
                    "hidden_states": torch.zeros(3, H, dtype=torch.bfloat16)})  # fmt: skip
    return root


def test_a_float16_target_meets_data_beyond_float16s_range(tmp_path):
    """The preflight reads the training data's recorded per-layer max |x| (value_stats.json): a float16 target
    warns when a captured layer exceeded 65504; a bfloat16 target does not."""
    import json

    t16 = llama_target(tmp_path / "fp16")
    cfg = json.loads((t16 / "config.json").read_text())
    (t16 / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "float16"}))
    tbf = llama_target(tmp_path / "bf16")
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    ds = one_sample_dataset(tmp_path / "ds")
    stats = {"format": "eagle-io/value-stats", "aux_layer_ids": [2, 4, 5], "samples": 1, "skipped": {},
             "absmax": {"aux_hidden_states": [3.0, 9.0e4, 5.0], "hidden_states": 4.0}}  # fmt: skip
    (ds / "value_stats.json").write_text(json.dumps(stats))
    f = by_code(check_serving(t16, d, algorithm="EAGLE3", dataset_manifest=ds), "dataset-range-exceeds-fp16")
    assert f.severity == "warning" and "aux layer 4 reach |x| = 9e+04" in f.message and "bfloat16" in f.fix
    assert "dataset-range-exceeds-fp16" not in codes(check_serving(tbf, d, algorithm="EAGLE3", dataset_manifest=ds))


def test_cli_target_gguf_that_is_missing_or_unreadable_is_a_checkpoint_error(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_IO_CACHE", str(tmp_path / "cache"))
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    with pytest.raises(CheckpointError, match="no such file"):
        cli(["--target", str(tmp_path / "absent.gguf"), "--draft", str(d)])
    bad = tmp_path / "bad" / "m.gguf"
    bad.parent.mkdir()
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(CheckpointError, match=r"m\.gguf: cannot be read as a GGUF model"):
        cli(["--target", str(bad), "--draft", str(d)])
    assert not list((tmp_path / "cache").rglob("config.json")), "no half checkpoint cached"
