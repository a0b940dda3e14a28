"""`check_serving` models the draft SGLang 0.5.23 builds from the draft config: its class and config switches,
every tensor shape in the safetensors headers, the vocab map's values, positions and RoPE.

Each case was reported OK before these checks existed; the checkpoints are the sparse SpecForge-layout drafts of
test_serving_preflight (real shapes, no disk for the zeros)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_serving_preflight import H, N, V, by_code, eagle3_draft, issues, llama_target

from eagle_io.serving import check_serving
from eagle_io.sglang.compat import context_length
from eagle_io.sglang.draft_build import canonical_name, draft_build, tensor_problems


def test_fc_is_sized_from_the_draft_hidden_when_target_hidden_size_is_missing(tmp_path):
    """Target hidden 8192, draft hidden 4096, fc [4096, 24576], no target_hidden_size: SGLang's LlamaModel sizes fc
    as 3 x hidden_size = 12288 (``hasattr(config, "target_hidden_size")`` is false) and cannot load 24576."""
    t = llama_target(tmp_path, hidden=8192, layers=80)
    d = eagle3_draft(tmp_path, hidden=4096, fc_in=24576, target_hidden=None, eagle_ids=[1, 39, 76])
    fs = check_serving(t, d, algorithm="EAGLE3")
    assert issues(fs) == {"fc-width": "error", "target-hidden-size": "error"}
    f = by_code(fs, "fc-width")
    assert (
        "24576 != 3 aux layers" in f.message and "hidden_size (the config has no target_hidden_size) 4096" in f.message
    )
    assert "= 12288" in f.message and '"target_hidden_size": 8192' in f.fix
    assert '"target_hidden_size": 8192' in by_code(fs, "target-hidden-size").fix
    # with the key, SGLang builds this fc; the draft then keeps its own embedding (LlamaForCausalLM.set_embed
    # returns when target_hidden_size != hidden_size), which the checkpoint must hold
    d2 = eagle3_draft(tmp_path, hidden=4096, fc_in=24576, target_hidden=8192, eagle_ids=[1, 39, 76], name="d2")
    f = by_code(check_serving(t, d2, algorithm="EAGLE3"), "draft-tensor-missing")
    assert "embed_tokens.weight [1000, 4096]" in f.message
    emb = {"embed_tokens.weight": ("BF16", (V, 4096))}
    d3 = eagle3_draft(tmp_path, hidden=4096, fc_in=24576, target_hidden=8192, eagle_ids=[1, 39, 76], name="d3",
                      extra_tensors=emb)  # fmt: skip
    assert check_serving(t, d3, algorithm="EAGLE3") == []


def test_num_aux_hidden_states_beyond_the_captured_ids(tmp_path):
    """num_aux_hidden_states 4, three ids, fc 4 x H: SGLang sizes fc for four states and captures three."""
    t = llama_target(tmp_path)
    d = eagle3_draft(tmp_path, fc_in=4 * H, eagle_ids=[1, 3, 4], extra_config={"num_aux_hidden_states": 4})
    fs = check_serving(t, d, algorithm="EAGLE3")
    assert issues(fs) == {"aux-count": "error"}
    f = by_code(fs, "aux-count")
    assert "fc for 4 aux states (num_aux_hidden_states)" in f.message and "captures 3 ([2, 4, 5]" in f.message
    assert "drop num_aux_hidden_states" in f.fix


def test_every_tensor_shape_is_checked_against_the_config(tmp_path):
    t = llama_target(tmp_path)
    q = ("BF16", (4 * 16, H))  # q_proj of layer 0 reads cat(embeds, hidden): 2H wide, not H
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_tensors={"midlayer.self_attn.q_proj.weight": q})
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "draft-tensor-shape")
    assert f.severity == "error" and "midlayer.self_attn.q_proj.weight is [64, 64]" in f.message
    assert "allocates [64, 128]" in f.message
    d2 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], drop=("midlayer.mlp.down_proj.weight",), name="d2")
    f = by_code(check_serving(t, d2, algorithm="EAGLE3"), "draft-tensor-missing")
    assert "layers.0.mlp.down_proj.weight [64, 128]" in f.message
    d3 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_tensors={"lm_head.weight": ("BF16", (500, 32))}, name="d3")
    assert issues(check_serving(t, d3, algorithm="EAGLE3")) == {"draft-tensor-shape": "error"}


def test_norm_before_fc_and_its_weight_must_go_together(tmp_path):
    t = llama_target(tmp_path)
    norm = {"input_norm.weight": ("BF16", (3 * H,))}
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_tensors=norm)  # trained with it, config without
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "draft-tensor-ignored")
    assert "input_norm.weight [192]" in f.message and "norm_before_fc is off" in f.message
    on = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "norm_before_fc": True}}
    d2 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_config=on, name="d2")  # config with it, no weight
    assert issues(check_serving(t, d2, algorithm="EAGLE3")) == {"draft-tensor-missing": "error"}
    d3 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_config=on, extra_tensors=norm, name="d3")
    assert check_serving(t, d3, algorithm="EAGLE3") == []


def test_config_switches_on_the_eagle3_path(tmp_path):
    t = llama_target(tmp_path)
    off = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": False}}
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_config=off)
    assert issues(check_serving(t, d, algorithm="EAGLE3")) == {"aux-capture-disabled": "error"}
    gelu = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_config={"hidden_act": "gelu"}, name="gelu")
    assert issues(check_serving(t, gelu, algorithm="EAGLE3")) == {"draft-activation": "error"}
    tied = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_config={"tie_word_embeddings": True}, name="tied")
    f = by_code(check_serving(t, tied, algorithm="EAGLE3"), "draft-tensor-ignored")
    assert "lm_head.weight [500, 64]" in f.message and "tie_word_embeddings: false" in f.message


def test_d2t_values_are_checked(tmp_path):
    t = llama_target(tmp_path)
    past = torch.full((500,), 600, dtype=torch.int64)  # draft id i -> target id i + 600: past 1000 from i = 400
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], d2t_values=past)
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "d2t-values")
    assert f.severity == "error" and "outside the target vocabulary [0, 1000): 100 of 500" in f.message
    assert "first draft id 400 -> target id 1000" in f.message
    fl = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], d2t_values=torch.zeros(500), name="float")
    assert "d2t must be a 1-D integer tensor" in by_code(check_serving(t, fl, algorithm="EAGLE3"), "d2t-values").message
    # t2d marks 500 target ids, d2t has 400 entries (and draft_vocab_size says 400 too)
    few = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], draft_vocab=400, lm_head_rows=400, name="few",
                       d2t=500, d2t_values=torch.zeros(400, dtype=torch.int64))  # fmt: skip
    f = by_code(check_serving(t, few, algorithm="EAGLE3"), "d2t-values")
    assert "t2d.sum() = 500, len(d2t) = 400: must be equal" in f.message


def test_positions_are_the_targets_context_and_rope_is_compared(tmp_path):
    """A draft allowed 16,384 positions served at 40,960: SGLang hands the draft the target's context length."""
    t = llama_target(tmp_path, max_pos=40960)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], max_pos=16384)
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "draft-max-positions")
    assert f.severity == "error" and "40960" in f.message and "16384" in f.message
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in f.message and "--context-length 16384" in f.fix
    # rope scaling counts as SGLang counts it (get_context_length: factor x max_position_embeddings)
    yarn = {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    d2 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], max_pos=16384, extra_config=yarn, name="yarn")
    assert context_length({"max_position_embeddings": 16384, **yarn}) == 65536
    assert issues(check_serving(t, d2, algorithm="EAGLE3")) == {"draft-rope": "warning"}  # target has no scaling
    t2 = llama_target(tmp_path / "t2")
    theta = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_config={"rope_theta": 500000.0}, name="theta")
    (t2 / "config.json").write_text(
        (t2 / "config.json").read_text().replace('"rms_norm_eps"', '"rope_theta": 1e6, "rms_norm_eps"')
    )
    f = by_code(check_serving(t2, theta, algorithm="EAGLE3"), "draft-rope")
    assert "rope_theta 500000.0 != target rope_theta 1000000.0" in f.message


