"""``eagle-io generate --backend sglang`` and a launched SGLang server, both capturing by environment, on CPU.

Real SGLang 0.5.23 scheduler processes (``SGLANG_USE_CPU_ENGINE=1``, torch_native attention) run a tiny random Llama
saved with SmolLM2's real tokenizer over the real ShareGPT slice; the test-only ``sgl_kernel`` of
tests/support/sgl_kernel_torch is on ``PYTHONPATH`` (:mod:`helpers.sglang_cpu`). Proven here: a run, its
resume (only the missing samples are captured), two DP ranks writing their own shards merged into one dataset
bit-identical to the single-rank run, the same two ranks writing to ``s3://`` on a real S3 server (each shard
uploaded as it commits, resumed from the remote manifests alone), agreement with the HF reference path, and a server
started with ``EAGLE_IO_CAPTURE_DIR`` fed over HTTP (``custom_params``) and stopped through the stop file, and
``--regenerate`` answered by the capture engine itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import s3server
from helpers.sglang_cpu import cpu_engine_env
from test_capture_session import FIXTURE, tiny_target
from test_serving_plugin import needs_sglang

import eagle_io
from eagle_io.cli import main

CPU_ENGINE = [
    "device=cpu",
    "attention_backend=torch_native",
    "disable_cuda_graph=true",
    "max_total_tokens=4096",
    "max_running_requests=4",
    "log_level=warning",
    "mem_fraction_static=0.3",
]


def sglang_env() -> dict[str, str]:
    return cpu_engine_env(SGLANG_CPU_OMP_THREADS_BIND="0|1")  # two DP ranks on a one-NUMA-node machine


def generate(tmp: Path, out: Path | str, *extra: str, summary: Path | None = None, env: dict | None = None) -> dict:
    """Runs ``eagle-io generate --backend sglang`` in a fresh process (``env`` added to its environment); returns
    its summary."""
    summary = summary or Path(out).with_suffix(".summary.json")
    args = ["--model", str(tmp / "tiny"), "--dataset", str(FIXTURE), "--out", str(out), "--max-length", "256"]
    args += ["--batch-size", "3", "--threads", "1", "--backend", "sglang", "--summary-json", str(summary)]
    args += [a for kv in CPU_ENGINE for a in ("--sglang-arg", kv)]
    cmd = [sys.executable, "-m", "eagle_io.cli", "generate", *args, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=sglang_env() | (env or {}), timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(summary.read_text())


def ids(root: Path) -> list[int]:
    ds = eagle_io.Dataset(root)
    return sorted(ds.entry(i).sample_id for i in range(len(ds)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 6-record run resumed to 12 records, and a fresh 12-record run on two DP ranks."""
    from eagle_io.data import load_default_tokenizer

    tmp = tmp_path_factory.mktemp("sglang-generate")
    tok = load_default_tokenizer()
    model, _ = tiny_target(vocab=len(tok))
    model.to(torch.bfloat16).save_pretrained(tmp / "tiny")
    tok.save_pretrained(tmp / "tiny")
    first = generate(tmp, tmp / "one", "--limit", "6")
    first_ids = ids(tmp / "one")
    resumed = generate(tmp, tmp / "one", "--limit", "12", "--resume")
    dp2 = generate(tmp, tmp / "two", "--limit", "12", "--dp-size", "2")
    return tmp, first, first_ids, resumed, dp2


@needs_sglang
@pytest.mark.slow
def test_generate_then_resume_captures_exactly_the_missing_samples(runs):
    tmp, first, first_ids, resumed, _ = runs
    assert first["samples_written"] == len(first_ids) > 0 and first["already_committed_skipped"] == 0
    all_ids = ids(tmp / "one")
    assert set(first_ids) < set(all_ids)
    assert resumed["samples_written"] == len(all_ids) - len(first_ids)
    assert resumed["already_committed_skipped"] == len(first_ids), "the committed samples are not captured again"
    assert eagle_io.Dataset.verify(tmp / "one") == []
    meta = eagle_io.Dataset(tmp / "one").metadata
    assert meta["aux_layer_ids"] == [2, 4, 5] and meta["capture_backend"].startswith("sglang ")
    assert meta["dp_size"] == 1 and meta["source_dataset"] == FIXTURE.name


