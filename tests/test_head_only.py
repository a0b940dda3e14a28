"""Head-only commands never load or hash a whole target: on a checkpoint hundreds of GB on paper and a few MB on disk
(tests/helpers/sparse_checkpoint.py: real headers and head tensors, every layer a hole of a sparse file),
``load_target_head``, ``vocab-map``, ``train-draft``, ``check-serving`` and offline ``eval-draft`` finish in seconds
on the checkpoint's own head values; its identity takes seconds and is cached; a whole-model load refuses it with
the figures. Variants: sharded or one file, bf16 or FP8 (128 x 128 blocks) heads, tied embeddings."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from helpers.sparse_checkpoint import build_sparse_checkpoint

import eagle_io
from eagle_io.capturing import weights
from eagle_io.cli import main
from eagle_io.draft import load_target_head
from eagle_io.errors import CheckpointError, InvalidArgumentError
from eagle_io.host import human_bytes
from eagle_io.store.metadata import eagle3_metadata
from eagle_io.store.target_identity import target_differences

PAPER = 300 << 30  # the layers' bytes on paper


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_IO_CACHE", str(tmp_path / "cache"))


def _sizes(root):
    files = [p for p in root.iterdir() if p.is_file()]
    return sum(p.stat().st_size for p in files), sum(p.stat().st_blocks * 512 for p in files)


@pytest.mark.parametrize(
    "variant",
    [{}, {"sharded": False}, {"fp8": True, "hidden": 192}, {"tied": True}, {"fp8": True, "hidden": 192, "tied": True}],
    ids=["sharded-bf16", "one-file-bf16", "sharded-fp8", "tied-bf16", "tied-fp8"],
)
def test_load_target_head_reads_the_checkpoints_own_head_alone(tmp_path, variant):
    root, values = build_sparse_checkpoint(tmp_path / "t", paper_bytes=PAPER, **variant)
    paper, disk = _sizes(root)
    assert paper > PAPER and disk < 10 << 20, (paper, disk)
    t0 = time.perf_counter()
    head = load_target_head(root)
    seconds = time.perf_counter() - t0
    assert seconds < 30, f"{seconds:.1f} s: the layers were read"
    assert head.embed.dtype == head.lm_head.dtype == torch.bfloat16, "the stored dtype (FP8: dequantised to bf16)"
    assert torch.equal(head.embed, values["embed"]) and torch.equal(head.lm_head, values["lm_head"])
    assert (head.lm_head is head.embed) == bool(variant.get("tied")), "tied: one tensor, not two copies"
    assert head.embed.abs().max() < 5, "FP8: the block scales applied (the e4m3 codes of a block reach 448)"
    hidden = variant.get("hidden", 64)
    assert head.config["hidden_size"] == hidden and head.config["vocab_size"] == 256
    assert head.config["intermediate_size"] == 128 and head.config["num_key_value_heads"] == 2
    ident = head.identity
    assert (ident["architecture"], ident["num_layers"], ident["hidden_size"]) == ("LlamaForCausalLM", 4, hidden)
    big = [f for f in ident["files"] if f["size"] > weights.FULL_HASH_BYTES]
    assert big and all(f["sha256"] is None and len(f["sampled_sha256"]) == 64 for f in big)
    assert head.target_config["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "one-file"])
def test_the_speculators_import_reads_the_final_norm_alone(tmp_path, sharded):
    from eagle_io.interop.speculators import TargetNorm

    root, values = build_sparse_checkpoint(tmp_path / "t", paper_bytes=PAPER, sharded=sharded)
    norm = TargetNorm.from_checkpoint(root)
    assert torch.equal(norm.weight, values["norm"]) and norm.eps == 1e-5


def test_the_head_is_read_in_memory_bounded_by_its_size(tmp_path):
    """A 2 x 64 MB head of a 300 GB checkpoint: the process's peak grows by about what it reads (measured after a
    small checkpoint's head was read in the same process, so the libraries it imports are not counted)."""
    root, _ = build_sparse_checkpoint(tmp_path / "t", hidden=1024, vocab=32768, layers=4, paper_bytes=PAPER)
    small, _ = build_sparse_checkpoint(tmp_path / "s", paper_bytes=PAPER)
    code = (
        "import resource, sys; from eagle_io.draft import load_target_head; load_target_head(sys.argv[2]); "
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; h = load_target_head(sys.argv[1]); "
        "print(h.embed.numel() * 2 + h.lm_head.numel() * 2, "
        "(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)"
    )
    env = dict(os.environ, EAGLE_IO_CACHE=str(tmp_path / "cache"))
    argv = [sys.executable, "-c", code, str(root), str(small)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    head_bytes, grown = map(int, out.stdout.split())
    assert head_bytes == 2 * 32768 * 1024 * 2
    assert grown < 1.5 * head_bytes, f"peak grew {grown / 1e6:.0f} MB reading a {head_bytes / 1e6:.0f} MB head"


def test_identity_takes_seconds_is_cached_and_the_full_sha256_is_there_on_request(tmp_path, monkeypatch):
    root, _ = build_sparse_checkpoint(tmp_path / "t", paper_bytes=PAPER)
    t0 = time.perf_counter()
    files = weights.target_files(root)
    assert time.perf_counter() - t0 < 20
    names = [f["name"] for f in files]
    assert names == sorted(p.name for p in root.iterdir()), "config, index and every shard"
    index = next(f for f in files if f["name"] == "model.safetensors.index.json")
    assert index["sha256"] == hashlib.sha256((root / index["name"]).read_bytes()).hexdigest()
    calls = []
    real = weights._sampled_sha256
    monkeypatch.setattr(weights, "_sampled_sha256", lambda p, n: calls.append(p.name) or real(p, n))
    assert weights.target_files(root) == files and calls == [], "the second time: from the cache"
    shard = root / "model-00001-of-00003.safetensors"
    with open(shard, "r+b") as f:  # one byte of the embedding (in the shard's first sampled block)
        f.seek(8 + int.from_bytes(f.read(8), "little") + 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    again = weights.target_files(root)
    assert calls == [shard.name], "a changed file (its modification time) is sampled again, the others not"
    changed = [a["name"] for a, b in zip(files, again, strict=True) if a != b]
    assert changed == [shard.name]
    diffs = target_differences({"files": files}, {"files": again})
    assert diffs == [f"the files' sampled sha256 differ: {shard.name} ({files[1]['sampled_sha256'][:12]}... "
                     f"recorded, {again[1]['sampled_sha256'][:12]}... here)"]  # fmt: skip
    small, _ = build_sparse_checkpoint(tmp_path / "s", paper_bytes=80 << 20, sharded=False)
    full = weights.target_files(small, full_sha256=True)
    one = next(f for f in full if f["name"] == "model.safetensors")
    assert one["size"] > weights.FULL_HASH_BYTES and one["sampled_sha256"]
    assert one["sha256"] == hashlib.sha256((small / "model.safetensors").read_bytes()).hexdigest()
    assert next(f for f in weights.target_files(small) if f["name"] == "model.safetensors")["sha256"] is None
    monkeypatch.setenv(weights.FULL_SHA256_ENV, "1")  # any command's identity, asked for in full
    assert weights.target_files(small) == full


def test_a_record_written_before_the_sampled_identity_still_matches():
    """Datasets recorded every file's sha256 (or sizes only); today's identity samples large files: they compare by
    what both hold, so the same target passes and another size does not."""
    old = {"files": [{"name": "config.json", "size": 10, "sha256": "aa" * 32},
                     {"name": "model.safetensors", "size": 5 << 30, "sha256": "bb" * 32}]}  # fmt: skip
    big = {"name": "model.safetensors", "size": 5 << 30, "sha256": None, "sampled_sha256": "cc" * 32}
    new = {"files": [{"name": "config.json", "size": 10, "sha256": "aa" * 32}, big]}
    assert target_differences(old, new) == []
    other = json.loads(json.dumps(new))
    other["files"][1]["size"] += 2
    assert target_differences(old, other) == [
        f"the files' size differ: model.safetensors ({5 << 30} recorded, {(5 << 30) + 2} here)"
    ]
    unhashed = {"files": [{"name": "config.json", "size": 10}, {"name": "model.safetensors", "size": 5 << 30}]}
    assert target_differences(unhashed, new) == [], "a record of sizes alone (hash_files=False) compares sizes"
    assert target_differences(unhashed, other)[0].startswith("the files' size differ: model.safetensors")


def test_a_whole_model_load_refuses_what_cannot_fit_with_the_figures(tmp_path, capsys):
    from eagle_io.capturing.models import load_target

    root, _ = build_sparse_checkpoint(tmp_path / "t", paper_bytes=PAPER)
    params = sum(
        h.shape[0] * (h.shape[1] if len(h.shape) > 1 else 1) for h in weights.checkpoint_tensors(root).values()
    )
    assert params * 4 > 600e9
    with pytest.raises(InvalidArgumentError) as e:
        load_target(root)
    msg = str(e.value)
    assert f"{params / 1e9:,.2f} B parameters as float32: {human_bytes(params * 4)} of weights on cpu" in msg
    assert "cannot fit" in msg and "--backend sglang" in msg and "--server" in msg
    out = tmp_path / "ds"
    argv = ["generate", "--model", str(root), "--out", str(out), "--limit", "1", "--no-disk-check"]
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert "where     --backend hf: transformers runs the whole target in this process, on the CPU" in cap.out
    assert "cannot fit" in cap.err and "--backend hf loads the whole target in this process" in cap.err


def _constant_teacher(hidden: int, vocab: int, token: int) -> torch.Tensor:
    """An lm_head whose argmax over positive states is ``token``: its row is all 1, the others at most 0.3."""
    head = torch.rand(vocab, hidden, generator=torch.Generator().manual_seed(1)) * 0.6 - 0.3
    head[token] = 1.0
    return head


def test_vocab_map_train_check_serving_and_offline_eval_draft_on_the_head_alone(tmp_path, capsys):
    """A dataset recorded for the sparse target (positive states, so its lm_head's argmax is one token): train-draft
    learns that token (only the checkpoint's own lm_head makes it the teacher), check-serving passes, and offline
    eval-draft measures the full chain accepted; a live eval-draft needs the whole target and refuses it."""
    torch.set_num_threads(1)
    token, hidden, vocab = 7, 64, 256
    root, values = build_sparse_checkpoint(
        tmp_path / "target",
        hidden=hidden,
        vocab=vocab,
        paper_bytes=PAPER,
        lm_head=_constant_teacher(hidden, vocab, token),
    )
    ident = load_target_head(root).identity
    meta = eagle3_metadata(
        target_info=ident, aux_layer_ids=[1, 2, 3], dtype="bfloat16", tokenizer_identity=None, max_length=None
    )
    ds = tmp_path / "ds"
    g = torch.Generator().manual_seed(0)
    with eagle_io.ShardWriter(ds, eagle_io.eagle3_schema(hidden), meta) as w:
        for i in range(16):
            ids = torch.randint(0, vocab, (24,), generator=g)
            ids[::3] = token
            w.write(i, {"input_ids": ids, "loss_mask": torch.ones(24, dtype=torch.uint8),
                        "aux_hidden_states": torch.randn(24, 3 * hidden, generator=g).to(torch.bfloat16),
                        "hidden_states": (0.5 + torch.rand(24, hidden, generator=g)).to(torch.bfloat16)})  # fmt: skip
    assert (values["lm_head"].float() @ (0.5 + torch.rand(100, hidden)).T).argmax(0).eq(token).all()
    vm = tmp_path / "vm.safetensors"
    assert main(["vocab-map", str(ds), "--draft-vocab-size", "32", "--out", str(vm)]) == 0
    draft = tmp_path / "draft"
    t0 = time.perf_counter()
    argv = ["train-draft", str(ds), "--out", str(draft), "--target-model", str(root), "--vocab-map", str(vm),
            "--steps", "30", "--lr", "0.01", "--warmup-steps", "0", "--eval-samples", "4", "--max-length", "24",
            "--accept-steps", "2", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    trained = json.loads((draft / "train_summary.json").read_text())
    assert trained["final"]["offline"]["accept_length"] > 2.9, trained["final"]
    capsys.readouterr()
    argv = ["check-serving", "--target", str(root), "--draft", str(draft), "--dataset", str(ds)]
    assert main([*argv, "--speculative-algorithm", "EAGLE3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(argv) == 1, "the same draft served without EAGLE3: refused from the headers alone"
    assert "eagle3-draft-wrong-algorithm" in capsys.readouterr().out
    argv = ["eval-draft", "--draft", str(draft), "--target", str(root), "--dataset", str(ds), "--prompts", "0",
            "--num-steps", "2", "--max-length", "24", "--json", "--no-profile"]  # fmt: skip
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["live"] is None and res["offline"]["samples"] == 4
    assert res["offline"]["accept_length"] == trained["final"]["offline"]["accept_length"]
    assert time.perf_counter() - t0 < 120
    argv[argv.index("--prompts") + 1] = "1"
    assert main(argv) == 2
    assert "cannot fit" in capsys.readouterr().err


def test_a_head_that_cannot_be_read_is_named(tmp_path):
    root, _ = build_sparse_checkpoint(tmp_path / "t", paper_bytes=1 << 20)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.embed_tokens.weight"] = "model-00002-of-00003.safetensors"
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"tensors not in the shard it names: \['model.embed_tokens.weight'\]"):
        load_target_head(root)
    os.remove(root / "model.safetensors.index.json")
    (root / "model-00001-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no embed_tokens\.weight among the checkpoint's"):
        load_target_head(root)


def test_generate_says_where_the_target_runs_and_refuses_what_cannot_fit(tmp_path, capsys, monkeypatch):
    """A 161 B-parameter checkpoint (322 GB stored as bf16) on 8 GPUs of 141 GB free: tp 8 fits (40 GB a GPU), tp 2
    does not (161 GB a GPU), tp 8 x dp 2 takes 16 GPUs; on the CPU it needs 322 GB of host memory."""
    from eagle_io import host
    from eagle_io.cli.target_plan import hf_plan, sglang_plan

    root, _ = build_sparse_checkpoint(tmp_path / "t", paper_bytes=PAPER)
    stored = sum(h.end - h.start for h in weights.checkpoint_tensors(root).values())
    params = stored // 2
    monkeypatch.setattr(host, "gpu_memory", lambda: [(141 * 10**9, 143 * 10**9)] * 8)
    sglang_plan(str(root), {"tp_size": 8, "dp_size": 1})
    line = capsys.readouterr().out
    assert line == (
        f"where     --backend sglang: sglang.launch_server, tp 8 x dp 1 on 8 GPU(s): {params / 1e9:,.2f} B parameters, "
        f"{human_bytes(stored)} as stored, {human_bytes(stored / 8)} per GPU; 8 visible, the least free of them "
        "141.00 GB\n"
    )
    with pytest.raises(InvalidArgumentError, match=r"more than the 141\.00 GB free .* raise --tp-size"):
        sglang_plan(str(root), {"tp_size": 2, "dp_size": 1})
    with pytest.raises(InvalidArgumentError, match="takes 16 GPUs, 8 visible here"):
        sglang_plan(str(root), {"tp_size": 8, "dp_size": 2})
    with pytest.raises(InvalidArgumentError, match=r"device=cpu holds the whole target in host memory, 1 time\(s\)"):
        sglang_plan(str(root), {"tp_size": 1, "dp_size": 1, "device": "cpu"})
    capsys.readouterr()
    argv = ["generate", "--model", str(root), "--out", str(tmp_path / "ds"), "--backend", "sglang", "--tp-size", "2"]
    assert main(argv) == 2, "refused before any server launches"
    cap = capsys.readouterr()
    assert "tp 2 x dp 1 on 2 GPU(s)" in cap.out and "it cannot fit; raise --tp-size" in cap.err
    small, _ = build_sparse_checkpoint(tmp_path / "s", paper_bytes=1 << 20, sharded=False)
    hf_plan(str(small), "float32")
    n = sum(h.end - h.start for h in weights.checkpoint_tensors(small).values()) // 2
    out = capsys.readouterr().out
    assert out.startswith(
        "where     --backend hf: transformers runs the whole target in this process, on the CPU: "
        f"{n / 1e9:,.2f} B parameters as float32: {human_bytes(n * 4)} of weights on cpu, "
    ) and out.endswith(" available\n")


def test_a_capture_recorded_with_every_files_sha256_resumes_under_the_sampled_identity(tmp_path):
    """A capture started before the sampled identity recorded its large weight file's full sha256; resumed now, the
    same target (same sizes) continues it under the record it started with, and another size is refused."""
    from eagle_io.capturing.options import CaptureOptions
    from eagle_io.capturing.store import SampleStore
    from eagle_io.errors import IncompatibleDatasetError

    h, config = 8, {"name": "config.json", "size": 10, "sha256": "aa" * 32}
    old = {"num_layers": 4, "hidden_size": h, "vocab_size": 50, "architecture": "LlamaForCausalLM", "model_id": "m",
           "files": [config, {"name": "model.safetensors", "size": 5 << 30, "sha256": "bb" * 32}]}  # fmt: skip
    big = {"name": "model.safetensors", "size": 5 << 30, "sha256": None, "sampled_sha256": "cc" * 32}
    new = dict(old, files=[config, big])

    def put(store, sid):
        x = torch.randn(6, 4 * h, generator=torch.Generator().manual_seed(sid))
        store.put(sid, torch.arange(6), torch.ones(6, dtype=torch.uint8), x[:, : 3 * h], x[:, 3 * h :])

    store = SampleStore.create(tmp_path / "ds", CaptureOptions(), aux_layer_ids=[1, 2, 3], target_info=old)
    put(store, 0)
    store.close(complete=False)
    resume = CaptureOptions(writer_options={"resume": True})
    store = SampleStore.create(tmp_path / "ds", resume, aux_layer_ids=[1, 2, 3], target_info=new)
    assert store.done == {0}
    put(store, 1)
    manifest = store.close()
    assert manifest["metadata"]["target_model"]["files"] == old["files"], "the record it started with"
    ds = eagle_io.Dataset(tmp_path / "ds")
    assert sorted(ds.entry(i).sample_id for i in range(len(ds))) == [0, 1]
    other = dict(new, files=[config, dict(big, size=(5 << 30) + 2)])
    with pytest.raises(IncompatibleDatasetError, match="target_model"):
        SampleStore.create(tmp_path / "ds", resume, aux_layer_ids=[1, 2, 3], target_info=other)
