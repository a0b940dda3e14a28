"""SpecForge's own trainer as eagle-io's client: SpecForge 0.2.0's ``OnlineEagle3Model`` (sdpa backend, on CPU, TTT
length 3, its ``LlamaForCausalLMEagle3`` draft from a tiny config) trained for a few optimizer steps on batches from
eagle-io's feed (``eagle_io.interop.specforge.SpecForgeDataset`` collated by SpecForge's ``DataCollatorWithPadding``;
the teacher built from the stored final states and the target head by SpecForge's compact teacher, the shift by
SpecForge's ``padding``); the loss falls; the draft saved in SGLang's format the way SpecForge's ``export_to_sglang``
saves it, loaded by eagle-io as SGLang would and measured by the speculative decoder and offline. SpecForge's
``@torch.compile`` functions run eagerly (``torch._dynamo.config.disable``: the same values, without ~19 s of
compiling on this machine).

Two TEST-ONLY STAND-INS, both for code that cannot run on a CPU-only machine or is not installed, each around
SpecForge's real code rather than instead of it:

* ``LogSoftmaxLoss`` (``specforge/core/loss.py``): SpecForge's loss is a Triton kernel with no CPU path; on this
  machine Triton finds no driver (``RuntimeError: 0 active drivers ([]). There should only be one.``, raised from
  ``log_softmax_forward_kernel[grid](...)``). It is replaced by the uncompiled reference implementation in the same
  file (``_compute_loss``, ``-sum(position_mask * target_p * log_softmax(logits), 2).mean()``, what the kernel
  computes), reached through ``torch.compile``'s ``_torchdynamo_orig_callable``.
* ``datasets``: ``specforge/data/utils.py`` imports Hugging Face ``datasets`` at module level (not installed here);
  ``DataCollatorWithPadding`` never uses it, so an empty module stands in for the import.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
from helpers.spec_models import AUX, H, V, count_up, prompts_for, tiny_target, write_dataset

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("specforge") is None, reason="SpecForge not installed (pip install --no-deps specforge)"
)

DRAFT_VOCAB = 64  # < V: the draft's d2t is exercised


@pytest.fixture(scope="module")
def specforge(tmp_path_factory):
    """SpecForge's modules, with the two stand-ins of the module docstring. Returns a namespace."""
    before, dynamo_off = torch.get_num_threads(), torch._dynamo.config.disable
    torch.set_num_threads(1)
    torch._dynamo.config.disable = True  # SpecForge's @torch.compile functions run eagerly: compiling cost ~19 s here
    added = "datasets" not in sys.modules
    if added:
        sys.modules["datasets"] = types.SimpleNamespace(Dataset=None)  # TEST-ONLY STAND-IN (module docstring)
    import specforge.algorithms.eagle3.model as eagle3
    import specforge.core.loss as loss
    from specforge.data.utils import DataCollatorWithPadding
    from specforge.export.to_sglang import WEIGHT_MAPS, _serving_state
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from specforge.utils import padding

    reference = loss._compute_loss._torchdynamo_orig_callable

    class ReferenceLoss:  # TEST-ONLY STAND-IN for the Triton LogSoftmaxLoss (module docstring)
        @staticmethod
        def apply(logits, target_p, position_mask):
            return reference(logits, target_p, position_mask)

    saved = eagle3.LogSoftmaxLoss
    eagle3.LogSoftmaxLoss = ReferenceLoss
    yield types.SimpleNamespace(
        OnlineEagle3Model=eagle3.OnlineEagle3Model,
        Draft=LlamaForCausalLMEagle3,
        Collator=DataCollatorWithPadding,
        padding=padding,
        serving_state=lambda state: _serving_state(state, WEIGHT_MAPS["LlamaForCausalLMEagle3"]),
    )
    eagle3.LogSoftmaxLoss = saved
    if added:
        del sys.modules["datasets"]
    torch.set_num_threads(before)
    torch._dynamo.config.disable = dynamo_off


