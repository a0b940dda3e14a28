"""The speculative-decoding bookkeeping ops of SGLang's CPU path, each named with its call site in SGLang 0.5.23 and
written from what it computes (Triton twins of the same files: the unit tests' references). Index tensors are read
with ``.tolist()`` and written in place; loops are per request (tiny test batches)."""

from __future__ import annotations

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``srt/mem_cache/allocation.py`` ``assign_req_to_token_pool_func``: request ``i``'s slots
    ``req_to_token[rpi[i], start[i]:end[i]]`` take the next ``end[i] - start[i]`` entries of ``out_cache_loc``
    (requests in order)."""
    offset = 0
    for rpi, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        n = end - start
        req_to_token[rpi, start:end] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``kernels/ops/speculative/cache_locs.py`` (``assign_extend_cache_locs`` twin): the inverse of
    :func:`assign_req_to_token_pool_cpu`, ``out_cache_loc`` = the concatenated
    ``req_to_token[rpi[i], start[i]:end[i]]``. Called for the verify window (``eagle_utils.py`` ->
    ``assign_extend_cache_locs_uniform_func`` -> ``assign_extend_cache_locs_func``, cache_locs.py:740) and, after
    a tree verify (topk > 1), from ``fill_front_out_cache_loc_func`` (:763) with ``req_to_token`` = the batch's
    ``out_cache_loc`` windows (int32), ``req_pool_indices`` = ``arange(bs)`` and ``start`` = 0."""
    offset = 0
    for rpi, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        n = end - start
        out_cache_loc[offset : offset + n] = req_to_token[rpi, start:end].to(out_cache_loc.dtype)
        offset += n


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """``cache_locs.py`` ``assign_draft_cache_locs_contiguous_func``: request ``i``'s ``topk * num_steps`` draft slots,
    ``req_to_token[rpi[i], seq_lens[i] : + topk * num_steps]``, into ``out_cache_loc[i * topk * num_steps :]``."""
    n = topk * num_steps
    for i, (rpi, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        out_cache_loc[i * n : (i + 1) * n] = req_to_token[rpi, seq_len : seq_len + n].to(out_cache_loc.dtype)


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """``srt/layers/attention/intel_amx_backend.py`` ``IntelAMXMultiStepDraftBackend.init_forward_metadata``: one
    ``req_to_token`` row per (request ``i``, candidate ``j``), at row ``i * topk + j``: the request's prefix slots
    ``[0, seq_len)``, then candidate ``j``'s draft-step slots ``req_to_token[rpi, seq_len + j * num_steps :
    + num_steps]`` (page size 1; ``generate_draft_decode_kv_indices``' layout). Returns ``[bs * topk, pool_len]``."""
    rows = torch.zeros((len(seq_lens) * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for i, (rpi, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        for j in range(topk):
            row = rows[i * topk + j]
            row[:seq_len] = req_to_token[rpi, :seq_len]
            row[seq_len : seq_len + num_steps] = req_to_token[
                rpi, seq_len + j * num_steps : seq_len + (j + 1) * num_steps
            ]
    return rows


QLEN_ONLY = 1  # speculative/spec_tree.py TreeMaskMode: the only mode SGLang builds on CPU (eagle_utils.py)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """``kernels/ops/speculative/spec_tree.py`` ``build_tree_kernel_efficient_func`` (from ``eagle_utils.py``
    ``build_tree_kernel_efficient``), for the ``QLEN_ONLY`` mask SGLang builds on CPU. Per request ``b`` with ``N =
    draft_token_num`` verify tokens (token 0: the last verified token; token ``t >= 1``: the draft
    ``selected_index[b, t - 1]``, whose parent is ``parent_list[b, selected_index[b, t - 1] // topk]``, token 0 when
    that index is 0):

    * ``retrieve_index[b, t] = b * N + t``; ``retrieve_next_token[b, p]`` = p's first child and
      ``retrieve_next_sibling[b, t]`` = t's next sibling (children in increasing ``t``), -1 for none;
    * ``tree_mask[b * N * N + N * x + y]`` = token ``y`` is ``x`` itself or an ancestor of ``x`` (its row over the
      ``N`` verify tokens only, the prefix always visible);
    * ``positions[b * N + x] = verified_seq_len[b] + depth of x``.
    """
    if int(tree_mask_mode) != QLEN_ONLY:
        raise NotImplementedError(
            f"build_tree_kernel_efficient_cpu: tree_mask_mode {int(tree_mask_mode)}; the test-only op builds the "
            "QLEN_ONLY mask SGLang uses on CPU"
        )
    n = draft_token_num
    mask = tree_mask.view(-1)
    pos = positions.view(-1)
    for b, seq_len in enumerate(verified_seq_len.tolist()):
        sel = selected_index[b].tolist()
        parents = parent_list[b].tolist()

        def parent_of(t: int, sel: list[int] = sel, parents: list[int] = parents) -> int | None:
            """Position (0 .. N-1) of verify token t's parent, None when not among the selected drafts."""
            tb = sel[t - 1] // topk
            if tb == 0:
                return 0
            token = parents[tb]
            return next((p + 1 for p in range(n - 1) if sel[p] == token), None)

        retrieve_index[b] = torch.arange(b * n, (b + 1) * n, dtype=retrieve_index.dtype)
        for t in range(n - 1, 0, -1):  # from the last, so each parent's child list ends up in increasing order
            p = parent_of(t)
            if p is None:
                continue
            first = int(retrieve_next_token[b, p])
            retrieve_next_token[b, p] = t
            if first != -1:
                retrieve_next_sibling[b, t] = first
        for x in range(n):
            row = b * n * n + n * x
            mask[row : row + n] = False
            mask[row] = True
            d, t = 0, x
            while t > 0 and d < depth:
                mask[row + t] = True
                d += 1
                p = parent_of(t)
                if p is None:
                    break
                t = p
            pos[b * n + x] = seq_len + d


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """``spec_tree.py`` ``verify_tree_greedy_func`` (from ``eagle_utils.py`` verify): per request, from the root, step
    to the first child whose draft token (``candidates``) equals the target's greedy token at the last accepted
    node (``target_predict``, flat index = that node's ``retrive_index``), trying siblings in order; stop at the first
    level with no match. ``accept_index[b, k]`` = the ``k``-th accepted node's flat index (``[b, 0]`` the root),
    ``accept_token_num[b]`` = drafts accepted, ``predicts[flat]`` = the target's token at each accepted node (the
    last one's is the bonus). Entries past the accepted path are left as given (SGLang fills them with -1)."""
    spec = accept_index.shape[1]
    flat_target = target_predict.reshape(-1)
    flat_predicts = predicts.view(-1)
    for b in range(candidates.shape[0]):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, spec):
            cur = int(retrive_next_token[b, cur])
            target = flat_target[last]
            while cur != -1 and candidates[b, cur] != target:
                cur = int(retrive_next_sibling[b, cur])
            if cur == -1:
                break
            flat_predicts[last] = target
            accepted += 1
            last = int(retrive_index[b, cur])
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        flat_predicts[last] = flat_target[last]


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``kernels/ops/speculative/eagle.py`` ``fill_bonus_tokens_func``: ``bonus[i] = accept_tokens.flat[stride * i +
    accept_lens[i] - 1]`` (the last accepted slot; ``accept_lens`` counts the bonus token)."""
    flat = accept_tokens.reshape(-1)
    for i, n in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[accept_stride * i + n - 1]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """``eagle.py`` ``fill_accept_out_cache_loc_func`` (topk > 1): the accepted entries of ``accept_index`` (those
    not -1, in order) each take ``out_cache_loc[entry]``, packed to the front of ``accept_out_cache_loc``."""
    dst = 0
    for src in accept_index.reshape(-1).tolist():
        if src != -1:
            accept_out_cache_loc[dst] = out_cache_loc[src]
            dst += 1
