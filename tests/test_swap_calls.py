"""``swap_draft``'s calls, without a server: a recording stand-in transport answers as SGLang 0.5.23 does, so the
routes, their order, the selector each names, which routes take the admin key, the ``weight_version`` and the tensors
that travel (never ``embed_tokens``, ``d2t``, ``t2d``) are read exactly. The real server: tests/test_serving_swap.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import torch
from test_train_draft import H, V, synthetic_head

from eagle_io.draft import build_draft, save_draft
from eagle_io.errors import DraftSwapError
from eagle_io.sglang.draft_weights import file_system_sharing, served_checksums
from eagle_io.spec.swap import swap_draft

TARGET = {"architecture": "LlamaForCausalLM", "num_layers": 4, "hidden_size": H, "model_id": "t"}


def _draft(path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    model = build_draft(synthetic_head(), {"hidden_size": H, "vocab_size": V, "aux_layer_ids": [1, 2, 3]}, 16)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[:16] = True
    model.set_vocab_mapping(torch.zeros(16, dtype=torch.int64), t2d)
    save_draft(model, path, [1, 2, 3], target=TARGET)
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("swap")
    target = root / "target"
    target.mkdir()
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "num_hidden_layers": 4, "vocab_size": V,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}  # fmt: skip
    (target / "config.json").write_text(json.dumps(cfg))
    return target, _draft(root / "v0", 0), _draft(root / "v1", 1)


class StandIn:
    """Answers each route as SGLang does; ``verify_ct`` per check prompt sets the served accept length."""

    def __init__(self, target: Path, served: Path, verify_ct: int) -> None:
        self.calls: list[tuple[str, dict | None, bool]] = []
        self.info = {"model_path": str(target), "speculative_draft_model_path": str(served), "device": "cpu",
                     "dtype": "float32", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
                     "tp_size": 1}  # fmt: skip
        self.loaded: dict[str, torch.Tensor] = {}
        self.verify_ct = verify_ct

    def __call__(self, route, body, control):
        self.calls.append((route, body, control))
        if route == "/server_info":
            return self.info
        if route == "/update_weights_from_tensor":
            from multiprocessing.reduction import ForkingPickler

            with file_system_sharing():
                named = ForkingPickler.loads(base64.b64decode(body["serialized_named_tensors"][0]))
            self.loaded = {n: t.clone() for n, t in named}
            return {"success": True, "message": "Success"}
        if route == "/weights_checker":
            sums = {f"draft.{k}": v for k, v in served_checksums(self.loaded, torch.float32).items()}
            return {"success": True, "ranks": [{"checksums": sums}]}
        if route == "/generate":
            n = self.verify_ct
            meta = {"completion_tokens": 10, "spec_verify_ct": n, "spec_correct_drafts_histogram": [0, 0, 0, n]}
            return {"output_ids": [5] * 10, "meta_info": meta}
        return {"success": True, "message": "Success"}


def test_each_weight_call_names_the_draft_selector_and_takes_the_admin_key(dirs):
    target, v0, v1 = dirs
    call = StandIn(target, v0, verify_ct=4)
    result = swap_draft(call, v1, weight_version="v1-test")
    routes = [r for r, _, _ in call.calls]
    assert routes[:5] == ["/server_info", "/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update",
                          "/weights_checker"]  # fmt: skip
    assert routes[5:] == ["/generate"] * 4  # the check prompts decode under the settings read first
    for route, body, control in call.calls:
        weights = route in ("/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update",
                            "/weights_checker")  # fmt: skip
        assert control is weights, route  # the routes SGLang guards with --admin-api-key, and only those
        if weights:
            assert body["selector"] == "draft", route  # never SGLang's default "all"
    update = call.calls[2][1]
    assert update["weight_version"] == "v1-test" and update["flush_cache"] is True
    from safetensors.torch import load_file

    stored = load_file(v1 / "model.safetensors")
    sent = set(stored) - {"embed_tokens.weight", "d2t", "t2d"}
    assert set(call.loaded) == sent and len(sent) == 13
    assert all(torch.equal(call.loaded[n], stored[n]) for n in sent)
    assert result.sent == 13 and result.checked == 10 and result.why_unchecked is None
    assert result.run.sglang_accept_length == pytest.approx(2.5)


def test_a_collapsed_accept_length_is_refused_after_sending(dirs):
    target, v0, v1 = dirs
    with pytest.raises(DraftSwapError, match=r"served accept length 1\.111 .* below 1\.200 \(floor 1\.2") as e:
        swap_draft(StandIn(target, v0, verify_ct=9), v1)
    assert e.value.sent is True


def test_checksums_that_are_not_the_new_drafts_are_refused(dirs):
    target, v0, v1 = dirs

    class Stale(StandIn):
        def __call__(self, route, body, control):
            answer = super().__call__(route, body, control)
            if route == "/weights_checker":
                answer["ranks"][0]["checksums"]["draft.model.fc.weight"] = "0" * 16
            return answer

    with pytest.raises(DraftSwapError, match=r"\n  model\.fc\.weight: served checksum \['0000000000000000'\]") as e:
        swap_draft(Stale(target, v0, verify_ct=4), v1)
    assert e.value.sent is True


def test_a_failed_update_still_ends_the_session_and_says_it_was_sent(dirs):
    from eagle_io.errors import SGLangError

    target, v0, v1 = dirs

    class Refusing(StandIn):
        def __call__(self, route, body, control):
            if route == "/update_weights_from_tensor":
                self.calls.append((route, body, control))
                raise SGLangError("http://x/update_weights_from_tensor: HTTP 400: bad", status=400)
            return super().__call__(route, body, control)

    call = Refusing(target, v0, verify_ct=4)
    with pytest.raises(DraftSwapError, match=r"the weight update of .* failed: .*HTTP 400") as e:
        swap_draft(call, v1)
    assert e.value.sent is True and e.value.status == 400
    assert [r for r, _, _ in call.calls][-1] == "/end_weight_update"


def test_the_preflight_reads_no_weights_into_the_server_when_the_served_draft_differs(dirs, tmp_path):
    target, v0, _ = dirs
    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((v0 / "config.json").read_text())
    cfg["eagle_io"]["target"]["model_id"] = "u"
    (other / "config.json").write_text(json.dumps(cfg))
    (other / "model.safetensors").write_bytes((v0 / "model.safetensors").read_bytes())
    call = StandIn(target, v0, verify_ct=4)
    with pytest.raises(DraftSwapError) as e:
        swap_draft(call, other)
    assert e.value.sent is False
    assert "\n  trained for target model_id 'u', the served draft for 't'" in str(e.value)
    assert [r for r, _, _ in call.calls] == ["/server_info"]