def test_specforge_trains_on_eagle_io_batches_and_its_draft_decodes(specforge, tmp_path):
    from transformers import LlamaConfig

    from eagle_io.draft.acceptance import offline_accept
    from eagle_io.feed import ShardDataset
    from eagle_io.interop.specforge import SpecForgeDataset
    from eagle_io.interop.vocab import build_vocab_mapping
    from eagle_io.spec import SpeculativeDecoder, greedy_decode, load_served_draft

    target = tiny_target(0, counting=True)
    prompts, held = prompts_for(24), prompts_for(4, seed=9)
    write_dataset(tmp_path / "train", target, prompts, [count_up(p, 24) for p in prompts], dtype="bfloat16")
    write_dataset(tmp_path / "held", target, held, [count_up(p, 24) for p in held], dtype="bfloat16", first_id=50)
    mapping = build_vocab_mapping(tmp_path / "train", DRAFT_VOCAB)

    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        architectures=["LlamaForCausalLMEagle3"],
    )
    cfg.draft_vocab_size, cfg.target_hidden_size = DRAFT_VOCAB, H
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in AUX]}  # SGLang's Llama setter adds 1
    torch.manual_seed(0)
    draft = specforge.Draft(cfg, attention_backend="sdpa")
    with torch.no_grad():
        draft.d2t.copy_(mapping.d2t)
        draft.t2d.copy_(mapping.t2d)
        draft.embed_tokens.weight.copy_(target.model.embed_tokens.weight.float())
    draft.freeze_embedding()
    model = specforge.OnlineEagle3Model(draft, length=3, attention_backend="sdpa")
    head_w = target.lm_head.weight.detach().float()
    feed = SpecForgeDataset(tmp_path / "train", max_len=64)
    collate = specforge.Collator()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    order = torch.randperm(len(feed), generator=torch.Generator().manual_seed(0)).tolist() * 4
    losses, accs = [], []
    for step in range(24):
        batch = collate([feed[i] for i in order[4 * step : 4 * step + 4]])
        # Eagle3Strategy.forward_loss's compact-teacher path: TargetHead.preprocess's shift, the frozen head's
        # weight streamed in vocabulary chunks from the stored final states.
        input_ids = specforge.padding(batch["input_ids"], left=False)
        target_hidden = specforge.padding(batch["target"].float(), left=False)
        plosses, _, acces, *_ = model(
            input_ids=input_ids,
            attention_mask=batch["attention_mask"],
            target=None,
            loss_mask=batch["loss_mask"][..., None],
            hidden_states=batch["hidden_state"].float(),
            target_hidden_for_compact=target_hidden,
            target_head_weight=head_w,
        )
        loss = sum(0.8**i * p for i, p in enumerate(plosses))  # Eagle3Strategy(ploss_decay=0.8)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
        accs.append([float(a) for a in acces])
    assert len(plosses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4, losses
    assert accs[-1][0] > accs[0][0] and accs[-1][2] > 0.2, accs[-1]

    # Saved as SpecForge's export_to_sglang saves it: its serving-key check, no embedding, save_pretrained.
    out = tmp_path / "sglang-draft"
    state = {k: v for k, v in draft.state_dict().items() if "embed" not in k.lower()}
    draft.save_pretrained(out, state_dict=specforge.serving_state(state))
    served = load_served_draft(out, target, {"model_id": "tiny-llama", "architecture": "LlamaForCausalLM"})
    assert served.target.aux_layer_ids == AUX and served.draft.config.draft_vocab_size == DRAFT_VOCAB
    decoder = SpeculativeDecoder(served.target, served.draft.double(), num_steps=3)
    live = decoder.generate(held, 16)
    assert live.tokens == greedy_decode(served.target, held, 16)[0]
    off = offline_accept(served.draft.float(), ShardDataset(tmp_path / "held"), list(range(4)), head_w, 3)
    assert live.histogram.accept_length > 1.3 and off.accept_length > 1.3, (live.histogram.counts, off.to_dict())