def test_the_build_model_follows_sglangs_two_eagle3_classes():
    llama = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "num_aux_hidden_states": 4,
             "eagle_aux_hidden_state_layer_ids": [1, 2]}  # fmt: skip
    assert (draft_build(llama).num_aux, draft_build(llama).num_aux_source) == (4, "num_aux_hidden_states")
    b = draft_build(llama)
    assert (b.hidden_size_in, b.fc_in) == (64, 256)  # no target_hidden_size: the draft's own hidden size
    mla = {**llama, "architectures": ["Eagle3DeepseekV2ForCausalLM"], "target_hidden_size": None}
    b = draft_build(mla)  # kimi_k25_eagle3.py: ignores num_aux_hidden_states, reads top-level ids, `or hidden_size`
    assert (b.num_aux, b.hidden_size_in, b.fc_in) == (2, 64, 128)
    assert canonical_name("model.midlayer.hidden_norm.weight") == "layers.0.hidden_norm.weight"
    assert canonical_name("aux_norm_mid.weight") == "fc_norm.1.weight"
    assert tensor_problems(draft_build({"architectures": ["LlamaForCausalLM"], "hidden_size": 8}), {}) == []


def test_a_correct_draft_of_each_size_is_clean(tmp_path):
    for n, eagle_ids in ((N, [1, 3, 4]), (32, None)):
        t = llama_target(tmp_path / str(n), layers=n)
        d = eagle3_draft(tmp_path / str(n), eagle_ids=eagle_ids, vocab=V)
        trained = None if eagle_ids else [2, n // 2, n - 3]  # no ids in the config: the default, trained on
        assert issues(check_serving(t, d, algorithm="EAGLE3", layer_ids=trained)) == {}


def test_a_draft_without_safetensors_is_not_reported_missing_everything(tmp_path):
    t = llama_target(tmp_path)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4])
    (d / "model.safetensors").rename(d / "pytorch_model.bin")  # not read: only safetensors headers are
    fs = check_serving(t, d, algorithm="EAGLE3")
    assert issues(fs) == {"fc-unknown": "warning"} and "pytorch_model.bin" in by_code(fs, "fc-unknown").message


