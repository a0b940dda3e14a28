"""FP8 quantisation where the copy happens (issue 11): the capture ring quantises a sample's FP8 tensors on their
device before the copy (``eagle_io.store.fp8.quantize_rows``), the writer stores the scales and bytes as given, and
the shards are byte for byte those of the writer's own quantisation. ``quantize_on_device=True`` forces the torch
path on CPU tensors, so all but the CUDA test run without a GPU."""

from __future__ import annotations

import pytest
import torch

import eagle_io
from conftest import make_sample
from eagle_io import TensorSpec
from eagle_io.capturing.options import CaptureOptions
from eagle_io.capturing.ring import RingSink
from eagle_io.capturing.store import SampleStore
from eagle_io.errors import InvalidArgumentError, SchemaError
from eagle_io.store import fp8

INFO = {"num_layers": 4, "hidden_size": 32, "vocab_size": 49152}


def edge_sample(sample_id: int, n: int = 40) -> dict[str, torch.Tensor]:
    """``make_sample`` with the quantiser's edge cases: an all-zero row, an all -0.0 row, an outlier channel and a
    bf16 subnormal."""
    s = make_sample(sample_id, n)
    aux, hidden = s["aux_hidden_states"], s["hidden_states"]
    aux[3] = 0.0
    hidden[5] = -0.0
    aux[:, 7] *= 300.0
    hidden[6, 2] = 1e-39
    return s


def shard_bytes(root) -> list[bytes]:
    return [p.read_bytes() for p in sorted((root / "shards").iterdir())]


def ring_write(root, samples, *, quantize_on_device, block=None, device="cpu"):
    schema = eagle_io.eagle3_schema(32, precision="fp8")
    if block is not None:
        schema = [TensorSpec(s.name, s.dtype, s.width, s.precision, block if s.precision else None) for s in schema]
    w = eagle_io.ShardWriter(root, schema, {}, threads=2, chunk_bytes=4096)
    sink = RingSink(w, ring_bytes=1 << 20, batch=3, quantize_on_device=quantize_on_device)
    for i, s in samples.items():
        assert sink.put(i, {k: v.to(device) for k, v in s.items()})
    sink.close()
    return sink.stats()  # final once the ring drained


@pytest.mark.parametrize("block", [None, 24])
def test_quantize_rows_is_the_cores_quantiser_bit_for_bit(tmp_path, block):
    x = edge_sample(1)["aux_hidden_states"]
    specs = [TensorSpec("x", "bfloat16", x.shape[1], "float8_e4m3fn", block)]
    with eagle_io.ShardWriter(tmp_path / "d", specs, {}) as w:
        w.write(0, {"x": x})
    rows, clamped = fp8.quantize_rows(x, block)
    item = eagle_io.Dataset(tmp_path / "d", dequantize=False)[0]
    s = item["x_scales"].shape[1]
    assert rows.dtype == torch.uint8 and rows.shape == (x.shape[0], 4 * s + x.shape[1])
    assert torch.equal(rows[:, : 4 * s].contiguous().view(torch.float32), item["x_scales"])
    assert torch.equal(rows[:, 4 * s :], item["x"].view(torch.uint8))
    assert rows[3].max() == 0  # the zero row: scale 0, bytes 0
    assert clamped.dim() == 0 and int(clamped) == 0


def test_clamps_are_counted_as_the_core_counts_them(tmp_path):
    # A float32 row whose scale (amax / 448) is an f32 subnormal rounded down (627 / 448 ulps -> 1): x / scale
    # overshoots 448 and saturates for +-627 ulps; a row whose amax maps to 448 exactly does not.
    ulp = 2.0**-149
    x = torch.tensor([[627 * ulp, 400 * ulp, -627 * ulp, 100 * ulp], [464.0, 1.0, 0.0, 0.0]]).float()
    specs = [TensorSpec("x", "float32", 4, "float8_e4m3fn")]
    with eagle_io.ShardWriter(tmp_path / "d", specs, {}) as w:
        w.write(0, {"x": x})
        core = w.stats()["fp8_clamped"]
    x0 = x.clone()
    _, clamped = fp8.quantize_rows(x)
    assert core == int(clamped) == 2
    assert torch.equal(x, x0)  # a float32 input is not the quantiser's scratch buffer


