"""The reference EAGLE-3 speculative decoder (eagle_io.spec) and the accept-length counts (eagle_io.draft.acceptance).

Lossless against the target's own greedy decoding (several prompt lengths, a batch of prompts, num_steps 1/3/5,
EOS inside a draft block); hand-counted accept lengths (a draft that always proposes the target's next tokens:
num_steps + 1 exactly; one that is always wrong: 1.00); the EAGLE-mode collapse; TTT > 1 drafting past its first
token where TTT 1 cannot; the draft's cached forward and its TTT unroll equal to the live draft chain; the offline
accept length equal to a direct computation and to the live decoder's verify steps; joint vs product and pooled vs
per-request figures. Targets are tiny random Llamas built from a config (tests/helpers/spec_models.py), float64 so a
verify block and one-token decoding round alike."""

from __future__ import annotations

import pytest
import torch
from helpers.spec_models import AUX, H, OracleDraft, V, count_up, prompts_for, tiny_target, write_dataset

import eagle_io
from eagle_io.draft import Eagle3Draft, Eagle3DraftConfig, TargetHead, TrainConfig, train_draft
from eagle_io.draft.acceptance import (
    AcceptHistogram,
    OfflineAccept,
    count_chains,
    mean_of_request_means,
    offline_accept,
)
from eagle_io.draft.caches import DraftKVCache
from eagle_io.feed import ShardDataset
from eagle_io.interop.vocab import build_vocab_mapping
from eagle_io.spec import SpeculativeDecoder, Target, greedy_decode

