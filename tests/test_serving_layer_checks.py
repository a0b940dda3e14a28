"""`check_serving` computes the layers SGLang 0.5.23 will capture and feed (the target's setter rule, duplicates,
range, count) and compares them with what the draft was trained on: ``--trained-layer-ids``, ``--dataset`` and
the ``eagle_io`` record of an eagle-io export. Each case was reported OK before these checks existed."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from test_serving_preflight import H, by_code, eagle3_draft, kimi_k25, llama_target

import eagle_io
from eagle_io.cli import check_serving_cmd, main
from eagle_io.serving import check_serving
from eagle_io.store.metadata import eagle3_metadata


def dataset(root, ids, *, num_layers, hidden=H, k=None, name="ds"):
    """A one-sample eagle-io dataset captured (as metadata says) from a ``num_layers``-layer target."""
    k = len(ids) if k is None else k
    meta = eagle3_metadata(
        target_info={"num_layers": num_layers, "hidden_size": hidden, "vocab_size": 1000},
        aux_layer_ids=ids,
        dtype="bfloat16",
        tokenizer_identity=None,
        max_length=None,
    )
    with eagle_io.ShardWriter(root / name, eagle_io.eagle3_schema(hidden, k), meta, threads=1) as w:
        w.write(
            0,
            {
                "input_ids": torch.arange(3),
                "loss_mask": torch.ones(3, dtype=torch.uint8),
                "aux_hidden_states": torch.zeros(3, k * hidden, dtype=torch.bfloat16),
                "hidden_states": torch.zeros(3, hidden, dtype=torch.bfloat16),
            },
        )
    return root / name


def cli(argv):
    p = argparse.ArgumentParser(prog="eagle-io check-serving")
    check_serving_cmd.add_parser(p)
    return check_serving_cmd.run(p.parse_args(argv))


def test_default_ids_are_stated_and_compared(tmp_path, capsys):
    """No eagle_config ids on an 80-layer target: SGLang captures [2, 40, 77]. A warning naming them while nothing
    says what the draft was trained on (it was only info), an error when the trained ids are known and differ (the
    given ids, the dataset, the draft's own eagle_io record), info when they agree."""
    t = llama_target(tmp_path, layers=80)
    d = eagle3_draft(tmp_path)
    (warn,) = check_serving(t, d, algorithm="EAGLE3")
    assert (warn.severity, warn.code) == ("warning", "layer-ids-default") and "default [2, 40, 77]" in warn.message
    assert "set eagle_config.eagle_aux_hidden_state_layer_ids" in warn.fix
    assert cli(["--target", str(t), "--draft", str(d), "--speculative-algorithm", "EAGLE3"]) == 0
    assert "WARNING [layer-ids-default]" in capsys.readouterr().out
    (f,) = check_serving(t, d, algorithm="EAGLE3", layer_ids=[3, 41, 78])
    assert (f.severity, f.code) == ("error", "layer-ids-default") and "off by -1 between conventions" in f.message
    assert '"eagle_aux_hidden_state_layer_ids": [2, 40, 77]' in f.fix
    ds = dataset(tmp_path, [2, 20, 60], num_layers=80)
    (f,) = check_serving(t, d, algorithm="EAGLE3", dataset_manifest=ds)
    assert f.severity == "error" and "[2, 40, 77]" in f.message and "trained on eagle-io ids [2, 20, 60]" in f.message
    (info,) = check_serving(t, d, algorithm="EAGLE3", dataset_manifest=dataset(tmp_path, [2, 40, 77], num_layers=80,
                                                                               name="ok"))  # fmt: skip
    assert info.severity == "info" and "[2, 40, 77]" in info.message
    record = json.loads((d / "config.json").read_text())
    record["eagle_io"] = {"aux_layer_ids": [5, 40, 70], "target": {"num_layers": 80}}
    (d / "config.json").write_text(json.dumps(record))
    (f,) = check_serving(t, d, algorithm="EAGLE3")
    assert f.severity == "error" and "the draft's eagle_io record" in f.message and "[5, 40, 70]" in f.message


@pytest.mark.parametrize(("ids", "layers", "arrive"), [([3, 3, 7], "[4, 4, 8]", 2), ([1, 1, 1], "[2, 2, 2]", 1)])
def test_duplicate_eagle_config_ids(tmp_path, ids, layers, arrive):
    t = llama_target(tmp_path, layers=36)
    d = eagle3_draft(tmp_path, eagle_ids=ids)
    fs = check_serving(t, d, algorithm="EAGLE3")
    f = by_code(fs, "layer-ids-duplicate")
    assert f.severity == "error" and f"layers_to_capture {layers}" in f.message
    assert f"only {arrive} of 3 states are captured and sent to the draft" in f.message


def test_duplicate_ids_on_a_kimi_k25_target_crash_sglang_rather_than_send_fewer_states(tmp_path):
    """Kimi-K2.5 (its DeepSeek-V3 language model packs the states): [29, 29, 57] -> the packer raises 'captured 2
    of 3' at the first forward, and the finding says so."""
    t, d = kimi_k25(tmp_path, algo_ids=[29, 29, 57])
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "layer-ids-duplicate")
    assert "AuxHiddenStatePacker on KimiK25ForConditionalGeneration raises 'captured 2 of 3" in f.message
    assert "fails on its first request" in f.message


