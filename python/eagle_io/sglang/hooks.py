"""The SGLang functions eagle-io hooks (through ``sglang.srt.plugins.hook_registry.HookRegistry``), each with why
there. Nothing here imports SGLang at module import time.
"""

from __future__ import annotations

__all__ = ["ACCEPT_HOOK", "DRAFT_EXTEND_DECODE_HOOK", "DRAFT_EXTEND_PREFILL_HOOK", "STARTUP_HOOK", "TP_FORWARD_HOOK"]

STARTUP_HOOK = "sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs"
"""``Scheduler.init_model_worker`` runs ``init_tp_model_worker``, ``maybe_init_draft_worker``,
``init_memory_pools``, ``init_all_attention_backends`` (which calls ``configure_aux_hidden_state_capture`` ->
``model.set_eagle3_layers_to_capture``) and then ``init_all_cuda_graphs``: a BEFORE hook here sees the final
capture settings before any graph is captured."""

DRAFT_EXTEND_PREFILL_HOOK = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill"
"""``(self, batch, target_hidden_states, next_token_ids, ...)``: the target prefill's states (FULL capture)
become ``EagleDraftExtendInput.hidden_states``; always eager."""

DRAFT_EXTEND_DECODE_HOOK = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode"
"""``(self, batch, batch_result, *, kv_loc_plan)``: ``batch_result.logits_output.hidden_states`` (the verify
forward's states) becomes ``EagleDraftExtendInput.hidden_states``; may replay a CUDA graph afterwards, but this
Python entry runs on the host every step."""

ACCEPT_HOOK = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.on_verify_complete_cpu"
"""``(self, num_correct_drafts_per_req: list[int], batch_size=0)``, called by
``batch_result_processor._resolve_spec_v2_tokens`` with counts already on the CPU; accept length of a request
step = correct drafts + 1 (the bonus token)."""

TP_FORWARD_HOOK = "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"
"""``(self, batch: ScheduleBatch, forward_batch=None, ...) -> GenerationBatchResult``: its ``logits_output`` holds
``hidden_states`` (capture-only / EAGLE3 FULL mode: ``pack_aux_hidden_states``, ``[T, k*H]``) and
``last_hidden_states`` (post-norm final states, ``[T, H]``; ``LogitsProcessor._get_last_hidden_states_to_store``
keeps them when ``aux_hidden_state_capture`` is set)."""
