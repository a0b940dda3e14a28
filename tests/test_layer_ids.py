"""Layer-id rules and conventions (eagle_io.store.eagle3, eagle_io.sglang.setters); pure Python, no torch needed."""

import pytest

import eagle_io
from eagle_io.sglang.setters import (
    capturable_range,
    captured_ids,
    default_capture_ids,
    explicit_ids_for,
    from_specforge,
    served_aux_layer_ids,
)
from eagle_io.store.eagle3 import AUX_LAYER_CONVENTION, aux_id_problems, default_aux_layer_ids, validate_aux_layer_ids


@pytest.mark.parametrize(
    ("n", "expected"),
    [(30, [2, 15, 27]), (61, [2, 30, 58]), (32, [2, 16, 29]), (80, [2, 40, 77]), (7, [2, 3, 4]), (8, [2, 4, 5])],
)
def test_default_ids(n, expected):
    assert default_aux_layer_ids(n) == expected


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 6])
def test_default_ids_tiny_models_raise(n):
    with pytest.raises(ValueError, match="N >= 7"):
        default_aux_layer_ids(n)


def test_default_ids_n6_names_the_duplicate():
    # [2, 3, 3]: must be an error naming the duplicate, never a duplicated layer.
    with pytest.raises(ValueError, match="aux layer id 3 is duplicated"):
        default_aux_layer_ids(6)


@pytest.mark.parametrize("n", [30, 32, 61, 80])
def test_specforge_ids_map_to_default(n):
    specforge = [1, n // 2 - 1, n - 4]
    assert from_specforge(specforge) == default_aux_layer_ids(n)


def test_sglang_llama_explicit_adds_one_and_inverts():
    assert served_aux_layer_ids("LlamaForCausalLM", None, [1, 14, 26]) == [2, 15, 27]
    assert explicit_ids_for("LlamaForCausalLM", None, [2, 15, 27]) == [1, 14, 26]
    there = explicit_ids_for("LlamaForCausalLM", None, [3, 9, 20])
    assert served_aux_layer_ids("LlamaForCausalLM", None, there) == [3, 9, 20]


def test_sglang_deepseek_explicit_adds_one_only_when_first_is_one():
    assert served_aux_layer_ids("DeepseekV3ForCausalLM", 61, [1, 29, 57]) == [2, 30, 58]
    assert served_aux_layer_ids("DeepseekV3ForCausalLM", 61, [2, 30, 58]) == [2, 30, 58]


def test_the_default_needs_the_layer_count():
    with pytest.raises(eagle_io.InvalidArgumentError, match="need the target's layer count"):
        served_aux_layer_ids("LlamaForCausalLM", None, None)


def test_validate_accepts_range_edges_and_returns_ints():
    assert validate_aux_layer_ids([1, 29], 30) == [1, 29]
    assert validate_aux_layer_ids((2, 15, 27), 30) == [2, 15, 27]


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([0, 15, 27], r"aux layer id 0 out of range.*1 <= id <= num_layers-1 = 29"),
        ([2, 15, 30], r"aux layer id 30 out of range"),
        ([2, 15, -1], r"aux layer id -1 out of range"),
        ([2, 15, 15], r"aux layer id 15 is duplicated"),
        ([15, 2, 27], r"aux layer id 2 follows 15 .* sorted ascending"),
        ([], r"must not be empty"),
    ],
)
def test_validate_errors_name_id_and_rule(ids, match):
    with pytest.raises(ValueError, match=match):
        validate_aux_layer_ids(ids, 30)


@pytest.mark.parametrize("bad", [2.0, "2", True])
def test_validate_rejects_non_int(bad):
    with pytest.raises(TypeError, match="expected int"):
        validate_aux_layer_ids([bad, 15], 30)


def test_validate_rejects_models_without_capturable_layers():
    with pytest.raises(ValueError, match="num_layers must be >= 2"):
        validate_aux_layer_ids([1], 1)


def test_convention_string_is_stable():
    # Written into dataset manifests: changing it changes the meaning of stored data.
    assert AUX_LAYER_CONVENTION == (
        "input of 0-based decoder layer i = HF output_hidden_states[i] (index 0 = embedding output)"
    )