@needs_sglang
@pytest.mark.slow
def test_two_dp_ranks_write_their_own_shards_merged_bit_identical_to_one_rank(runs):
    tmp, _, _, _, dp2 = runs
    two, one = tmp / "two", tmp / "one"
    per_rank = [ids(two / f"manifest.r{r:05d}.json") for r in range(2)]
    assert all(per_rank) and not set(per_rank[0]) & set(per_rank[1]), "both ranks wrote, disjoint samples"
    assert dp2["manifest"] == str(two / "manifest.json") and dp2["merge_warnings"] == []
    assert dp2["samples_written"] == len(ids(one)) and dp2["ring_high_water_bytes"] <= 256 << 20  # one rank's ring
    assert ids(two) == sorted(per_rank[0] + per_rank[1]) == ids(one)
    a, b = eagle_io.Dataset(one), eagle_io.Dataset(two)
    for sid in ids(one):
        x, y = a[a.position(sid)], b[b.position(sid)]
        for name in ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states"):
            assert torch.equal(x[name], y[name]), (sid, name)


@pytest.fixture(scope="module")
def remote(runs):
    """Two DP ranks capturing 8 records into ``s3://`` on a real S3 server (s3s-fs), then, with the staging
    directory deleted, resumed from the remote manifests alone to 12 records."""
    if s3server.available() is not None:
        pytest.skip(s3server.available())
    tmp = runs[0]
    server = s3server.S3Server(tmp / "s3root")
    server.bucket("capture")
    url, staging = "s3://capture/run", tmp / "staging"
    common = ["--dp-size", "2", "--staging", str(staging), "--shard-bytes", "150000"]
    try:
        first = generate(tmp, url, "--limit", "8", *common, summary=tmp / "s3-1.json", env=server.env())
        staged = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*.eio"))
        shutil.rmtree(staging)
        resumed = generate(tmp, url, "--limit", "12", "--resume", *common, summary=tmp / "s3-2.json", env=server.env())
        run = tmp / "s3root" / "capture" / "run"  # s3s-fs keeps each object as a file under its key
        objects = sorted(p.relative_to(run).as_posix() for p in run.rglob("*.eio"))
        with pytest.MonkeyPatch.context() as mp:  # the server's endpoint and keys, read when a client is built
            for k, v in server.env().items():
                mp.setenv(k, v)
            yield url, first, staged, resumed, objects
    finally:
        server.stop()


@needs_sglang
@pytest.mark.slow
def test_two_dp_ranks_upload_each_shard_to_s3_as_it_commits_and_resume_from_the_remote_manifests(runs, remote):
    tmp, *_ = runs
    url, first, staged, resumed, objects = remote
    one = eagle_io.Dataset(tmp / "one")
    ds = eagle_io.Dataset(url)
    assert ds.manifest["complete"] and eagle_io.Dataset.verify(url) == []
    assert sorted(ds.entry(p).sample_id for p in range(len(ds))) == ids(tmp / "one")
    for sid in ids(tmp / "one"):  # the same states as the local one-rank run, bit for bit
        x, y = one[one.position(sid)], ds[ds.position(sid)]
        for name in ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states"):
            assert torch.equal(x[name], y[name]), (sid, name)
    # Each rank uploaded its own shards as they committed (several per rank at 150 kB) and removed the staged copies.
    up1, up2 = first["upload"], resumed["upload"]
    assert up1["url"] == url and {f.split("/")[-1][:6] for f in up1["uploaded"]} == {"r00000", "r00001"}
    assert len(up1["uploaded"]) > 2 and staged == []
    assert first["manifest"] == resumed["manifest"] == f"{url}/manifest.json" and resumed["merge_warnings"] == []
    # The resume found the committed samples in the remote manifests (no staging left), captured only the rest,
    # and uploaded only the new shards; the bucket holds exactly the shards the merged manifest lists.
    assert resumed["already_committed_skipped"] == first["samples_written"] > 0
    assert resumed["samples_written"] == len(ds) - first["samples_written"] > 0
    assert not set(up1["uploaded"]) & set(up2["uploaded"])
    assert objects == sorted(up1["uploaded"] + up2["uploaded"]) == sorted(s["file"] for s in ds.manifest["shards"])
    assert up1["bytes"] + up2["bytes"] == sum(s["bytes"] for s in ds.manifest["shards"])


@needs_sglang
@pytest.mark.slow
def test_sglang_generate_matches_the_hf_generate(runs):
    """Same ids, tokens and masks as ``generate --backend hf`` on the same checkpoint; states within 3% of the max
    (SGLang's bf16 forward vs HF's float32 one, as test_serving_plugin.py's equivalence test explains)."""
    tmp, *_ = runs
    hf = tmp / "hf"
    args = ["generate", "--model", str(tmp / "tiny"), "--dataset", str(FIXTURE), "--out", str(hf)]
    assert main([*args, "--max-length", "256", "--batch-size", "3", "--threads", "1", "--limit", "12"]) == 0
    assert ids(hf) == ids(tmp / "one")
    a, b = eagle_io.Dataset(tmp / "one"), eagle_io.Dataset(hf)
    assert a.metadata["aux_layer_ids"] == b.metadata["aux_layer_ids"]
    for sid in ids(hf):
        x, y = a[a.position(sid)], b[b.position(sid)]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for name in ("aux_hidden_states", "hidden_states"):
            err = (x[name].float() - y[name].float()).abs().max() / y[name].float().abs().max()
            assert err <= 0.03, (sid, name, float(err))


