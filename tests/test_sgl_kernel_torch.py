"""The test-only ``sgl_kernel`` (tests/support/sgl_kernel_torch: torch versions of the 11 sgl-kernel CPU ops SGLang's
EAGLE / EAGLE3 path calls on a CPU) held to independent references on random inputs of realistic shapes:

* the nine bookkeeping / KV-copy ops to SGLang's own Triton twins (the kernels the GPU path runs), read from the
  installed SGLang's files and run on CPU tensors by Triton's interpreter (``TRITON_INTERPRET=1``);
* the two attention ops to a float64 math attention written here (per query: the visible keys, ``logit_cap``'s
  tanh, softmax) and, without a cap, to ``scaled_dot_product_attention`` as SGLang's ``torch_native`` backend calls it.

Why a subprocess for the Triton side: ``TRITON_INTERPRET`` is read when triton is imported, and under pytest-xdist
(``--dist loadfile``) another test file in this worker may have imported triton (with SGLang) already. So this file
never imports triton or sglang: the module fixture writes the cases to a file and runs this file as a script
(``python test_sgl_kernel_torch.py CASES OUT``, ``TRITON_INTERPRET=1`` in its environment), which copies the twins'
source out of the installed SGLang (importing SGLang's modules themselves would cost ~1 minute of imports on this
machine), imports them from that copy, runs them and writes their outputs. The ops under test run here, loaded
under a private module name so that this worker's ``sys.modules`` gets no ``sgl_kernel``.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
SGL_KERNEL_DIR = TESTS / "support" / "sgl_kernel_torch"  # = helpers.sglang_cpu.SGL_KERNEL_DIR (kept import-free)

# The Triton twins, by file of the installed SGLang (0.5.23), with the jit helpers they call.
TWINS = {
    "kernels/ops/kvcache/cache_move.py": ["copy_all_layer_kv_cache_tiled"],
    "srt/mem_cache/allocation.py": ["assign_req_to_token_pool"],
    "kernels/ops/speculative/cache_locs.py": [
        "assign_draft_cache_locs_contiguous",
        "assign_extend_cache_locs",
        "_translate_token_ids",
        "_load_token_ids",
        "generate_draft_decode_kv_indices",
    ],
    "kernels/ops/speculative/spec_tree.py": [
        "sgl_build_tree_kernel_efficient_triton",
        "verify_tree_greedy_kernel_triton",
    ],
    "kernels/ops/speculative/eagle.py": ["fill_bonus_tokens", "fill_accept_out_cache_loc"],
}

needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# ---------------------------------------------------------------------------------------------------------------
# The cases (seeded): inputs only; each op's output buffers are given initial values both sides start from.
# ---------------------------------------------------------------------------------------------------------------

BS, POOL_LEN, NUM_REQS, TOPK, STEPS = 5, 640, 12, 4, 3
NUM_DRAFT = 8  # verify tokens of a tree (topk 4, 3 steps, 8 draft tokens: the CPU runs' tree)


def _tree_inputs(g: torch.Generator, bs: int, topk: int, steps: int, n: int):
    """``parent_list [bs, topk*(steps-1)+1]`` and sorted ``top_scores_index [bs, n-1]`` as SGLang's EAGLE draft
    builds them: step 0 proposes ``topk`` tokens (flat ids 0..topk-1, parents the root), each later step expands the
    ``topk`` best of the previous step's candidates into ``topk`` children each (flat id ``topk + (s-1) topk^2 +
    j topk + k`` for child ``k`` of expanded token ``j``; ``parent_list[1 + (s-1) topk + j]`` = that token's flat
    id); scores are products along the path; the verify tree is the ``n-1`` best."""
    parents, selected = [], []
    for _ in range(bs):
        score = {}
        probs = torch.rand(topk, generator=g)
        for k in range(topk):
            score[k] = float(probs[k])
        plist, frontier = [-1], list(range(topk))
        for s in range(1, steps):
            expand = sorted(frontier, key=lambda t: -score[t])[:topk]
            plist += expand
            frontier = []
            for j, tok in enumerate(expand):
                p = torch.rand(topk, generator=g)
                for k in range(topk):
                    child = topk + (s - 1) * topk * topk + j * topk + k
                    score[child] = score[tok] * float(p[k])
                    frontier.append(child)
        best = sorted(score, key=lambda t: -score[t])[: n - 1]
        parents.append(plist)
        selected.append(sorted(best))
    return torch.tensor(parents, dtype=torch.int64), torch.tensor(selected, dtype=torch.int64)


def _build_cases() -> dict:
    g = torch.Generator().manual_seed(1234)
    rpi = torch.randperm(NUM_REQS, generator=g)[:BS].to(torch.int64)
    req_to_token = torch.randperm(NUM_REQS * POOL_LEN, generator=g).view(NUM_REQS, POOL_LEN).to(torch.int32)
    start = torch.randint(0, 300, (BS,), generator=g, dtype=torch.int64)
    end = start + torch.randint(1, 70, (BS,), generator=g, dtype=torch.int64)
    total = int((end - start).sum())
    seq_lens = torch.randint(1, POOL_LEN - TOPK * STEPS, (BS,), generator=g, dtype=torch.int64)
    seq_lens[0] = 200  # one past a Triton BLOCK_SIZE of 128
    cases = {
        "assign_req_to_token_pool": {
            "req_pool_indices": rpi,
            "req_to_token": req_to_token,
            "start_offset": start,
            "end_offset": end,
            "out_cache_loc": torch.randint(0, 1 << 20, (total,), generator=g, dtype=torch.int64),
        },
        "assign_extend_cache_locs": {
            "req_pool_indices": rpi,
            "req_to_token": req_to_token,
            "start_offset": start,
            "end_offset": end,
            "out_cache_loc": torch.full((total,), -7, dtype=torch.int64),
        },
        "assign_draft_cache_locs_contiguous": {
            "req_pool_indices": rpi,
            "req_to_token": req_to_token,
            "seq_lens": seq_lens,
            "out_cache_loc": torch.full((BS * TOPK * STEPS,), -7, dtype=torch.int64),
        },
        "build_draft_decode_metadata": {"req_to_token": req_to_token, "req_pool_indices": rpi, "seq_lens": seq_lens},
    }
    # copy_all_layer_kv_cache: 3 layers x (K, V), rows of [2 heads, 64] float32; targets overlap sources.
    layers = [torch.randn(96, 2, 64, generator=g) for _ in range(6)]
    src = torch.tensor([3, 4, 5, 17, 40, 41, 90], dtype=torch.int64)
    tgt = torch.tensor([4, 5, 6, 3, 95, 40, 0], dtype=torch.int64)
    cases["copy_all_layer_kv_cache"] = {"buffers": layers, "tgt_loc": tgt, "src_loc": src}
    # The verify tree, then greedy verification of it with planted matches.
    parent_list, selected = _tree_inputs(g, BS, TOPK, STEPS, NUM_DRAFT)
    cases["build_tree"] = {"parent_list": parent_list, "selected_index": selected, "verified_seq_len": seq_lens}
    # tokens from a vocabulary of 3, and in each request the target agrees with the drafts along the path to one
    # random node (its parent found as build_tree's docstring says), so paths of several lengths are accepted
    candidates = torch.randint(0, 3, (BS, NUM_DRAFT), generator=g, dtype=torch.int64)
    target = torch.randint(0, 3, (BS, NUM_DRAFT), generator=g, dtype=torch.int64)
    for b in range(BS):
        sel, plist = selected[b].tolist(), parent_list[b].tolist()
        parent = [None] + [0 if s // TOPK == 0 else 1 + sel.index(plist[s // TOPK]) for s in sel]
        path = [int(torch.randint(1, NUM_DRAFT, (1,), generator=g))]
        while path[-1] != 0:
            path.append(parent[path[-1]])
        for node, child in zip(path[1:], path[:-1], strict=True):
            target[b, node] = candidates[b, child]
    cases["verify_tree_greedy"] = {"candidates": candidates, "target_predict": target}
    # fill_bonus_tokens / fill_accept_out_cache_loc as the verify leaves them (accept stride = steps + 1).
    stride = STEPS + 1
    accept_lens = torch.randint(1, stride + 1, (BS,), generator=g, dtype=torch.int32)
    accept_index = torch.full((BS, stride), -1, dtype=torch.int64)
    for b, n in enumerate(accept_lens.tolist()):
        accept_index[b, :n] = torch.randperm(NUM_DRAFT, generator=g)[:n] + b * NUM_DRAFT
    cases["fill_bonus_tokens"] = {
        "accept_tokens": torch.randint(0, 1000, (BS, stride), generator=g, dtype=torch.int64),
        "accept_lens": accept_lens,
        "accept_stride": stride,
    }
    cases["fill_accept_out_cache_loc"] = {
        "accept_index": accept_index.view(-1),
        "out_cache_loc": torch.randint(0, 1 << 20, (BS * NUM_DRAFT,), generator=g, dtype=torch.int64),
        "size": int(accept_lens.sum()),
    }
    return cases


# ---------------------------------------------------------------------------------------------------------------
# The reference side (a subprocess with TRITON_INTERPRET=1): SGLang's own Triton kernels.
# ---------------------------------------------------------------------------------------------------------------


def _twin_source(sglang_dir: Path) -> str:
    """The twins' source (decorators included) copied out of the installed SGLang files, as one module."""
    parts = ["import torch", "import triton", "import triton.language as tl", ""]
    for rel, names in TWINS.items():
        text = (sglang_dir / rel).read_text()
        defs = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
        for name in names:
            if name not in defs:
                raise LookupError(f"{rel} of the installed SGLang has no Triton twin {name}: the reference moved")
            node = defs[name]
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            parts.append("\n".join(text.splitlines()[first - 1 : node.end_lineno]) + "\n")
    return "\n\n".join(parts)