def test_final_boundary_is_allowed_only_where_the_path_captures_it():
    assert validate_aux_layer_ids([2, 15, 30], 30, final_boundary=True) == [2, 15, 30]
    with pytest.raises(ValueError, match=r"aux layer id 30 out of range.*final pre-norm output"):
        validate_aux_layer_ids([2, 15, 30], 30)
    with pytest.raises(ValueError, match=r"aux layer id 31 out of range.*1 <= id <= num_layers = 30"):
        validate_aux_layer_ids([2, 31], 30, final_boundary=True)
    # SGLang: only gpt-oss's forward captures the boundary after the last layer (srt/models/gpt_oss.py).
    assert capturable_range("GptOssForCausalLM", 24) == (1, 24)
    assert capturable_range("LlamaForCausalLM", 24) == (1, 23)
    assert capturable_range("DeepseekV3ForCausalLM", 61) == (1, 60)


def test_every_problem_is_named_at_once():
    probs = aux_id_problems([-1, 5, 5, 40], 36)
    assert len(probs) == 3
    assert "aux layer id -1 out of range" in probs[0] and "negative ids are not counted from the end" in probs[0]
    assert "aux layer id 5 is duplicated" in probs[1] and "aux layer id 40 out of range" in probs[2]
    assert aux_id_problems([3, 7], None) == [] and "out of range" in aux_id_problems([0, 7], None)[0]


@pytest.mark.parametrize("wanted", [[-1, 5, 9], [0, 5, 9], [5, 5, 9], [9, 5], [2, 5, 40]])
def test_explicit_ids_are_never_computed_for_invalid_ids(wanted):
    """A negative id once produced the 'fix' [-2, 4, 8]; every invalid id list is refused instead."""
    with pytest.raises(eagle_io.InvalidArgumentError, match="aux layer id"):
        explicit_ids_for("LlamaForCausalLM", 36, wanted)
    if min(wanted) < 1:
        with pytest.raises(eagle_io.InvalidArgumentError, match="out of range"):
            explicit_ids_for("LlamaForCausalLM", None, wanted)


@pytest.mark.parametrize(
    ("arch", "n", "explicit", "served"),
    [
        ("LlamaForCausalLM", 80, None, [2, 40, 77]),
        ("Qwen3ForCausalLM", 36, [1, 17, 32], [2, 18, 33]),
        ("DeepseekV3ForCausalLM", 61, [3, 5, 7], [3, 5, 7]),  # first id is not 1: unchanged
        ("Glm4MoeLiteForCausalLM", 47, [1, 22, 43], [2, 23, 44]),  # first id is 1: +1
        ("GlmMoeDsaForCausalLM", 78, [3, 5, 7], [3, 5, 7]),  # subclass of DeepseekV2ForCausalLM
        ("MistralLarge3ForCausalLM", 61, [3, 5, 7], [3, 5, 7]),  # subclass of DeepseekV3ForCausalLM
        ("GptOssForCausalLM", 36, [17, 35, 36], [17, 35, 36]),  # reaches N: unchanged
        ("MiniMaxM3SparseForConditionalGeneration", 62, None, [3, 32, 60]),  # +1 on the default too
    ],
)
def test_setter_table(arch, n, explicit, served):
    assert served_aux_layer_ids(arch, n, explicit) == served
    if explicit is None:
        assert default_capture_ids(n, arch) == served
    else:  # the inverse finds ids that the same setter turns into the same layers
        assert served_aux_layer_ids(arch, n, explicit_ids_for(arch, n, served)) == served


def test_captured_ids_are_what_the_forward_records():
    """Duplicates are captured once, out-of-range ids never: [3, 3, 7] through Llama's +1 is two states."""
    assert captured_ids("LlamaForCausalLM", 36, served_aux_layer_ids("LlamaForCausalLM", 36, [3, 3, 7])) == [4, 8]
    assert captured_ids("LlamaForCausalLM", 36, served_aux_layer_ids("LlamaForCausalLM", 36, [1, 1, 1])) == [2]
    assert captured_ids("LlamaForCausalLM", 8, [2, 5, 8]) == [2, 5]
    assert captured_ids("GptOssForCausalLM", 8, [8, 2, 5]) == [2, 5, 8]