@needs_sglang
@pytest.mark.slow
def test_the_embedded_real_model_through_sglang_matches_the_hf_backend(tmp_path):
    """SmolLM2 (its GGUF dequantised to a bf16 HF checkpoint, bf16 forward in SGLang) vs the HF backend (packed
    Q4_1 weights computed in float32) on the first ShareGPT records: same samples, tokens and masks; measured on 30
    samples: aux within 0.52% and final states within 2.9% of the max |reference|, per-token cosine >= 0.9967."""
    common = ["--limit", "12", "--max-length", "256", "--batch-size", "4", "--skip-bad-records", "--threads", "1"]
    env = sglang_env() | {"EAGLE_IO_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "eagle_io.cli", "generate", "--backend", "sglang", "--out", str(tmp_path / "sg")]
    cmd += common + [a for kv in CPU_ENGINE for a in ("--sglang-arg", kv)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert main(["generate", "--out", str(tmp_path / "hf"), *common]) == 0
    assert eagle_io.Dataset.verify(tmp_path / "sg") == []
    sg, hf = eagle_io.Dataset(tmp_path / "sg"), eagle_io.Dataset(tmp_path / "hf")
    assert ids(tmp_path / "sg") == ids(tmp_path / "hf") and len(sg) >= 5
    assert sg.metadata["aux_layer_ids"] == hf.metadata["aux_layer_ids"] == [2, 15, 27]
    assert sg.metadata["target_model"] == hf.metadata["target_model"], "the same GGUF file is named as the target"
    for sid in ids(tmp_path / "hf"):
        x, y = sg[sg.position(sid)], hf[hf.position(sid)]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for name, tol in (("aux_hidden_states", 0.01), ("hidden_states", 0.05)):
            a, b = x[name].float(), y[name].float()
            assert float((a - b).abs().max() / b.abs().max()) <= tol, (sid, name)
            assert float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min()) >= 0.99, (sid, name)


@needs_sglang
@pytest.mark.slow
def test_generate_regenerate_through_the_sglang_engine_captures_its_own_answers(runs):
    """``--regenerate --backend sglang``: the capture engine writes the answers (its generation requests carry no
    sample parameter, so only the capture prefills are written); each stored sample's first supervised span is the
    regenerated turn recorded beside the original in regenerated_turns.jsonl, and the metadata says how."""
    from eagle_io.data import load_default_tokenizer

    tmp, *_ = runs
    out = tmp / "regen"
    summary = generate(tmp, out, "--limit", "4", "--regenerate", "--max-new-tokens", "8")
    ds = eagle_io.Dataset(out)
    assert eagle_io.Dataset.verify(out) == [] and len(ds) == summary["samples_written"] >= 2
    assert ds.metadata["regenerated"]["by"] == "tiny" and ds.metadata["regenerated"]["max_new_tokens"] == 8
    assert ds.metadata["capture_backend"].startswith("sglang ")
    records = {r["sample_id"]: r for r in map(json.loads, (out / "regenerated_turns.jsonl").read_text().splitlines())}
    assert summary["regenerated"]["turns"] == sum(len(r["turns"]) for r in records.values()) > 0
    tok = load_default_tokenizer()
    source = json.loads(FIXTURE.read_text())
    for pos in range(len(ds)):
        sample = ds[pos]
        first = records[sample["sample_id"]]["turns"][0]
        originals = [t["value"] for t in source[sample["sample_id"]]["conversations"] if t["from"] == "gpt"]
        assert first["original"] in originals and 1 <= first["new_tokens"] <= 8
        assert first["regenerated"].strip() not in {o.strip() for o in originals}
        mask = sample["loss_mask"].bool()
        start = int(torch.nonzero(mask)[0])
        end = start + int(mask[start:].int().cumprod(0).sum())
        stored = tok.decode(sample["input_ids"][start:end], skip_special_tokens=True)
        assert stored.strip() == first["regenerated"].strip(), sample["sample_id"]


def test_generate_refuses_an_existing_capture_without_resume_or_with_another_dp_size(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    assert main(["generate", "--backend", "sglang", "--out", str(out), "--limit", "1"]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(["generate", "--backend", "sglang", "--out", str(out), "--resume", "--dp-size", "2"]) == 2
    assert "captured by 1 shard writer(s) (data-parallel ranks), this launch has 2" in capsys.readouterr().err
    for r in range(2):
        (out / f"manifest.r{r:05d}.json").write_text("{}")
    assert main(["generate", "--backend", "sglang", "--out", str(out), "--resume"]) == 2
    assert "captured by 2 shard writer(s) (data-parallel ranks), this launch has 1" in capsys.readouterr().err
    # Attention-DP groups are writers too (the old count, dp_size alone, saw 1 writer and 4 replicas here).
    argv = ["generate", "--backend", "sglang", "--out", str(out), "--resume", "--tp-size", "4"]
    assert main([*argv, "--attn-dp-size", "4"]) == 2
    assert "captured by 2 shard writer(s) (data-parallel ranks), this launch has 4" in capsys.readouterr().err
    assert main([*argv, "--dp-size", "4", "--sglang-arg", "enable_dp_attention=true"]) == 2  # the deprecated spelling
    assert "this launch has 4" in capsys.readouterr().err
    # A Ray launch never loads the plugin in its scheduler actors: refused before anything runs.
    assert (
        main(["generate", "--backend", "sglang", "--out", str(tmp_path / "ray"), "--sglang-arg", "use_ray=true"]) == 2
    )
    assert "Ray scheduler actors" in capsys.readouterr().err


def post(url: str, body: dict) -> int:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status


@needs_sglang
@pytest.mark.slow
def test_a_server_launched_with_eagle_io_capture_dir_captures_http_requests(runs, monkeypatch):
    """``python -m sglang.launch_server`` with ``EAGLE_IO_CAPTURE_DIR`` set: samples sent to ``/generate`` with
    eagle-io's ``custom_params`` are captured; other requests are not; a stop over HTTP (what ``eagle-io live stop``
    sends: the capture has no client token) commits; the states are those of ``generate --backend sglang`` over the
    same launch, bit for bit."""
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.sglang.client import stop_server_capture
    from eagle_io.capturing.sglang.launch import launch_capture_server
    from eagle_io.capturing.sglang.protocol import capture_id, sample_params
    from eagle_io.cli.sglang_arg import parse_sglang_args
    from eagle_io.sglang.servers import stop_server

    tmp, *_ = runs
    out = tmp / "server"
    env = sglang_env()
    env.update(EAGLE_IO_CAPTURE_DIR=str(out), EAGLE_IO_CAPTURE_OPTIONS=json.dumps({"metadata": {"via": "server"}}),
               EAGLE_IO_CAPTURE_SECRET="the-operators-secret")  # fmt: skip
    url, server = launch_capture_server(tmp / "tiny", CaptureOptions(), tmp / "server.log", timeout_s=600, env=env,
                                        **parse_sglang_args(CPU_ENGINE))  # fmt: skip
    try:
        ref = eagle_io.Dataset(tmp / "one")
        wanted = ids(tmp / "one")[:4]
        for sid in wanted:
            item = ref[ref.position(sid)]
            sample = SimpleNamespace(index=sid, loss_mask=item["loss_mask"], id=f"conv-{sid}")
            body = {"input_ids": item["input_ids"].tolist(), "sampling_params": {"max_new_tokens": 1}}
            body["sampling_params"]["custom_params"] = sample_params(sample, "the-operators-secret")
            assert post(f"{url}/generate", body) == 200
        other = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}
        assert post(f"{url}/generate", other) == 200  # not a sample: ignored
        monkeypatch.setenv("EAGLE_IO_CAPTURE_SECRET", "the-operators-secret")  # the operator's stop proves it
        (answer,) = stop_server_capture(url, timeout_s=120, complete=True)
    finally:
        stop_server(server)
    assert answer["error"] is None and answer["counts"]["written"] == 4 and answer["stats"]["samples"] == 4
    assert answer["state"] == "stopped" and answer["id"] == capture_id("the-operators-secret") and not answer["forced"]
    assert eagle_io.Dataset.verify(out) == [] and ids(out) == wanted
    ds = eagle_io.Dataset(out)
    assert ds.metadata["via"] == "server" and ds.manifest["complete"]
    for sid in wanted:
        x, y = ds[ds.position(sid)], ref[ref.position(sid)]
        assert ds.entry(ds.position(sid)).key == f"conv-{sid}"
        for name in ("input_ids", "loss_mask", "aux_hidden_states", "hidden_states"):
            assert torch.equal(x[name], y[name]), (sid, name)