def _run_twins(cases: dict) -> dict:  # runs in the subprocess
    import importlib

    twins = importlib.import_module("sglang_triton_twins")
    out = {}

    c = cases["assign_req_to_token_pool"]
    r2t = c["req_to_token"].clone()
    twins.assign_req_to_token_pool[(BS,)](
        c["req_pool_indices"], r2t, c["start_offset"], c["end_offset"], c["out_cache_loc"], POOL_LEN, _pow2(BS)
    )
    out["assign_req_to_token_pool"] = r2t

    c = cases["assign_extend_cache_locs"]
    loc = c["out_cache_loc"].clone()
    twins.assign_extend_cache_locs[(BS,)](
        c["req_pool_indices"], c["req_to_token"], c["start_offset"], c["end_offset"], loc, POOL_LEN, _pow2(BS)
    )
    out["assign_extend_cache_locs"] = loc

    c = cases["assign_draft_cache_locs_contiguous"]
    loc = c["out_cache_loc"].clone()
    twins.assign_draft_cache_locs_contiguous[(BS,)](
        c["req_pool_indices"], c["req_to_token"], c["seq_lens"], loc, POOL_LEN, TOPK, STEPS
    )
    out["assign_draft_cache_locs_contiguous"] = loc

    c = cases["build_draft_decode_metadata"]
    seq_lens = c["seq_lens"]
    width = int(seq_lens.sum()) * TOPK + BS * TOPK * STEPS
    kv_indices = torch.full((STEPS, width), -7, dtype=torch.int32)
    kv_indptr = torch.zeros((STEPS, BS * TOPK + 1), dtype=torch.int32)
    positions = seq_lens.repeat_interleave(TOPK)
    twins.generate_draft_decode_kv_indices[(STEPS, BS, TOPK)](
        c["req_pool_indices"],
        c["req_to_token"],
        seq_lens,
        kv_indices,
        kv_indptr,
        positions,
        POOL_LEN,
        kv_indices.shape[1],
        kv_indptr.shape[1],
        _pow2(BS),
        _pow2(STEPS),
        _pow2(BS * TOPK),
        1,
    )
    out["build_draft_decode_metadata"] = {"kv_indices": kv_indices, "kv_indptr": kv_indptr}

    c = cases["copy_all_layer_kv_cache"]
    bufs = [b.clone() for b in c["buffers"]]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in bufs], dtype=torch.int64)
    n = len(c["src_loc"])
    twins.copy_all_layer_kv_cache_tiled[(len(bufs), strides.max().item() // 128)](
        ptrs, strides, c["tgt_loc"], c["src_loc"], n, _pow2(n), BYTES_PER_TILE=128
    )
    out["copy_all_layer_kv_cache"] = bufs

    c = cases["build_tree"]
    tree = _tree_buffers()
    twins.sgl_build_tree_kernel_efficient_triton[(BS,)](
        c["parent_list"],
        c["selected_index"],
        c["verified_seq_len"],
        torch.cumsum(c["verified_seq_len"], 0) - c["verified_seq_len"],
        tree["tree_mask"],
        tree["positions"],
        tree["retrieve_index"],
        tree["retrieve_next_token"],
        tree["retrieve_next_sibling"],
        topk=TOPK,
        depth=STEPS,
        draft_token_num=NUM_DRAFT,
        tree_mask_mode=1,  # QLEN_ONLY
        batch_size=BS,
        parent_list_stride=c["parent_list"].stride(0),
        selected_index_stride=c["selected_index"].stride(0),
    )
    out["build_tree"] = tree

    c = cases["verify_tree_greedy"]
    v = _verify_buffers()
    twins.verify_tree_greedy_kernel_triton[(BS,)](
        v["predicts"],
        v["accept_index"],
        v["accept_token_num"],
        c["candidates"],
        tree["retrieve_index"],
        tree["retrieve_next_token"],
        tree["retrieve_next_sibling"],
        c["target_predict"],
        batch_size=BS,
        num_speculative_tokens=STEPS + 1,
        num_draft_tokens=NUM_DRAFT,
    )
    out["verify_tree_greedy"] = v

    c = cases["fill_bonus_tokens"]
    bonus = torch.full((BS,), -7, dtype=torch.int64)
    twins.fill_bonus_tokens[(BS,)](c["accept_tokens"], c["accept_lens"], bonus, c["accept_stride"])
    out["fill_bonus_tokens"] = bonus

    c = cases["fill_accept_out_cache_loc"]
    acc = torch.full((c["size"],), -7, dtype=torch.int64)
    size = c["accept_index"].numel()
    twins.fill_accept_out_cache_loc[(size,)](c["accept_index"], c["out_cache_loc"], acc, _pow2(size))
    out["fill_accept_out_cache_loc"] = acc
    return out


def _tree_buffers() -> dict:
    """As ``eagle_utils.build_tree_kernel_efficient`` allocates them for QLEN_ONLY."""
    return {
        "tree_mask": torch.full((NUM_DRAFT * BS * NUM_DRAFT,), True, dtype=torch.bool),
        "positions": torch.full((BS * NUM_DRAFT,), -7, dtype=torch.int64),
        "retrieve_index": torch.full((BS, NUM_DRAFT), -1, dtype=torch.int64),
        "retrieve_next_token": torch.full((BS, NUM_DRAFT), -1, dtype=torch.int64),
        "retrieve_next_sibling": torch.full((BS, NUM_DRAFT), -1, dtype=torch.int64),
    }


def _verify_buffers() -> dict:
    """As ``eagle_utils`` verify allocates them (greedy)."""
    return {
        "predicts": torch.full((BS * NUM_DRAFT,), -7, dtype=torch.int32),
        "accept_index": torch.full((BS, STEPS + 1), -1, dtype=torch.int32),
        "accept_token_num": torch.zeros((BS,), dtype=torch.int32),
    }


# ---------------------------------------------------------------------------------------------------------------
# Fixtures: the op package (private name) and the twins' outputs.
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sk():
    """The test-only ``sgl_kernel``: the one this process already imported if any, else loaded as
    ``_sgl_kernel_under_test`` (its attention ops register ``torch.ops.sgl_kernel.*`` either way)."""
    loaded = sys.modules.get("sgl_kernel") or sys.modules.get("_sgl_kernel_under_test")
    if loaded is not None and Path(loaded.__file__).resolve().is_relative_to(SGL_KERNEL_DIR):
        return loaded
    init = SGL_KERNEL_DIR / "sgl_kernel" / "__init__.py"
    spec = importlib.util.spec_from_file_location("_sgl_kernel_under_test", init, submodule_search_locations=[])
    spec.submodule_search_locations.append(str(init.parent))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cases():
    return _build_cases()


@pytest.fixture(scope="module")
def twins(cases, tmp_path_factory):
    sglang_spec = importlib.util.find_spec("sglang")
    if sglang_spec is None:
        pytest.skip("SGLang is not installed")
    work = tmp_path_factory.mktemp("twins")
    sglang_dir = Path(sglang_spec.submodule_search_locations[0])
    (work / "sglang_triton_twins.py").write_text(_twin_source(sglang_dir))
    torch.save(cases, work / "cases.pt")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(work), *[p for p in sys.path if p]]))
    r = subprocess.run(
        [sys.executable, __file__, str(work / "cases.pt"), str(work / "out.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return torch.load(work / "out.pt", weights_only=False)


# ---------------------------------------------------------------------------------------------------------------
# The bookkeeping ops against their Triton twins.
# ---------------------------------------------------------------------------------------------------------------


def test_assign_req_to_token_pool(sk, cases, twins):
    c = cases["assign_req_to_token_pool"]
    r2t = c["req_to_token"].clone()
    sk.assign_req_to_token_pool_cpu(
        c["req_pool_indices"], r2t, c["start_offset"], c["end_offset"], c["out_cache_loc"], POOL_LEN
    )
    assert not torch.equal(r2t, c["req_to_token"])
    assert torch.equal(r2t, twins["assign_req_to_token_pool"])


def test_assign_extend_cache_locs_is_its_inverse(sk, cases, twins):
    c = cases["assign_extend_cache_locs"]
    loc = c["out_cache_loc"].clone()
    sk.assign_extend_cache_locs_cpu(
        c["req_pool_indices"], c["req_to_token"], c["start_offset"], c["end_offset"], loc, POOL_LEN
    )
    assert (loc >= 0).all()
    assert torch.equal(loc, twins["assign_extend_cache_locs"])
    # the inverse of assign_req_to_token_pool: writing these slots back changes nothing
    r2t = c["req_to_token"].clone()
    sk.assign_req_to_token_pool_cpu(c["req_pool_indices"], r2t, c["start_offset"], c["end_offset"], loc, POOL_LEN)
    assert torch.equal(r2t, c["req_to_token"])


def test_assign_draft_cache_locs_contiguous(sk, cases, twins):
    c = cases["assign_draft_cache_locs_contiguous"]
    loc = c["out_cache_loc"].clone()
    sk.assign_draft_cache_locs_contiguous_cpu(
        c["req_pool_indices"], c["req_to_token"], c["seq_lens"], loc, POOL_LEN, TOPK, STEPS
    )
    assert (loc >= 0).all()
    assert torch.equal(loc, twins["assign_draft_cache_locs_contiguous"])


def test_build_draft_decode_metadata(sk, cases, twins):
    """Row ``i * topk + j`` of the table over its first ``seq_len + s + 1`` entries is the Triton backend's KV index
    list of candidate ``j`` of request ``i`` at draft step ``s`` (prefix, then that candidate's own draft slots)."""
    c = cases["build_draft_decode_metadata"]
    table = sk.build_draft_decode_metadata_cpu(
        c["req_to_token"], c["req_pool_indices"], c["seq_lens"], TOPK, STEPS, POOL_LEN
    )
    assert table.shape == (BS * TOPK, POOL_LEN)
    kv = twins["build_draft_decode_metadata"]["kv_indices"]
    seq_lens = c["seq_lens"].tolist()
    checked = 0
    for s in range(STEPS):
        n = s + 1
        for i, seq_len in enumerate(seq_lens):
            for j in range(TOPK):
                offset = sum(seq_lens[:i]) * TOPK + i * n * TOPK + j * (seq_len + n)
                ref = kv[s, offset : offset + seq_len + n]
                assert (ref >= 0).all()
                assert torch.equal(table[i * TOPK + j, : seq_len + n], ref.to(table.dtype)), (s, i, j)
                checked += 1
    assert checked == STEPS * BS * TOPK


def test_copy_all_layer_kv_cache(sk, cases, twins):
    c = cases["copy_all_layer_kv_cache"]
    bufs = [b.clone() for b in c["buffers"]]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in bufs], dtype=torch.int64)
    sk.copy_all_layer_kv_cache_cpu(ptrs, strides, c["tgt_loc"], c["src_loc"])
    for mine, ref, before in zip(bufs, twins["copy_all_layer_kv_cache"], c["buffers"], strict=True):
        assert torch.equal(mine, ref)
        # gathered before scattered: row 4 got the old row 3, row 5 the old row 4, though 4 and 5 were targets
        assert torch.equal(mine[c["tgt_loc"]], before[c["src_loc"]])


def test_build_tree_kernel_efficient_qlen_only(sk, cases, twins):
    c = cases["build_tree"]
    tree = _tree_buffers()
    sk.build_tree_kernel_efficient_cpu(
        c["parent_list"],
        c["selected_index"],
        c["verified_seq_len"],
        tree["tree_mask"],
        tree["positions"],
        tree["retrieve_index"],
        tree["retrieve_next_token"],
        tree["retrieve_next_sibling"],
        TOPK,
        STEPS,
        NUM_DRAFT,
        1,
    )
    for name, ref in twins["build_tree"].items():
        assert torch.equal(tree[name], ref), name
    # a real tree: some node has two children, some reaches depth 2 or more
    assert (tree["retrieve_next_sibling"] != -1).any()
    assert (tree["positions"].view(BS, NUM_DRAFT) - c["verified_seq_len"][:, None] >= 2).any()
    with pytest.raises(NotImplementedError, match="tree_mask_mode 0"):
        sk.build_tree_kernel_efficient_cpu(
            c["parent_list"], c["selected_index"], c["verified_seq_len"], *_tree_buffers().values(), TOPK, STEPS,
            NUM_DRAFT, 0,
        )  # fmt: skip


def test_verify_tree_greedy(sk, cases, twins):
    c = cases["verify_tree_greedy"]
    tree = twins["build_tree"]
    v = _verify_buffers()
    sk.verify_tree_greedy_cpu(
        predicts=v["predicts"],
        accept_index=v["accept_index"],
        accept_token_num=v["accept_token_num"],
        candidates=c["candidates"],
        retrive_index=tree["retrieve_index"],
        retrive_next_token=tree["retrieve_next_token"],
        retrive_next_sibling=tree["retrieve_next_sibling"],
        target_predict=c["target_predict"],
    )
    for name, ref in twins["verify_tree_greedy"].items():
        assert torch.equal(v[name], ref), name
    accepted = v["accept_token_num"].tolist()
    assert max(accepted) >= 2 and min(accepted) < STEPS, f"accepted {accepted}: the case tests too little"


def test_fill_bonus_tokens(sk, cases, twins):
    c = cases["fill_bonus_tokens"]
    bonus = torch.full((BS,), -7, dtype=torch.int64)
    sk.fill_bonus_tokens_cpu(c["accept_tokens"], c["accept_lens"], bonus, c["accept_stride"])
    assert torch.equal(bonus, twins["fill_bonus_tokens"])
    assert (bonus != -7).all()


def test_fill_accept_out_cache_loc(sk, cases, twins):
    c = cases["fill_accept_out_cache_loc"]
    acc = torch.full((c["size"],), -7, dtype=torch.int64)
    sk.fill_accept_out_cache_loc_cpu(c["accept_index"], c["out_cache_loc"], acc)
    assert torch.equal(acc, twins["fill_accept_out_cache_loc"])
    assert (acc != -7).all()


# ---------------------------------------------------------------------------------------------------------------
# The attention ops against math attention (and SDPA, as SGLang's torch_native backend calls it).
# ---------------------------------------------------------------------------------------------------------------

HQ, HKV, D, SLOTS = 8, 2, 64, 1024


def _math_attention(q, k, v, visible, scale, cap):
    """float64, one query row at a time: ``q [Hq, D]`` over ``k, v [m, Hkv, D]`` with ``visible [m]``."""
    group = q.shape[0] // k.shape[1]
    out = torch.empty(q.shape[0], v.shape[-1], dtype=torch.float64)
    for h in range(q.shape[0]):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()
        s = (kh @ q[h].double()) * scale
        if cap > 0:
            s = cap * torch.tanh(s / cap)
        s = torch.where(visible, s, torch.tensor(-math.inf, dtype=torch.float64))
        out[h] = torch.softmax(s, 0) @ vh
    return out


def _paged_batch(g, prefix_lens, extend_lens):
    """A KV pool with each request's prefix + extend keys at scattered slots, the extend queries and K/V."""
    bs = len(prefix_lens)
    k_buf, v_buf = torch.randn(SLOTS, HKV, D, generator=g), torch.randn(SLOTS, HKV, D, generator=g)
    req_to_token = torch.zeros(bs + 3, 512, dtype=torch.int32)
    rpi = torch.randperm(bs + 3, generator=g)[:bs].to(torch.int64)
    slots = torch.randperm(SLOTS, generator=g)
    used = 0
    for i, (p, n) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        req_to_token[rpi[i], : p + n] = slots[used : used + p + n].to(torch.int32)
        used += p + n
    total = sum(extend_lens)
    q = torch.randn(total, HQ, D, generator=g) * 2.5  # scores of several units: logit_cap 5 bites
    k_ext, v_ext = torch.randn(total, HKV, D, generator=g), torch.randn(total, HKV, D, generator=g)
    start, out_loc = 0, []
    for i, (p, n) in enumerate(zip(prefix_lens, extend_lens, strict=True)):
        out_loc.append(req_to_token[rpi[i], p : p + n].long())
        start += n
    out_loc = torch.cat(out_loc)
    k_buf[out_loc], v_buf[out_loc] = k_ext, v_ext  # forward_extend stores the extend's K/V before the call
    return {
        "q": q,
        "k_ext": k_ext,
        "v_ext": v_ext,
        "k_buf": k_buf,
        "v_buf": v_buf,
        "req_to_token": req_to_token,
        "rpi": rpi,
        "seq_lens": torch.tensor([p + n for p, n in zip(prefix_lens, extend_lens, strict=True)], dtype=torch.int64),
        "extend_lens": torch.tensor(extend_lens, dtype=torch.int32),
        "extend_start": torch.tensor([0, *torch.tensor(extend_lens).cumsum(0).tolist()[:-1]], dtype=torch.int32),
    }


def _extend(sk, b, *, cap=0.0, tree_mask=None, **overrides):
    o = torch.full_like(b["q"], float("nan"))
    args = dict(
        q_extend=b["q"],
        k_extend=b["k_ext"],
        v_extend=b["v_ext"],
        o_extend=o,
        k_buffer=b["k_buf"],
        v_buffer=b["v_buf"],
        key_scale=1.0,
        value_scale=1.0,
        req_to_token=b["req_to_token"],
        req_pool_indices=b["rpi"],
        seq_lens=b["seq_lens"],
        extend_seq_lens=b["extend_lens"],
        extend_start_loc=b["extend_start"],
        max_len_extend=int(b["extend_lens"].max()),
        sm_scale=D**-0.5,
        logit_cap=cap,
        is_cross_attention=False,
        sliding_window_size=0,  # SGLang passes layer.sliding_window_size + 1: 0 for none
        encoder_lens=None,
        sinks=None,
        tree_mask=tree_mask,
        is_causal=True,
    )
    args.update(overrides)
    torch.ops.sgl_kernel.extend_attention_cpu(*args.values())  # positionally, as intel_amx_backend.py calls it
    return o


def _extend_reference(b, cap, visible_extend):
    """``visible_extend(i, x)``: bool [n] over request i's extend keys for its query x."""
    out = torch.empty(b["q"].shape, dtype=torch.float64)
    for i, (rpi, seq_len, n, start) in enumerate(
        zip(
            b["rpi"].tolist(),
            b["seq_lens"].tolist(),
            b["extend_lens"].tolist(),
            b["extend_start"].tolist(),
            strict=True,
        )
    ):
        keys = b["req_to_token"][rpi, :seq_len].long()
        for x in range(n):
            visible = torch.cat([torch.ones(seq_len - n, dtype=torch.bool), visible_extend(i, x)])
            out[start + x] = _math_attention(
                b["q"][start + x], b["k_buf"][keys], b["v_buf"][keys], visible, D**-0.5, cap
            )
    return out


@pytest.mark.parametrize("cap", [0.0, 5.0])
def test_extend_attention_causal_prefix_and_extend(sk, cap):
    """Prefill (no prefix), chunked / draft extend (a prefix), GQA 8 over 2 heads, with and without logit_cap."""
    g = torch.Generator().manual_seed(7)
    b = _paged_batch(g, prefix_lens=[0, 37, 150, 5], extend_lens=[23, 9, 1, 40])
    o = _extend(sk, b, cap=cap)
    ref = _extend_reference(b, cap, lambda i, x: torch.arange(int(b["extend_lens"][i])) <= x)
    torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)
    if cap:  # the cap changed the answer, so the comparison above held it
        assert (o - _extend(sk, b, cap=0.0)).abs().max() > 1e-2
    else:  # SGLang torch_native's formulation: SDPA over the whole sequence, causal, GQA, the extend rows kept
        start = 0
        for rpi, seq_len, n in zip(b["rpi"].tolist(), b["seq_lens"].tolist(), b["extend_lens"].tolist(), strict=True):
            keys = b["req_to_token"][rpi, :seq_len].long()
            q = torch.zeros(HQ, seq_len, D)
            q[:, seq_len - n :] = b["q"][start : start + n].movedim(0, 1)
            sdpa = torch.nn.functional.scaled_dot_product_attention(
                q[None], b["k_buf"][keys].movedim(0, 1)[None], b["v_buf"][keys].movedim(0, 1)[None],
                is_causal=True, enable_gqa=True, scale=D**-0.5,
            )[0].movedim(0, 1)  # fmt: skip
            torch.testing.assert_close(o[start : start + n], sdpa[seq_len - n :], rtol=1e-4, atol=1e-4)
            start += n


