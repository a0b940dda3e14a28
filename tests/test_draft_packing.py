"""The reference EAGLE-3 draft on packed batches: attention is block-diagonal from the packed position ids, so a
sample's logits are the same packed with others as padded alone."""

from __future__ import annotations

import torch

from eagle_io.draft.model import Eagle3Draft, Eagle3DraftConfig, packed_attention_mask
from eagle_io.feed import PackingCollator, PaddingCollator, shift_targets

H, V = 16, 64


def _items(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(0, V, (n,), generator=g),
            "loss_mask": torch.ones(n, dtype=torch.uint8),
            "aux_hidden_states": torch.randn(n, 3 * H, generator=g),
            "hidden_states": torch.randn(n, H, generator=g),
            "sample_id": i,
        }
        for i, n in enumerate(lengths)
    ]


def _draft():
    torch.manual_seed(0)
    cfg = Eagle3DraftConfig(V, 32, H, H, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32)
    return Eagle3Draft(cfg).eval()


def test_packed_logits_equal_padded_logits():
    items, model = _items([5, 7, 3]), _draft()
    padded = shift_targets(PaddingCollator()(items))
    packed = shift_targets(PackingCollator(max_tokens=18)(items))  # 15 real tokens + a 3-token tail
    with torch.no_grad():
        want = model(padded["aux_hidden_states"], padded["next_input_ids"], padded["position_ids"])
        got = model(packed["aux_hidden_states"], packed["next_input_ids"], packed["position_ids"])
    starts = packed["cu_seqlens"].tolist()
    for b, n in enumerate([5, 7, 3]):
        assert torch.allclose(got[0, starts[b] : starts[b] + n], want[b, :n], atol=1e-5, rtol=1e-5)
    # The same packed row read as one sequence mixes the samples: what the mask prevents.
    with torch.no_grad():
        mixed = model(packed["aux_hidden_states"], packed["next_input_ids"])
    assert (mixed[0, 5:12] - want[1, :7]).abs().max() > 1e-2


def test_the_mask_is_block_diagonal_and_none_for_plain_rows():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0]])  # samples of 3 and 2 tokens, then a 2-token tail
    m = packed_attention_mask(pos)[0, 0].int()
    assert m.tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],
    ]
    assert packed_attention_mask(torch.arange(6).expand(2, 6)) is None