def test_a_draft_as_wide_as_its_aux_states_is_served_without_fc(tmp_path):
    """SGLang runs fc only when the incoming width differs from the draft's embedding: two aux layers of a 64-wide
    target under a 128-wide draft (2 x 64 = 128) reach the draft unprojected. check-serving, the startup guard and
    eagle-io's own trainer (a one-layer dataset for a draft as wide as its target) refuse it."""
    from test_serving_plugin import facts

    from eagle_io.draft import build_draft
    from eagle_io.errors import IncompatibleDatasetError
    from eagle_io.serving import plugin

    t = llama_target(tmp_path)
    emb = {"embed_tokens.weight": ("BF16", (V, 2 * H))}  # target_hidden_size != hidden_size: the draft's own
    d = eagle3_draft(tmp_path, hidden=2 * H, fc_in=2 * H, eagle_ids=[1, 3], extra_tensors=emb)
    fs = check_serving(t, d, algorithm="EAGLE3")
    assert issues(fs) == {"fc-skipped": "error"}
    f = by_code(fs, "fc-skipped")
    assert "2 aux state(s) x target hidden 64 = 128 is the draft's own hidden size 128" in f.message
    assert "shape[-1] != embeds.shape[-1]" in f.message and "2 or more aux layers" in f.fix
    d3 = eagle3_draft(tmp_path, hidden=2 * H, fc_in=3 * H, eagle_ids=[1, 3, 4], extra_tensors=emb, name="d3")
    assert issues(check_serving(t, d3, algorithm="EAGLE3")) == {}  # 3 x 64 = 192 != 128: fc runs
    msg = plugin.startup_decision(facts(layers_to_capture=(2, 4), fc_in_width=128, draft_embed_width=128))
    assert msg is not None and "served without its fc" in msg
    head = __import__("test_train_draft").synthetic_head()
    with pytest.raises(IncompatibleDatasetError, match=r"aux layers \[5\].*served without its fc"):
        build_draft(head, {"hidden_size": head.config["hidden_size"], "aux_layer_ids": [5]}, 16)