def test_extend_attention_target_verify_tree_mask(sk, cases, twins):
    """Target verify of a tree (topk > 1): each request extends by its ``NUM_DRAFT`` verify tokens, which see the
    whole prefix and, among themselves, only their ancestors and themselves: the QLEN_ONLY mask of the verify tree
    (SGLang's Triton build of the test's tree), which differs from causal."""
    g = torch.Generator().manual_seed(8)
    tree_mask = twins["build_tree"]["tree_mask"]
    b = _paged_batch(g, prefix_lens=[60, 3, 130, 17, 1], extend_lens=[NUM_DRAFT] * BS)
    blocks = tree_mask.view(BS, NUM_DRAFT, NUM_DRAFT)
    assert not torch.equal(blocks, torch.ones(NUM_DRAFT, NUM_DRAFT, dtype=torch.bool).tril().expand_as(blocks))
    for cap in (0.0, 5.0):
        o = _extend(sk, b, cap=cap, tree_mask=tree_mask)
        ref = _extend_reference(b, cap, lambda i, x: blocks[i, x])
        torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)
        assert (_extend(sk, b, cap=cap) - o).abs().max() > 1e-3  # the mask mattered: causal answers differ


@pytest.mark.parametrize("write_kv", [True, False])
def test_decode_attention(sk, write_kv):
    """One query per sequence over ``req_to_token[rpi, :seq_len]``; given key/value/loc it first stores them at
    ``loc`` (SGLang's decode writes K/V in the kernel) and leaves every other cache row as it was. Also the draft
    decode's expanded table (``build_draft_decode_metadata``' rows, ``req_pool_indices = arange``)."""
    g = torch.Generator().manual_seed(9)
    b = _paged_batch(g, prefix_lens=[0, 0, 0, 0, 0, 0], extend_lens=[1, 64, 200, 7, 129, 33])
    bs = len(b["seq_lens"])
    q = torch.randn(bs, HQ, D, generator=g) * 2.5
    key, value = torch.randn(bs, HKV * D, generator=g), torch.randn(bs, HKV * D, generator=g)
    loc = torch.stack(
        [b["req_to_token"][r, s - 1] for r, s in zip(b["rpi"].tolist(), b["seq_lens"].tolist(), strict=True)]
    ).long()
    k_buf, v_buf = b["k_buf"].clone(), b["v_buf"].clone()
    if write_kv:  # what the reference reads: the new rows in place
        b["k_buf"][loc], b["v_buf"][loc] = key.view(bs, HKV, D), value.view(bs, HKV, D)
    for cap in (0.0, 30.0):
        out = torch.full_like(q, float("nan"))
        torch.ops.sgl_kernel.decode_attention_cpu(
            q, k_buf, v_buf, 1.0, 1.0, out,
            key if write_kv else None, value if write_kv else None, loc if write_kv else None,
            torch.zeros(bs, HQ, 8, D + 1), b["req_to_token"], b["rpi"], b["seq_lens"], D**-0.5, cap, False, 0, None,
            None,
        )  # fmt: skip
        assert torch.equal(k_buf, b["k_buf"]) and torch.equal(v_buf, b["v_buf"])
        for i, (rpi, seq_len) in enumerate(zip(b["rpi"].tolist(), b["seq_lens"].tolist(), strict=True)):
            keys = b["req_to_token"][rpi, :seq_len].long()
            ref = _math_attention(
                q[i], b["k_buf"][keys], b["v_buf"][keys], torch.ones(seq_len, dtype=torch.bool), D**-0.5, cap
            )
            torch.testing.assert_close(out[i].double(), ref, rtol=1e-5, atol=1e-5)
        if not cap:
            for i, (rpi, seq_len) in enumerate(zip(b["rpi"].tolist(), b["seq_lens"].tolist(), strict=True)):
                keys = b["req_to_token"][rpi, :seq_len].long()
                sdpa = torch.nn.functional.scaled_dot_product_attention(
                    q[i][:, None][None], b["k_buf"][keys].movedim(0, 1)[None], b["v_buf"][keys].movedim(0, 1)[None],
                    enable_gqa=True, scale=D**-0.5,
                )[0, :, 0]  # fmt: skip
                torch.testing.assert_close(out[i], sdpa, rtol=1e-4, atol=1e-4)