@pytest.mark.parametrize("block", [None, 24])
def test_quantising_before_the_copy_writes_the_same_shard_bytes(tmp_path, block):
    samples = {i: edge_sample(i, [7, 40, 130][i % 3]) for i in range(7)}
    samples[7] = make_sample(7, 0)  # a 0-token sample: empty rows quantise too
    host = ring_write(tmp_path / "host", samples, quantize_on_device=None, block=block)
    dev = ring_write(tmp_path / "dev", samples, quantize_on_device=True, block=block)
    assert shard_bytes(tmp_path / "host") == shard_bytes(tmp_path / "dev")
    assert (host["fp8_quantized_before_copy"], dev["fp8_quantized_before_copy"]) == (0, 8)
    for key in ("fp8_values", "fp8_clamped", "fp8_zero_blocks", "samples", "raw_bytes"):
        assert host[key] == dev[key], key
    assert dev["fp8_values"] == sum(4 * 32 * [7, 40, 130][i % 3] for i in range(7))
    assert dev["fp8_zero_blocks"] > 0
    # What crosses the copy: per token the ids and mask (9 bytes), then FP8 bytes and f32 scales instead of bf16.
    tokens = sum([7, 40, 130][i % 3] for i in range(7))
    scales = 2 if block is None else 4 + 2
    assert host["committed_bytes"] == tokens * (9 + 2 * 128)
    assert dev["committed_bytes"] == tokens * (9 + 128 + 4 * scales)


def test_the_nonfinite_policy_applies_before_quantising_on_either_path(tmp_path):
    samples = {i: make_sample(i, 20) for i in range(4)}
    samples[2]["hidden_states"][7, 3] = float("nan")
    counts = {}
    for name, where in (("host", None), ("dev", True)):
        options = CaptureOptions(
            target_info=INFO, precision="fp8", nonfinite="skip", quantize_on_device=where, writer_options={"threads": 1}
        )
        store = SampleStore.create(tmp_path / name, options, aux_layer_ids=[1, 2, 3])
        for i, s in samples.items():
            store.put(i, s["input_ids"], s["loss_mask"], s["aux_hidden_states"], s["hidden_states"])
        store.close()
        counts[name] = {**store.counts, **store.stats()}
    assert shard_bytes(tmp_path / "host") == shard_bytes(tmp_path / "dev")
    assert counts["host"]["nonfinite_skipped"] == counts["dev"]["nonfinite_skipped"] == 1
    assert counts["dev"]["fp8_quantized_before_copy"] == 3
    with pytest.raises(InvalidArgumentError, match="quantize_on_device"):
        CaptureOptions(target_info=INFO, quantize_on_device="gpu")


@pytest.mark.parametrize("where", [None, True])
def test_a_nan_put_past_the_policy_is_refused_naming_sample_tensor_and_token(tmp_path, where):
    s = edge_sample(5, 20)
    s["aux_hidden_states"][11, 40] = float("inf")
    w = eagle_io.ShardWriter(tmp_path / "d", eagle_io.eagle3_schema(32, precision="fp8"), {}, threads=1)
    sink = RingSink(w, ring_bytes=1 << 20, quantize_on_device=where)
    sink.put(5, s)
    with pytest.raises(SchemaError, match=r'sample 5: tensor "aux_hidden_states".*token 11') as e:
        sink.close()
    assert e.value.sample_id == 5


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: quantises on the GPU before the copy")
def test_cuda_states_are_quantised_on_the_gpu_with_the_same_shard_bytes(tmp_path):
    samples = {i: edge_sample(i, [7, 40, 130][i % 3]) for i in range(7)}
    host = ring_write(tmp_path / "host", samples, quantize_on_device=None)
    gpu = ring_write(tmp_path / "gpu", samples, quantize_on_device=None, device="cuda")
    assert gpu["ring_pinned"] and gpu["fp8_quantized_before_copy"] == 7
    assert shard_bytes(tmp_path / "host") == shard_bytes(tmp_path / "gpu")
    for key in ("fp8_values", "fp8_clamped", "fp8_zero_blocks"):
        assert host[key] == gpu[key], key
    rows, clamped = fp8.quantize_rows(samples[1]["aux_hidden_states"].cuda())
    assert rows.is_cuda and clamped.is_cuda
    assert torch.equal(rows.cpu(), fp8.quantize_rows(samples[1]["aux_hidden_states"])[0])


def test_a_slot_declared_quantised_must_hold_the_stored_rows(tmp_path):
    for precision, n_bytes, match in ((None, 265, "stores no tensor as FP8"), ("fp8", 265, "holds 265 bytes")):
        w = eagle_io.ShardWriter(tmp_path / str(precision), eagle_io.eagle3_schema(32, precision=precision), {})
        sink = RingSink(w, ring_bytes=1 << 16)._sink
        slot = sink.reserve(n_bytes, 1.0, False)
        with pytest.raises(SchemaError, match=match):
            sink.commit(slot, 4, "", 1, fp8_clamped=0)  # 1 bf16 token (265 bytes) declared quantised (145 needed)
        sink.commit(slot, 4, "", 1, cancelled=True)
        sink.close()