def test_a_draft_trained_for_another_layer_count(tmp_path, capsys):
    """An eagle-io draft trained for an 8-layer target, served on a 12-layer one: its default ids [2, 4, 5] are
    valid ids of both, so only the record of what it was trained for tells."""
    t = llama_target(tmp_path, layers=12)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    cfg = json.loads((d / "config.json").read_text())
    cfg["eagle_io"] = {"aux_layer_ids": [2, 4, 5], "target": {"num_layers": 8, "hidden_size": H, "model_id": "m8"}}
    (d / "config.json").write_text(json.dumps(cfg))
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "draft-trained-target")
    assert f.severity == "error" and "8-layer target (m8)" in f.message and "12 layers" in f.message
    ds = dataset(tmp_path, [2, 4, 5], num_layers=8)
    assert cli(["--target", str(t), "--draft", str(d), "--speculative-algorithm", "EAGLE3", "--dataset", str(ds)]) == 1
    out = capsys.readouterr().out
    assert "ERROR [dataset-num-layers]" in out and "8-layer target, this target has 12 layers" in out


def test_dataset_aux_width_must_be_the_fc_input(tmp_path):
    t = llama_target(tmp_path)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    ds = dataset(tmp_path, [2, 4, 5, 6], num_layers=8)  # 4 x 64 = 256 wide; the fc takes 192
    fs = check_serving(t, d, algorithm="EAGLE3", dataset_manifest=ds)
    f = by_code(fs, "dataset-aux-width")
    assert "aux states 256 wide but the draft's fc takes 192" in f.message
    assert by_code(fs, "layer-ids-mismatch").severity == "error"


@pytest.mark.parametrize("bad", ["-1,5,9", "0,5,9", "5,5,9", "9,5,7", "2,5,40"])
def test_trained_ids_outside_the_target_are_refused_with_one_line(tmp_path, capsys, bad):
    """--trained-layer-ids=-1,5,9 once produced the 'fix' [-2, 4, 8]."""
    t = llama_target(tmp_path, layers=36)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    argv = ["check-serving", "--target", str(t), "--draft", str(d), "--speculative-algorithm", "EAGLE3"]
    assert main([*argv, f"--trained-layer-ids={bad}"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1 and "aux layer id" in cap.err
    assert "Traceback" not in cap.err and "[-2, 4, 8]" not in cap.err
    with pytest.raises(SystemExit) as e:  # argparse: usage line + one error line, exit 2
        main([*argv, "--trained-layer-ids=2,x"])
    assert e.value.code == 2 and "expected comma-separated integers, got '2,x'" in capsys.readouterr().err


def test_the_final_prenorm_boundary(tmp_path):
    """Id N is captured by SGLang's gpt-oss target only; a draft trained on it uses norm_before_fc."""
    d = eagle3_draft(tmp_path, eagle_ids=[1, 4, 8])  # gpt-oss: max == N = 8 -> kept as [1, 4, 8]
    gpt = llama_target(tmp_path / "g", layers=8)
    cfg = json.loads((gpt / "config.json").read_text())
    (gpt / "config.json").write_text(json.dumps({**cfg, "architectures": ["GptOssForCausalLM"]}))
    f = by_code(check_serving(gpt, d, algorithm="EAGLE3", layer_ids=[1, 4, 8]), "final-state-unnormalised")
    assert f.severity == "warning" and "norm_before_fc" in f.fix
    on = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 4, 8], "norm_before_fc": True}}
    normed = eagle3_draft(tmp_path, eagle_ids=[1, 4, 8], extra_config=on, name="normed",
                          extra_tensors={"input_norm.weight": ("BF16", (3 * H,))})  # fmt: skip
    assert check_serving(gpt, normed, algorithm="EAGLE3", layer_ids=[1, 4, 8]) == []
    # A Llama target cannot capture id 8: the trained ids are refused as not capturable there, with no "fix" ids.
    llama = llama_target(tmp_path / "l", layers=8)
    fs = check_serving(llama, normed, algorithm="EAGLE3", layer_ids=[2, 5, 8])
    f = by_code(fs, "layer-ids-mismatch")
    assert "cannot capture eagle-io ids [2, 5, 8]" in f.fix and "1..7" in f.fix