def test_attention_ops_refuse_what_they_do_not_implement(sk):
    g = torch.Generator().manual_seed(10)
    b = _paged_batch(g, prefix_lens=[4], extend_lens=[3])
    for override, named in [
        ({"sliding_window_size": 129}, "sliding_window"),
        ({"sinks": torch.zeros(HQ)}, "sinks"),
        ({"is_cross_attention": True}, "is_cross_attention"),
        ({"key_scale": 0.5}, "kv_scales"),
        ({"is_causal": False}, "non_causal"),
        ({"k_extend": None}, "missing_extend_kv"),
    ]:
        with pytest.raises(NotImplementedError, match=f"extend_attention_cpu: {named}"):
            _extend(sk, b, **override)
    q = torch.randn(1, HQ, D)
    with pytest.raises(NotImplementedError, match="decode_attention_cpu: sliding_window"):
        torch.ops.sgl_kernel.decode_attention_cpu(
            q, b["k_buf"], b["v_buf"], 1.0, 1.0, torch.empty_like(q), None, None, None, torch.zeros(1, HQ, 8, D + 1),
            b["req_to_token"], b["rpi"], b["seq_lens"], D**-0.5, 0.0, False, 4097, None, None,
        )  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Names: what SGLang binds resolves; anything else raises naming itself.
