"""FP8 storage (docs/FORMAT.md 3.1, 4.6): the writer quantises, the readers dequantise, the torch functions agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import eagle_io
from eagle_io import TensorSpec
from eagle_io.errors import SchemaError
from eagle_io.store import fp8, reference


def states(n: int = 300, w: int = 96, seed: int = 0) -> torch.Tensor:
    """Hidden-state-like rows: most channels ~N(0, 1), channel 7 an outlier x 80, row 4 all zero, one subnormal."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, w, generator=g)
    x[:, 7] *= 80.0
    x[4] = 0.0
    x[9, 0] = 1e-39  # a float32 subnormal (bf16 keeps it: same exponent range)
    return x


def write(tmp_path, x: torch.Tensor, dtype: str = "bfloat16", block: int | None = None, name: str = "d"):
    specs = [TensorSpec("ids", "int64"), TensorSpec("x", dtype, x.shape[1], "float8_e4m3fn", block)]
    w = eagle_io.ShardWriter(tmp_path / name, specs, {}, chunk_bytes=8192)
    w.write(0, {"ids": torch.arange(x.shape[0]), "x": x.to(getattr(torch, dtype))})
    w.close()
    return tmp_path / name, w.stats()


@pytest.mark.parametrize(
    ("dtype", "block"), [("bfloat16", None), ("bfloat16", 16), ("bfloat16", 40), ("float32", None)]
)
def test_round_trip_is_within_the_documented_bound(tmp_path, dtype, block):
    x = states().to(getattr(torch, dtype))
    root, stats = write(tmp_path, x, dtype, block)
    y = eagle_io.Dataset(root)[0]["x"]
    assert y.dtype == x.dtype and y.shape == x.shape
    xs, ys = x.float(), y.float()
    # Bound (docs/FORMAT.md 3.1): half an FP8 step, 2^-4 |x|, or scale / 1024 for subnormals; plus the rounding into
    # the output dtype (2^-9 |x| for bf16).
    b = block or x.shape[1]
    blocks = torch.nn.functional.pad(xs.abs(), (0, -x.shape[1] % b)).reshape(x.shape[0], -1, b)
    scale = (blocks.amax(-1) / 448.0).repeat_interleave(b, 1)[:, : x.shape[1]]
    bound = torch.maximum(xs.abs() / 16, scale / 1024) * 1.001 + xs.abs() / 256
    assert ((ys - xs).abs() <= bound).all()
    assert torch.equal(y[4], torch.zeros_like(y[4]))  # the all-zero row
    assert stats["fp8_values"] == x.numel() and stats["fp8_clamped"] == 0
    assert stats["fp8_zero_blocks"] == -(-x.shape[1] // b)  # the zero row's blocks
    rel = ((ys - xs).norm() / xs.norm()).item()
    assert 0.001 < rel < 0.03


def test_scales_and_bytes_as_stored_are_exact(tmp_path):
    x = states().to(torch.bfloat16)
    for block in (None, 16):
        root, _ = write(tmp_path, x, block=block, name=f"b{block}")
        item = eagle_io.Dataset(root, dequantize=False)[0]
        q, scales, clamped = fp8.quantize(x, block)
        assert item["x"].dtype == torch.float8_e4m3fn and item["x_scales"].dtype == torch.float32
        assert torch.equal(item["x"].view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(item["x_scales"], scales) and clamped == 0
        b = block or x.shape[1]
        amax = torch.nn.functional.pad(x.float().abs(), (0, -x.shape[1] % b)).reshape(x.shape[0], -1, b).amax(-1)
        assert torch.equal(item["x_scales"], amax / 448.0)  # scale = amax / 448, exactly, in float32
        assert (item["x"].float().abs().amax(1)[item["x_scales"][:, 0] > 0] == 448.0).all() or block
        # dequantising on the "GPU" side gives exactly what the reader gives
        y = fp8.dequantize(item["x"], item["x_scales"], block)
        assert torch.equal(y, eagle_io.Dataset(root)[0]["x"])


def test_reference_reader_agrees_bit_for_bit(tmp_path):
    x = states(n=500, w=72)
    for dtype, block in (("bfloat16", None), ("bfloat16", 32), ("float32", 8)):
        root, _ = write(tmp_path, x, dtype, block, name=f"{dtype}{block}")
        ours = eagle_io.Dataset(root)[0]["x"]
        ref = reference.open_dataset(root).read(0)["x"]
        view = torch.int16 if dtype == "bfloat16" else torch.float32
        assert np.array_equal(ref.view(ours.view(view).numpy().dtype), ours.view(view).numpy())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_values_are_refused_naming_token_and_channel(tmp_path, bad):
    x = states()
    x[12, 5] = bad
    specs = [TensorSpec("x", "bfloat16", x.shape[1], "float8_e4m3fn")]
    with eagle_io.ShardWriter(tmp_path / "d", specs, {}) as w:
        with pytest.raises(SchemaError, match=r"token 12, channel 5") as e:
            w.write(3, {"x": x.to(torch.bfloat16)})
        assert e.value.sample_id == 3
        w.write(3, {"x": states().to(torch.bfloat16)})  # the id was not taken by the refused sample
    assert len(eagle_io.Dataset(tmp_path / "d")) == 1


def test_fp8_on_the_whole_row_shrinks_real_shaped_states(tmp_path):
    # Channels of their own magnitudes (log-normal RMS), rows of their own scale: the layout-3 model's case.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 256, generator=g) * torch.exp(torch.randn(256, generator=g))
    x *= torch.exp(0.5 * torch.randn(2000, 1, generator=g))
    _, stats = write(tmp_path, x)
    ratio = x.numel() * 2 / stats["stored_bytes"]
    assert ratio > 2.05, ratio  # raw FP8 with its scales: 2 x 256 / (256 + 4) = 1.97


def test_schema_refuses_fp8_where_it_cannot_apply():
    with pytest.raises(eagle_io.errors.InvalidArgumentError):
        TensorSpec("x", "bfloat16", 8, "float8_e5m2")
    with pytest.raises(eagle_io.errors.InvalidArgumentError):
        TensorSpec("x", "bfloat16", 8, None, 4)
    with pytest.raises(eagle_io.errors.InvalidArgumentError, match="FP8 storage needs"):
        eagle_io.ShardWriter("/nonexistent-never-created", [TensorSpec("ids", "int64", None, "float8_e4m3fn")], {})


def test_capture_with_fp8_precision_stores_quantised_states(tmp_path):
    from test_capture_session import samples, stored, tiny_target

    model, info = tiny_target()
    batch = samples([9, 5])
    with eagle_io.capture(model, tmp_path / "bf16", target_info=info, threads=1) as cap:
        cap.submit(batch)
    with eagle_io.capture(model, tmp_path / "fp8", target_info=info, threads=1, precision="fp8") as cap:
        cap.submit(batch)
    ref, got = stored(tmp_path / "bf16"), stored(tmp_path / "fp8")
    ds = eagle_io.Dataset(tmp_path / "fp8")
    assert [s.precision for s in ds.schema] == [None, None, "float8_e4m3fn", "float8_e4m3fn"]
    for s in batch:
        for name in ("aux_hidden_states", "hidden_states"):
            x, y = ref[s.index][name], got[s.index][name]
            assert y.dtype == torch.bfloat16 and y.shape == x.shape
            # exactly the torch quantisation of the bf16 states the lossless capture stored
            q, scales, _ = fp8.quantize(x)
            assert torch.equal(y, fp8.dequantize(q, scales))
            assert 0 < ((y.float() - x.float()).norm() / x.float().norm()).item() < 0.03
    with pytest.raises(eagle_io.errors.InvalidArgumentError, match="precision must be"):
        eagle_io.capture(model, tmp_path / "bad", target_info=info, precision="int4")


def test_transcode_to_fp8_and_verify(tmp_path):
    from eagle_io.cli import main

    x = states(n=120, w=48)
    specs = [TensorSpec("ids", "int64"), TensorSpec("x", "bfloat16", 48), TensorSpec("mask", "uint8")]
    with eagle_io.ShardWriter(tmp_path / "src", specs, {"target_model": "t"}) as w:
        for i in range(3):
            w.write(
                10 + i,
                {"ids": torch.arange(120), "x": (x * (i + 1)).bfloat16(), "mask": torch.ones(120, dtype=torch.uint8)},
                f"k{i}",
            )
    assert main(["transcode", str(tmp_path / "src"), "--out", str(tmp_path / "dst"), "--precision", "fp8"]) == 0
    src, dst = eagle_io.Dataset(tmp_path / "src"), eagle_io.Dataset(tmp_path / "dst")
    assert [s.precision for s in dst.schema] == [None, "float8_e4m3fn", None]
    assert dst.metadata == src.metadata and len(dst) == 3
    for pos in range(3):
        assert dst.entry(pos) == src.entry(pos)
        a, b = src[pos], dst[pos]
        assert torch.equal(a["ids"], b["ids"]) and torch.equal(a["mask"], b["mask"])
        q, scales, _ = fp8.quantize(a["x"])
        assert torch.equal(b["x"], fp8.dequantize(q, scales))
    assert eagle_io.Dataset.verify(tmp_path / "dst") == []
    # back to bf16: the FP8 values are kept exactly (they are bf16-representable after rounding)
    assert main(["transcode", str(tmp_path / "dst"), "--out", str(tmp_path / "back"), "--precision", "bf16"]) == 0
    back = eagle_io.Dataset(tmp_path / "back")
    assert back.schema == src.schema and torch.equal(back[1]["x"], dst[1]["x"])


def test_shard_dataset_mixes_bf16_and_fp8_only_when_asked(tmp_path):
    from conftest import make_sample

    roots = {}
    for name, precision, ids in (("bf16", None, range(0, 3)), ("fp8", "fp8", range(3, 6))):
        roots[name] = tmp_path / name
        schema = eagle_io.eagle3_schema(32, precision=precision)
        with eagle_io.ShardWriter(roots[name], schema, {"target_model": "tiny"}) as w:
            for i in ids:
                w.write(i, make_sample(i, 20))
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"stored as float8_e4m3fn.*mix_precisions=True"):
        eagle_io.ShardDataset([roots["bf16"], roots["fp8"]])
    ds = eagle_io.ShardDataset([roots["bf16"], roots["fp8"]], mix_precisions=True)
    assert len(ds) == 6
    for i in range(6):
        item = ds[i]
        item_id = item["sample_id"]
        want = make_sample(item_id, 20)
        x, y = want["aux_hidden_states"].float(), item["aux_hidden_states"].float()
        assert item["aux_hidden_states"].dtype == torch.bfloat16
        if item_id < 3:
            assert torch.equal(x, y)
        else:
            assert 0 < ((y - x).norm() / x.norm()).item() < 0.03
    # The follow view takes the same option (and reads the same values).
    with pytest.raises(eagle_io.IncompatibleDatasetError, match=r"mix_precisions=True"):
        list(eagle_io.ShardDataset([roots["bf16"], roots["fp8"]], follow=True, timeout_s=5))
    followed = eagle_io.ShardDataset([roots["bf16"], roots["fp8"]], follow=True, mix_precisions=True, timeout_s=5)
    got = {item["sample_id"]: item["aux_hidden_states"] for item in followed}
    assert sorted(got) == list(range(6))
    for i in range(6):
        item = ds[i]
        assert torch.equal(got[item["sample_id"]], item["aux_hidden_states"])


def test_transcode_refuses_an_output_nested_with_its_source(small_dataset, capsys):
    """`eagle-io transcode ds --out ds/shards` wrote the new dataset inside the one it read."""
    from eagle_io.cli import main
    from eagle_io.store.transcode import transcode

    root, _ = small_dataset
    files = sorted(root.parent.rglob("*"))
    for out in (root / "shards", root / "new", root.parent):
        assert main(["transcode", str(root), "--out", str(out), "--precision", "fp8"]) == 2
        err = capsys.readouterr().err
        assert "InvalidArgumentError" in err and f"'{out}'" in err and f"'{root}'" in err, err
        assert "one lies inside the other" in err
    assert sorted(root.parent.rglob("*")) == files, "nothing written"
    with pytest.raises(eagle_io.InvalidArgumentError, match="lies inside"):
        transcode(root / "manifest.json", root / "a" / "b", "fp8")