def test_parameters_sglang_allocates_from_config_switches_must_be_in_the_checkpoint(tmp_path):
    """Every parameter the draft class builds for its config, switches included: Llama's o_proj bias under
    attention_bias (or bias, which llama.py reads as both), MLA's attention and MLP (kimi_k25_eagle3.py), whose loader
    never strips a model. prefix."""
    t = llama_target(tmp_path)
    d = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_config={"attention_bias": True})
    f = by_code(check_serving(t, d, algorithm="EAGLE3"), "draft-tensor-missing")
    assert "layers.0.self_attn.o_proj.bias [64]" in f.message and "attention_bias: true asks for it" in f.message
    fc_bias = {"fc.bias": ("BF16", (H,))}
    d2 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_config={"bias": True}, extra_tensors=fc_bias, name="d2")
    f = by_code(check_serving(t, d2, algorithm="EAGLE3"), "draft-tensor-missing")
    assert "layers.0.self_attn.o_proj.bias" in f.message and "bias: true" in f.message
    both = {**fc_bias, "midlayer.self_attn.o_proj.bias": ("BF16", (H,))}
    d3 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_config={"bias": True}, extra_tensors=both, name="d3")
    assert issues(check_serving(t, d3, algorithm="EAGLE3")) == {}
    d4 = eagle3_draft(tmp_path, eagle_ids=[1, 3, 4], extra_tensors={"midlayer.self_attn.o_proj.bias": ("BF16", (H,))},
                      name="d4")  # fmt: skip
    f = by_code(check_serving(t, d4, algorithm="EAGLE3"), "draft-tensor-ignored")
    assert "attention_bias (or bias) is off" in f.message

    mla_cfg = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "hidden_size": H, "target_hidden_size": H,
               "num_hidden_layers": 1, "num_attention_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16,
               "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "intermediate_size": 128,
               "vocab_size": V, "draft_vocab_size": 500, "bias": True}  # fmt: skip
    mla = {"fc.weight": (H, 3 * H), "fc.bias": (H,), "norm.weight": (H,), "lm_head.weight": (500, H),
           "layers.0.self_attn.q_a_proj.weight": (32, 2 * H),
           "layers.0.self_attn.kv_a_proj_with_mqa.weight": (20, 2 * H),
           "layers.0.self_attn.q_a_layernorm.weight": (32,), "layers.0.self_attn.q_b_proj.weight": (48, 32),
           "layers.0.self_attn.kv_a_layernorm.weight": (16,), "layers.0.self_attn.kv_b_proj.weight": (64, 16),
           "layers.0.self_attn.o_proj.weight": (H, 32), "layers.0.mlp.gate_up_proj.weight": (256, H),
           "layers.0.mlp.down_proj.weight": (H, 128), "layers.0.input_layernorm.weight": (H,),
           "midlayer.hidden_norm.weight": (H,), "layers.0.post_attention_layernorm.weight": (H,)}  # fmt: skip
    headers = {name: SimpleNamespace(shape=shape) for name, shape in mla.items()}
    b = draft_build(mla_cfg)
    assert tensor_problems(b, headers) == []
    del headers["layers.0.self_attn.q_b_proj.weight"]
    (p,) = tensor_problems(b, headers)
    assert (p.kind, p.canonical, p.expected) == ("missing", "layers.0.self_attn.q_b_proj.weight", (48, 32))
    prefixed = {("model." + n if n.startswith("fc.") else n): h for n, h in headers.items()}
    missing = {p.canonical: p.detail for p in tensor_problems(b, prefixed) if p.kind == "missing"}
    assert "model.fc.weight, which Eagle3DeepseekV2ForCausalLM.load_weights never loads" in missing["fc.weight"]
    assert "model.fc.bias" in missing["fc.bias"]
    # LlamaForCausalLMEagle3 tries name, then "model." + name: model.fc.weight loads, model.lm_head.weight does not
    # (lm_head is top-level). It passed as the head, leaving SGLang's uninitialised.
    llama = draft_build({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H, "num_attention_heads": 4,
                         "vocab_size": V, "draft_vocab_size": 500, "intermediate_size": 128})  # fmt: skip
    full = {n: SimpleNamespace(shape=s) for n, s in llama.expected.items() if n in llama.required}
    assert "lm_head.weight" in full and tensor_problems(llama, full) == []
    moved = {("model." + n if n.startswith(("fc.", "lm_head.")) else n): h for n, h in full.items()}
    (p,) = tensor_problems(llama, moved)
    assert (p.kind, p.canonical) == ("missing", "lm_head.weight")
    assert "model.lm_head.weight, which LlamaForCausalLMEagle3.load_weights never loads (the head is top" in p.detail