# ---------------------------------------------------------------------------------------------------------------


def test_names_sglang_binds_resolve_and_unknown_ones_raise(sk):
    for name in sk.IMPLEMENTED:
        assert callable(getattr(sk, name)), name
    for name in ("extend_attention_cpu", "decode_attention_cpu"):  # intel_amx_backend.py binds these two
        assert hasattr(torch.ops.sgl_kernel, name)
    # what a newer SGLang might call (this one's multi-layer EAGLE does): raised on access, naming it
    with pytest.raises(AttributeError, match=r"sgl_kernel\.rotate_input_ids_cpu: not implemented"):
        sk.rotate_input_ids_cpu  # noqa: B018
    with pytest.raises(AttributeError, match="some_future_op"):
        getattr(sk, "some_future_op")  # noqa: B009
    assert not hasattr(sk, "some_future_op")  # a probe sees it missing, as in a real build without it
    with pytest.raises(ImportError, match="rotate_input_ids_cpu"):
        exec(f"from {sk.__name__} import rotate_input_ids_cpu")  # SGLang's module-level import form
    with pytest.raises(AttributeError, match="fused_sigmoid_mul_cpu"):
        torch.ops.sgl_kernel.fused_sigmoid_mul_cpu  # noqa: B018


if __name__ == "__main__":  # the reference side: python test_sgl_kernel_torch.py CASES OUT, TRITON_INTERPRET=1
    assert os.environ.get("TRITON_INTERPRET") == "1", "the Triton twins run on CPU tensors only when interpreted"
    torch.save(_run_twins(torch.load(sys.argv[1], weights_only=False)), sys.argv[2])