PROMPTS = [[5], [1, 2, 3, 4], prompts_for(1, seed=3, lo=11, hi=12)[0], prompts_for(1, seed=4, lo=23, hi=24)[0]]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: these tiny forwards cost more in thread hand-offs than in arithmetic (5x slower with 2
    threads on the shared 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def random_target():
    return tiny_target(0)


@pytest.fixture(scope="module")
def random_draft():
    torch.manual_seed(1)
    cfg = Eagle3DraftConfig(V, V, H, H, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    d = Eagle3Draft(cfg).double().eval()
    with torch.no_grad():
        for p in d.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    d.set_vocab_mapping(torch.zeros(V, dtype=torch.int64), torch.ones(V, dtype=torch.bool))
    return d


@pytest.fixture(scope="module")
def counting(tmp_path_factory):
    """The counting target, drafts trained on its greedy continuations with TTT 1 and TTT 3 (same seed, data and
    60 steps), and a held-out float32 dataset of 6 more prompts. Returns a dict."""
    model = tiny_target(0, counting=True)
    root = tmp_path_factory.mktemp("counting")
    train_prompts = prompts_for(32)
    write_dataset(root / "train", model, train_prompts, [count_up(p, 24) for p in train_prompts])
    held = prompts_for(6, seed=9)
    write_dataset(root / "held", model, held, [count_up(p, 24) for p in held], first_id=100)
    head = TargetHead.from_model(model, "tiny-llama")
    mapping = build_vocab_mapping(root / "train", V)
    drafts = {}
    for ttt in (1, 3):
        cfg = TrainConfig(
            steps=60,
            batch_size=4,
            lr=3e-3,
            warmup_steps=5,
            eval_samples=4,
            threads=1,
            log_every=0,
            ttt_length=ttt,
            accept_steps=0,
        )
        drafts[ttt] = train_draft(root / "train", head, mapping, cfg, log=None).model.eval()
    return {"model": model, "drafts": drafts, "held": root / "held", "held_prompts": held, "head": head}


def test_cached_forward_and_ttt_unroll_are_the_live_draft_chain(random_draft):
    d = random_draft
    g = torch.Generator().manual_seed(0)
    aux, ids = torch.randn(2, 12, 3 * H, generator=g, dtype=torch.float64), torch.randint(0, V, (2, 12), generator=g)
    full = d(aux, ids)
    cache, parts = DraftKVCache(), []
    for a, b in [(0, 5), (5, 6), (6, 9), (9, 12)]:  # prefill, one step, a block, a block
        parts.append(d.logits(d.extend(aux[:, a:b], ids[:, a:b], torch.arange(a, b).expand(2, b - a), cache)))
    assert len(cache) == 12 and torch.allclose(torch.cat(parts, 1), full, atol=1e-12, rtol=0)
    steps = 4
    ttt = d.ttt_forward(aux, ids, steps)
    assert torch.equal(ttt[0], full), "TTT step 0 is the training forward"
    for t in range(12 - steps):  # the live chain from position t: extend over 0..t, then own-hidden steps
        cache = DraftKVCache()
        h = d.extend(aux[:, : t + 1], ids[:, : t + 1], torch.arange(t + 1).expand(2, t + 1), cache)[:, -1:]
        for k in range(steps):
            if k:
                h = d.extend(h, ids[:, t + k : t + k + 1], torch.full((2, 1), t + k), cache)
            assert torch.allclose(d.logits(h)[:, 0], ttt[k][:, t], atol=1e-12, rtol=0), (t, k)


@pytest.fixture(scope="module")
def greedy(random_target):
    """The target's greedy decoding of :data:`PROMPTS` (24 new tokens: what the oracle drafts need for 16)."""
    return greedy_decode(Target(random_target, AUX), PROMPTS, 24)[0]


@pytest.mark.parametrize("num_steps", [1, 4])
def test_lossless_against_the_targets_greedy_decoding(random_target, random_draft, greedy, num_steps):
    target = Target(random_target, AUX)
    wrong_sometimes = OracleDraft(PROMPTS, greedy, wrong=lambda p: p % 3 == 0 or p % 7 == 0)
    for draft in (random_draft, wrong_sometimes):
        out = SpeculativeDecoder(target, draft, num_steps=num_steps).generate(PROMPTS, 16)
        assert out.tokens == [g[:16] for g in greedy]
        assert [len(t) for t in out.tokens] == [16] * len(PROMPTS)
    if num_steps > 1:  # rejections at every depth of a block: the caches were cut back right each time
        assert sum(c > 0 for c in out.histogram.counts) >= 3, out.histogram.counts


def test_eos_inside_a_draft_block(random_target, greedy):
    prompt, ref = PROMPTS[2], greedy[2]
    eos = next(t for i, t in enumerate(ref) if i >= 2 and t not in ref[:i])  # first seen at index i >= 2
    cut = ref.index(eos)
    oracle = OracleDraft([prompt], [ref])
    decoder = SpeculativeDecoder(Target(random_target, AUX), oracle, num_steps=5, eos_token_ids=[eos])
    out = decoder.generate([prompt], 16)
    assert out.tokens == [ref[: cut + 1]] == greedy_decode(Target(random_target, AUX), [prompt], 16, [eos])[0]
    # The EOS arrived inside the first verify block (x at index 0, the block's 6 tokens at 1..6): one verify step,
    # counted whole (SGLang adds the verify's accept_lens before trimming the output).
    assert cut <= 6 and out.histogram.counts == [0, 0, 0, 0, 0, 1] and out.histogram.accept_length == 6.0


def test_a_request_past_the_context_is_refused_as_sglang_refuses_it(random_target, random_draft):
    # SGLang's TokenizerManager refuses len(prompt) + max_new_tokens > context length; the reference decoders went
    # on past max_position_embeddings (256 here), measuring positions SGLang never serves.
    target = Target(random_target, AUX)
    prompt = [i % V for i in range(250)]
    decoder = SpeculativeDecoder(target, random_draft, num_steps=3)
    assert len(decoder.generate([prompt], 6).tokens[0]) == 6 == len(greedy_decode(target, [prompt], 6)[0][0])
    for run in (lambda: decoder.generate([prompt], 7), lambda: greedy_decode(target, [prompt], 7)):
        with pytest.raises(eagle_io.InvalidArgumentError, match=r"250 tokens and max_new_tokens 7 exceed .* of 256"):
            run()


@pytest.mark.parametrize("num_steps", [1, 3, 5])
def test_hand_counted_accept_lengths(random_target, greedy, num_steps):
    target = Target(random_target, AUX)
    prompts = PROMPTS[:3]
    oracle = SpeculativeDecoder(target, OracleDraft(prompts, greedy[:3]), num_steps=num_steps)
    out = oracle.generate(prompts, 13)
    # 13 tokens: the prefill's first, then 12 in verify steps of num_steps + 1 (the last one may overshoot).
    per_prompt = -(-12 // (num_steps + 1))
    assert out.histogram.counts == [0] * num_steps + [3 * per_prompt]
    assert out.histogram.accept_length == num_steps + 1 and out.histogram.per_position_accept_rate == [1.0] * num_steps
    assert out.tokens == [g[:13] for g in greedy[:3]]
    wrong = SpeculativeDecoder(target, OracleDraft(prompts, greedy[:3], wrong=lambda _p: True), num_steps=num_steps)
    out = wrong.generate(prompts, 13)
    assert out.histogram.counts == [3 * 12] + [0] * num_steps and out.histogram.accept_length == 1.0
    assert out.histogram.accept_rate == 0.0 and out.tokens == [g[:13] for g in greedy[:3]]


def test_ttt_drafts_past_the_first_token_and_eagle_mode_collapses(counting):
    model, prompts = counting["model"], counting["held_prompts"][:4]
    target = Target(model, AUX)
    greedy, _ = greedy_decode(target, prompts, 16)
    assert greedy == [count_up(p, 16) for p in prompts]
    res = {}
    for ttt, draft in counting["drafts"].items():
        for algo in ("EAGLE3", "EAGLE") if ttt == 3 else ("EAGLE3",):
            out = SpeculativeDecoder(target, draft, num_steps=3, as_algorithm=algo).generate(prompts, 16)
            assert out.tokens == greedy, (ttt, algo)
            res[ttt, algo] = out.histogram.accept_length
    # TTT 1 never saw its own hidden state as input: its first draft is right, the next ones are not.
    assert res[1, "EAGLE3"] == pytest.approx(2.0, abs=0.05)
    assert res[3, "EAGLE3"] > res[1, "EAGLE3"] + 0.3, res
    # Served as EAGLE the draft gets the target's final state (fc skipped) and the target's head: it guesses the
    # token it was just fed, never the next one.
    assert res[3, "EAGLE"] == 1.0, res


def test_offline_accept_is_the_direct_computation_and_the_live_decoder(counting):
    model, draft, prompts = counting["model"], counting["drafts"][3], counting["held_prompts"]
    ds = ShardDataset(counting["held"])
    steps = 3
    off = offline_accept(draft, ds, list(range(len(ds))), counting["head"].lm_head, steps)
    # Direct: every loss-masked start t of every sample, the live-style cached chain teacher-forced on the data.
    direct = AcceptHistogram(steps)
    lead_at: dict[tuple[int, int], int] = {}
    for i in range(len(ds)):
        item = ds[i]
        ids, aux, mask = item["input_ids"], item["aux_hidden_states"], item["loss_mask"]
        teacher = (item["hidden_states"].float() @ counting["head"].lm_head.T).argmax(-1)  # target's next at s+1
        n = len(ids)
        for t in range(n - 1):
            if not mask[t + 1]:
                continue
            cache = DraftKVCache()
            h = draft.extend(aux[None, : t + 1], ids[None, 1 : t + 2], torch.arange(t + 1)[None], cache)[:, -1:]
            j = 0
            for k in range(steps):
                if t + 1 + k >= n or not mask[t + 1 + k]:
                    break
                if k:
                    h = draft.extend(h, ids[None, t + 1 + k : t + 2 + k], torch.tensor([[t + k]]), cache)
                if int(draft.draft_token_ids()[draft.logits(h)[0, 0].argmax()]) != int(teacher[t + 1 + k]):
                    break
                j += 1
            direct.add(j)
            lead_at[i, t] = j
    assert off.histogram.counts == direct.counts and off.samples == len(ds)
    assert 1.3 < off.accept_length < steps + 1
    # Live: each verify step at last verified position v is the offline start t = v - 1 of the same sequence.
    live = SpeculativeDecoder(Target(model, AUX), draft, num_steps=steps).generate(prompts, 24)
    checked = 0
    for i, trace in enumerate(live.trace):
        for v, j in trace:
            if v + steps < len(ds[i]["input_ids"]):
                assert lead_at[i, v - 1] == j, (i, v)
                checked += 1
    assert checked >= 20


def test_joint_and_product_figures_differ_where_steps_are_correlated():
    # Two start positions: one whose 2 drafts are both right, one whose 2 are both wrong.
    correct = torch.tensor([[[True, True], [False, False]]])
    masked = torch.ones_like(correct)
    off = OfflineAccept(AcceptHistogram(2), [0, 0], [0, 0])
    count_chains(correct, masked, torch.tensor([[True, True]]), off)
    assert off.histogram.counts == [1, 0, 1]
    assert off.accept_length == 2.0  # 1 + P(first right) + P(both right) = 1 + 0.5 + 0.5
    assert off.accept_length_product_of_marginals == 1.75  # 1 + 0.5 + 0.5 * 0.5: understates
    assert off.histogram.per_position_conditional == [0.5, 1.0]
    # Independent steps: the two agree.
    ind = OfflineAccept(AcceptHistogram(2), [0, 0], [0, 0])
    grid = torch.tensor([[[True, True], [True, False], [False, True], [False, False]]])
    count_chains(grid, torch.ones_like(grid), torch.ones(1, 4, dtype=torch.bool), ind)
    assert ind.accept_length == ind.accept_length_product_of_marginals == 1.75


def test_pooled_counts_not_the_mean_of_request_means():
    short, long = AcceptHistogram(3), AcceptHistogram(3)
    short.add(3, 10)  # 10 verify steps at accept length 4.0
    long.add(1, 1000)  # 1000 at 2.0
    pooled = short.merge(long)
    assert pooled.accept_length == pytest.approx(2.0198, abs=1e-4)
    assert mean_of_request_means([short, long]) == 3.0
    assert pooled.accept_length == 1 + sum(pooled.per_position_accept_rate)
    assert pooled.truncated(1).counts == [0, 1010] and pooled.truncated(1).accept_length == 2.0
