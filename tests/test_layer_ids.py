"""Layer-id rules and conventions (eagle_io.capturing.layers); pure Python, no torch needed."""

import pytest

import eagle_io
from eagle_io.capturing.layers import (
    AUX_LAYER_CONVENTION,
    default_aux_layer_ids,
    explicit_ids_for,
    from_specforge,
    served_aux_layer_ids,
    validate_aux_layer_ids,
)


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
