"""Reference EAGLE-3 draft training on eagle-io shards (CPU-friendly, single process).

Recipe (SpecForge's offline EAGLE-3 path with a TTT length of 1; sources cited per step):

1. **Shift** (:func:`eagle_io.feed.shift_targets`, ``loss_mask="target"``; SpecForge ``TargetHead.preprocess`` +
   ``specforge.utils.padding(left=False)`` and ``normalize_offline_sample``'s ``loss_mask[-1] = 0``): position ``t``
   is fed ``aux[t]`` and the embedding of ``input_ids[t+1]`` and trained toward the target's distribution at ``t+1``
   (``lm_head(hidden_states[t+1])``, which predicts token ``t+2``); the last position has no target (mask 0). The
   loss mask moves with the targets (``mask[t] = loss_mask[t+1]``); SpecForge instead keeps ``loss_mask[t]``
   unshifted (it differs only at the two edges of each assistant span). Batches come from
   :class:`eagle_io.feed.ShardDataset` (aligned ``max_length`` truncation) and :class:`eagle_io.feed.PaddingCollator`.
2. **Teacher** (SpecForge ``_compute_target_p``): full-vocabulary target logits ``hidden[t+1] @ W_lm^T``; the
   target token is their argmax; positions whose target token is outside the draft vocabulary are masked out;
   ``target_p = softmax(logits[..., t2d])`` renormalised over the draft vocabulary. The full-vocabulary argmax is
   computed once per sample and cached (the head is frozen); the draft-vocabulary slice per step.
3. **Loss** (SpecForge ``LogSoftmaxLoss``): soft cross-entropy ``-sum(target_p * log_softmax(draft_logits))`` over
   masked positions, here averaged over masked positions (SpecForge averages over all positions).
4. **Test-time training** (``ttt_length = K``; SpecForge ``OnlineEagle3Model.forward``, ``--ttt-length``, default
   7 there, 1 here): the draft is unrolled ``K`` steps (:meth:`eagle_io.draft.Eagle3Draft.ttt_forward`), step ``k``
   fed its own step-``k-1`` hidden state and the ids, targets and loss mask shifted left ``k`` positions; the loss is
   ``sum_k 0.8**k * loss_k`` (SpecForge ``Eagle3Strategy``, ``ploss_decay = 0.8``,
   ``specforge/training/strategies/base.py``), each ``loss_k`` averaged over step ``k``'s masked positions. ``K = 1``
   runs the plain forward: the same computation as before TTT existed.
5. **Metrics**: top-1 agreement = draft argmax mapped through ``d2t`` equals the target's full-vocabulary argmax,
   over held-out masked positions (``agreement``), and over those whose target token is in the draft vocabulary
   (``agreement_in_vocab``, SpecForge's ``acc``); with ``accept_steps`` the held-out offline accept length at that
   many draft steps (:func:`eagle_io.draft.acceptance.offline_accept`: joint, bonus token counted, with the
   product-of-marginals figure beside it).

Not implemented: multi-process/GPU training.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, IncompatibleDatasetError, InvalidArgumentError, NonFiniteTrainingError
from ..sglang.draft_build import fc_skip_problem
from .acceptance import offline_accept
from .batches import Teacher, check_finite_batch, make_batch
from .model import Eagle3Draft, Eagle3DraftConfig

__all__ = [
    "TargetHead",
    "Teacher",
    "TrainConfig",
    "TrainResult",
    "build_draft",
    "check_finite_batch",
    "config_json",
    "evaluate",
    "load_target_head",
    "make_batch",
    "split_positions",
    "train_draft",
    "write_summary",
]


# --- the target's frozen head --------------------------------------------------------------------------


@dataclass
class TargetHead:
    """The frozen pieces of the target a draft trains against.

    Attributes:
        lm_head: ``[vocab, H]``, the target's output projection (teacher logits = ``h @ lm_head.T``), in the dtype
            the checkpoint stores it in (bfloat16 for an FP8 one, dequantised; float32 from a GGUF); the same tensor
            as ``embed`` when the target ties them.
        embed: ``[vocab, H]``, the target's input embedding (the draft's frozen ``embed_tokens``), likewise.
        config: ``hidden_size``, ``vocab_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
            ``intermediate_size``, ``rms_norm_eps``, ``rope_theta``, ``max_position_embeddings``,
            ``bos_token_id``, ``eos_token_id``, ``model_id``: used to shape the draft like the target.
    """

    lm_head: torch.Tensor
    embed: torch.Tensor
    config: dict[str, Any]
    #: The target's identity (``load_target``'s info: ``model_id``, ``architecture``, ``num_layers``,
    #: ``hidden_size``, ``vocab_size``, ``files``), compared with a dataset's record
    #: (:mod:`eagle_io.store.target_identity`); None for a head built otherwise.
    identity: dict[str, Any] | None = None
    #: The target's configuration as its ``config.json`` spells it (``architectures`` included), for the serving
    #: checks of a draft evaluated on it (:func:`eagle_io.spec.load_served_draft`); None for a head built otherwise.
    target_config: dict[str, Any] | None = None

    @classmethod
    def from_model(cls, model: torch.nn.Module, model_id: str = "") -> TargetHead:
        """From a loaded Hugging Face causal LM (e.g. ``eagle_io.capturing.models.load_target``'s model), its
        tensors copied in float32."""
        return cls(
            lm_head=model.get_output_embeddings().weight.detach().float().clone(),
            embed=model.get_input_embeddings().weight.detach().float().clone(),
            config=_draft_shape(model.config, model_id),
            target_config=config_json(model.config, type(model).__name__),
        )


def _draft_shape(cfg: Any, model_id: str) -> dict[str, Any]:
    """:attr:`TargetHead.config` from a transformers config (its class defaults fill what config.json leaves out)."""
    heads = int(cfg.num_attention_heads)
    rope = getattr(cfg, "rope_theta", None)
    if rope is None:
        params = getattr(cfg, "rope_parameters", None) or {}
        rope = params.get("rope_theta", 10000.0)
    return {
        "hidden_size": int(cfg.hidden_size),
        "vocab_size": int(cfg.vocab_size),
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(cfg, "num_key_value_heads", heads) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        "intermediate_size": int(cfg.intermediate_size),
        "rms_norm_eps": float(f"{float(getattr(cfg, 'rms_norm_eps', 1e-5)):.6g}"),  # GGUF stores float32
        "rope_theta": float(rope),
        "max_position_embeddings": int(getattr(cfg, "max_position_embeddings", 4096)),
        "bos_token_id": getattr(cfg, "bos_token_id", None),
        "eos_token_id": getattr(cfg, "eos_token_id", None),
        "model_id": model_id,
    }


def config_json(cfg: Any, architecture: str) -> dict[str, Any]:
    """A transformers config as its ``config.json`` spells it, ``architectures`` set to ``[architecture]`` (every
    value JSON-safe: what the serving checks read from a checkpoint directory)."""
    out = cfg.to_dict()
    out["architectures"] = [architecture]
    return json.loads(json.dumps(out, default=str))


def load_target_head(model: str | os.PathLike[str] | None = None, *, full_sha256: bool | None = None) -> TargetHead:
    """The target's head: its input embedding and ``lm_head``, its config and identity, without its layers.

    An HF directory with safetensors weights: those two tensors alone are read from the shards
    (:func:`eagle_io.capturing.weights.read_head`, through ``model.safetensors.index.json``), in their stored dtype,
    and the config from ``config.json`` (a wrapper's ``text_config``): memory and time are the head's, whatever the
    model's size (a 70B: 2 x 128256 x 8192 bf16, 4.2 GB). A GGUF file (default: the embedded SmolLM2-135M-Instruct,
    ~25 s on CPU) is dequantised whole by transformers (:func:`eagle_io.capturing.models.load_target`, which refuses
    one that cannot fit in memory) and its two tensors kept in float32.

    Args:
        full_sha256: the identity records every file's sha256; None: as ``$EAGLE_IO_TARGET_SHA256`` says
            (:func:`eagle_io.capturing.weights.target_files`).

    Raises:
        TargetNotFoundError: the model path does not exist.
        CheckpointError: no ``config.json`` or no readable embedding in the safetensors shards
            (:func:`eagle_io.capturing.weights.read_head`).
        InvalidArgumentError: a GGUF whose whole model cannot fit in memory.
    """
    from ..capturing.models import default_gguf_path, load_target
    from ..capturing.weights import read_head, target_files
    from ..errors import TargetNotFoundError
    from ..sglang.checkpoint import read_checkpoint

    path = Path(model if model is not None else default_gguf_path()).expanduser().resolve()
    if not path.exists():
        raise TargetNotFoundError(f"target model path {path} does not exist (no hub downloads)")
    keys = ("model_id", "architecture", "num_layers", "hidden_size", "vocab_size", "files")
    if path.is_file() or not any(path.glob("*.safetensors")):
        net, _tok, info = load_target(path, dtype=torch.float32, full_sha256=full_sha256)
        head = TargetHead.from_model(net, info["model_id"])
        head.identity = {k: info[k] for k in keys if k in info}
        return head
    ckpt = read_checkpoint(path)  # config.json (CheckpointError without it)
    embed, lm_head = read_head(path)
    cfg = _text_config(path)
    head = TargetHead(lm_head=lm_head, embed=embed, config=_draft_shape(cfg, path.name))
    head.target_config = ckpt.config
    head.identity = {
        "model_id": path.name,
        "architecture": ckpt.architecture,
        "num_layers": ckpt.num_layers,
        "hidden_size": ckpt.hidden_size,
        "vocab_size": ckpt.vocab_size,
        "files": target_files(path, full_sha256=full_sha256),
    }
    if tuple(embed.shape) != (ckpt.vocab_size, ckpt.hidden_size) and ckpt.vocab_size is not None:
        raise CheckpointError(
            f"{path}: the embedding is {list(embed.shape)} but config.json gives vocab_size {ckpt.vocab_size}, "
            f"hidden_size {ckpt.hidden_size}",
            path,
        )
    return head


def _text_config(path: Path) -> Any:
    """The language model's transformers config of a checkpoint (``config.json``; a wrapper's ``text_config``);
    an architecture transformers does not know is read as its JSON with attribute access."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(path, local_files_only=True)
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    except (ValueError, KeyError, OSError):  # a model_type transformers does not ship (remote code: not run)
        raw = json.loads((path / "config.json").read_text())
        return SimpleNamespace(**(raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw))


# --- training -------------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    """Training settings. Lengths are tokens; ``lr`` is AdamW's peak learning rate (linear warm-up over
    ``warmup_steps``, cosine decay to 10% at ``steps``). ``ttt_length``: TTT unroll steps (module docstring);
    ``accept_steps``: draft steps of the held-out offline accept length (0: not measured); ``seq_length``: the
    longest sequence trained on (``train-draft --max-length``): the feed's cut (``ShardDataset(max_length=)``) of
    datasets given as paths, and the bound of the unroll lengths."""

    steps: int = 300
    batch_size: int = 4
    seq_length: int = 512
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    grad_clip: float = 0.5
    eval_fraction: float = 0.1
    eval_samples: int | None = None
    eval_every: int = 0
    seed: int = 0
    threads: int | None = None
    intermediate_size: int | None = None
    log_every: int = 10
    ttt_length: int = 1
    accept_steps: int = 3

    def __post_init__(self) -> None:
        """Every setting checked here, where it enters (before a dataset is read or anything is written): each
        bounded as it can be used, the unroll lengths by ``seq_length`` (a TTT step or draft step k reads the
        token k positions on, so ``seq_length - 1`` is the most that trains or measures anything).

        Raises:
            InvalidArgumentError: names each setting out of its bounds (as its train-draft option), with the bound.
        """
        bad = []

        def whole(name: str, value: Any, low: int, high: int | None = None, why: str = "", option: str = "") -> None:
            ok = type(value) is int and value >= low and (high is None or value <= high)
            if not ok:
                span = f">= {low}" if high is None else f"in [{low}, {high}]"
                bad.append(f"{option or '--' + name.replace('_', '-')} {value!r} (must be an integer {span}{why})")

        whole("steps", self.steps, 1)
        whole("batch_size", self.batch_size, 1)
        whole("seq_length", self.seq_length, 2, why=": one token and the next it predicts", option="--max-length")
        whole("warmup_steps", self.warmup_steps, 0)
        whole("eval_every", self.eval_every, 0)
        whole("log_every", self.log_every, 0)
        whole("seed", self.seed, 0)
        unroll = (
            f" for --max-length {self.seq_length}: step k predicts k tokens on" if type(self.seq_length) is int else ""
        )
        top = max(self.seq_length - 1, 1) if type(self.seq_length) is int else None
        whole("ttt_length", self.ttt_length, 1, top, unroll)
        whole("accept_steps", self.accept_steps, 0, top, unroll)
        for name in ("eval_samples", "threads", "intermediate_size"):
            if getattr(self, name) is not None:
                whole(name, getattr(self, name), 1)
        for name, value in (("lr", self.lr), ("grad_clip", self.grad_clip)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                bad.append(f"--{name.replace('_', '-')} {value!r} (must be a finite number > 0)")
        if not (
            isinstance(self.weight_decay, (int, float)) and math.isfinite(self.weight_decay) and self.weight_decay >= 0
        ):
            bad.append(f"weight_decay {self.weight_decay!r} (must be a finite number >= 0)")
        if not (isinstance(self.eval_fraction, (int, float)) and 0 < self.eval_fraction < 1):
            bad.append(f"eval_fraction {self.eval_fraction!r} (must be in (0, 1))")
        if bad:
            raise InvalidArgumentError("train-draft settings out of bounds: " + "; ".join(bad))


@dataclass
class TrainResult:
    """What :func:`train_draft` measured. Agreements are fractions in [0, 1]; losses are nats per masked token."""

    model: Eagle3Draft
    initial: dict[str, float]
    final: dict[str, float]
    history: list[dict[str, float]] = field(default_factory=list)
    train_samples: int = 0
    eval_samples: int = 0
    steps: int = 0
    train_tokens: int = 0
    seconds: float = 0.0
    teacher_seconds: float = 0.0
    skipped_records: int = 0
    empty_steps: int = 0
    unsupervised_samples: int = 0
    train_sample_ids: list[int] = field(default_factory=list)
    eval_sample_ids: list[int] = field(default_factory=list)
    ttt_length: int = 1

    def summary(self) -> dict[str, Any]:
        first = [h["loss"] for h in self.history[:10]]
        last = [h["loss"] for h in self.history[-10:]]
        return {
            "steps": self.steps,
            "train_samples": self.train_samples,
            "eval_samples": self.eval_samples,
            "train_tokens_seen": self.train_tokens,
            "train_loss_first10": sum(first) / len(first) if first else None,
            "train_loss_last10": sum(last) / len(last) if last else None,
            "initial": self.initial,
            "final": self.final,
            "seconds": round(self.seconds, 2),
            "teacher_argmax_seconds": round(self.teacher_seconds, 2),
            "skipped_corrupt_records": self.skipped_records,
            "steps_without_samples": self.empty_steps,
            "unsupervised_samples_skipped": self.unsupervised_samples,
            "ttt_length": self.ttt_length,
        }


TTT_LOSS_DECAY = 0.8
"""SpecForge's per-step TTT loss weight ``0.8**k`` (``Eagle3Strategy(ploss_decay=0.8)``)."""


def _shift(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` shifted left ``k`` positions along dim 1, zeros past the end (SpecForge's ``padding(.., left=False)``)."""
    if k == 0:
        return x
    return torch.cat((x[:, k:], torch.zeros_like(x[:, :k])), dim=1)


def _ttt_losses(
    model: Eagle3Draft, batch: dict[str, torch.Tensor], head_draft: torch.Tensor, steps: int
) -> tuple[torch.Tensor, dict[str, Any]]:
    """:func:`_losses` unrolled ``steps`` TTT steps (module docstring, 4): the weighted loss, step 0's counts under
    the usual keys and every step's under ``step_*`` lists."""
    all_logits = model.ttt_forward(batch["aux"], batch["next_ids"], steps)
    with torch.no_grad():
        target_p = torch.softmax(batch["target_hidden"].float() @ head_draft.T, dim=-1)
    draft_ids = model.draft_token_ids()
    loss = torch.zeros((), dtype=torch.float32)
    stats: dict[str, Any] = {"step_loss": [], "step_agree": [], "step_mask": []}
    for k, logits in enumerate(all_logits):
        target_ids, mask = _shift(batch["target_ids"], k), _shift(batch["mask"], k)
        in_vocab = model.t2d[target_ids]
        train_mask = mask & in_vocab
        per_pos = -(_shift(target_p, k) * torch.log_softmax(logits, dim=-1)).sum(-1)
        n_train = int(train_mask.sum())
        step_loss = (per_pos * train_mask).sum() / max(n_train, 1)
        loss = loss + TTT_LOSS_DECAY**k * step_loss
        with torch.no_grad():
            agree = (draft_ids[logits.argmax(-1)] == target_ids) & mask
            if k == 0:
                stats.update(
                    loss_sum=float((per_pos * train_mask).sum()),
                    n_train=float(n_train),
                    n_mask=float(mask.sum()),
                    n_agree=float(agree.sum()),
                    n_agree_in_vocab=float((agree & in_vocab).sum()),
                )
            stats["step_loss"].append(float(step_loss))
            stats["step_agree"].append(float(agree.sum()))
            stats["step_mask"].append(float(mask.sum()))
    return loss, stats


def _losses(
    model: Eagle3Draft, batch: dict[str, torch.Tensor], head_draft: torch.Tensor, ttt_length: int = 1
) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss and counts for one collated batch. ``head_draft = lm_head[t2d]`` (``[draft_vocab, H]``)."""
    if ttt_length > 1:
        return _ttt_losses(model, batch, head_draft, ttt_length)
    logits = model(batch["aux"], batch["next_ids"])  # [B, L, Vd] float32
    in_vocab = model.t2d[batch["target_ids"]]
    mask = batch["mask"]
    train_mask = mask & in_vocab
    with torch.no_grad():
        target_p = torch.softmax(batch["target_hidden"].float() @ head_draft.T, dim=-1)
    logp = torch.log_softmax(logits, dim=-1)
    per_pos = -(target_p * logp).sum(-1)
    n_train = int(train_mask.sum())
    loss = (per_pos * train_mask).sum() / max(n_train, 1)
    with torch.no_grad():
        pred = model.draft_token_ids()[logits.argmax(-1)]
        agree = (pred == batch["target_ids"]) & mask
        stats = {
            "loss_sum": float((per_pos * train_mask).sum()),
            "n_train": float(n_train),
            "n_mask": float(mask.sum()),
            "n_agree": float(agree.sum()),
            "n_agree_in_vocab": float((agree & in_vocab).sum()),
        }
    return loss, stats


@torch.no_grad()
def evaluate(
    model: Eagle3Draft,
    dataset: Any,
    positions: Sequence[int],
    teacher: Teacher,
    head_draft: torch.Tensor,
    batch_size: int = 4,
    accept_steps: int = 0,
) -> dict[str, Any]:
    """Loss and top-1 agreement with the target over ``dataset``'s items at ``positions`` (an
    :class:`eagle_io.feed.ShardDataset`; see the module docstring for the definitions).

    Returns:
        ``loss`` (nats per in-vocab masked position), ``agreement`` (over all masked positions),
        ``agreement_in_vocab`` (over masked positions whose target token is in the draft vocabulary),
        ``positions`` (masked positions), ``in_vocab_share``; with ``accept_steps`` also ``accept_length``,
        ``accept_length_product_of_marginals`` and ``per_position_conditional`` at that many draft steps, and
        ``offline`` (:meth:`eagle_io.draft.acceptance.OfflineAccept.to_dict`).

    Raises:
        NonFiniteTrainingError: held-out states or the held-out loss hold NaN/Inf (never a metric computed from them).
    """
    model.eval()
    tot = {"loss_sum": 0.0, "n_train": 0.0, "n_mask": 0.0, "n_agree": 0.0, "n_agree_in_vocab": 0.0}
    for i in range(0, len(positions), batch_size):
        batch = make_batch(dataset, positions[i : i + batch_size])
        if not batch["positions"]:
            continue  # every sample of this chunk was a skipped corrupt record
        check_finite_batch(batch, "evaluation")
        _, st = _losses(model, teacher.add_target_ids(batch), head_draft)
        if not math.isfinite(st["loss_sum"]):
            raise NonFiniteTrainingError(
                f"evaluation: the held-out loss of sample id(s) {batch['sample_ids']} is not finite (the draft's "
                "weights diverged); no metric is reported"
            )
        for k in tot:
            tot[k] += st[k]
    out: dict[str, Any] = {
        "loss": tot["loss_sum"] / max(tot["n_train"], 1.0),
        "agreement": tot["n_agree"] / max(tot["n_mask"], 1.0),
        "agreement_in_vocab": tot["n_agree_in_vocab"] / max(tot["n_train"], 1.0),
        "positions": tot["n_mask"],
        "in_vocab_share": tot["n_train"] / max(tot["n_mask"], 1.0),
    }
    if accept_steps:
        off = offline_accept(
            model, dataset, positions, teacher.head_w, accept_steps, batch_size=batch_size, teacher=teacher
        )
        out.update(
            accept_length=off.accept_length,
            accept_length_product_of_marginals=off.accept_length_product_of_marginals,
            per_position_conditional=off.histogram.per_position_conditional,
            offline=off.to_dict(),
        )
    model.train()
    return out


def _accept_note(ev: dict[str, Any]) -> str:
    if ev.get("accept_length") is None:
        return ""
    steps = ev["offline"]["num_steps"]
    return (
        f", offline accept length {ev['accept_length']:.3f} at {steps} steps "
        f"(product of marginals {ev['accept_length_product_of_marginals']:.3f})"
    )


def build_draft(
    head: TargetHead, metadata: dict[str, Any], draft_vocab_size: int, intermediate_size: int | None = None
) -> Eagle3Draft:
    """A draft shaped like the target (hidden size, heads, RoPE) for the dataset's aux layout."""
    c = head.config
    if type(metadata.get("hidden_size")) is not int:  # was a KeyError traceback
        raise IncompatibleDatasetError(
            f"dataset metadata has no integer hidden_size ({metadata.get('hidden_size')!r}); the draft is sized by "
            "it (eagle-io generate and eagle_io.capture record it)"
        )
    hidden = metadata["hidden_size"]
    if hidden != c["hidden_size"]:
        raise IncompatibleDatasetError(
            f"dataset hidden_size {hidden} != target head hidden_size {c['hidden_size']} ({c.get('model_id')})"
        )
    if metadata.get("vocab_size") not in (None, c["vocab_size"]):
        raise IncompatibleDatasetError(
            f"dataset vocab_size {metadata['vocab_size']} != target head vocab_size {c['vocab_size']}"
        )
    k = len(metadata["aux_layer_ids"]) if metadata.get("aux_layer_ids") else int(metadata.get("num_aux_layers", 3))
    skip = fc_skip_problem(k, hidden, hidden)
    if skip:
        raise IncompatibleDatasetError(
            f"cannot build a draft SGLang would serve: the dataset's aux layers {metadata.get('aux_layer_ids')}: "
            f"{skip}; capture the training data on 2 or more aux layers (eagle-io generate --aux-layer-ids, "
            "default 3 layers)"
        )
    cfg = Eagle3DraftConfig(
        vocab_size=c["vocab_size"],
        draft_vocab_size=draft_vocab_size,
        hidden_size=hidden,
        target_hidden_size=hidden,
        num_aux_layers=k,
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"],
        head_dim=c["head_dim"],
        intermediate_size=intermediate_size or c["intermediate_size"],
        rms_norm_eps=c["rms_norm_eps"],
        rope_theta=c["rope_theta"],
        max_position_embeddings=c["max_position_embeddings"],
    )
    model = Eagle3Draft(cfg)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(head.embed)
        for name, p in model.named_parameters():
            if p.dim() == 2 and name != "embed_tokens.weight":
                p.normal_(0.0, 0.02)  # HF Llama initializer_range
    return model


def check_draft_memory(head: TargetHead, metadata: dict[str, Any], draft_vocab: int, intermediate: int | None) -> None:
    """The draft's training memory estimated before it is built (weights, gradients and AdamW's two moments in
    float32 for the trainable parameters; the frozen embedding once), refused with the figures when more than the
    memory available (``--intermediate-size 10**9`` allocated until the machine gave out).

    Raises:
        InvalidArgumentError: names the estimate, what it is made of and the memory available.
    """
    from ..host import available_memory, human_bytes

    h, vocab = int(head.config["hidden_size"]), int(head.config["vocab_size"])
    inter = int(intermediate or head.config["intermediate_size"])
    k = len(metadata.get("aux_layer_ids") or [0, 0, 0])
    # fc [H, kH]; q/k/v read 2H (at most H wide each); o [H, H]; MLP 3 x H x I; lm_head [draft vocab, H]; norms
    trainable = k * h * h + 3 * 2 * h * h + h * h + 3 * h * inter + draft_vocab * h + 4 * h
    need = 16 * trainable + 4 * vocab * h
    free = available_memory()
    if free is not None and need > free:
        raise InvalidArgumentError(
            f"the draft would need about {human_bytes(need)} to train ({trainable:,} trainable parameters: hidden {h}, "
            f"intermediate size {inter}, draft vocab {draft_vocab}; weights, gradients and AdamW moments in float32), "
            f"more than the {human_bytes(free)} of memory available: lower --intermediate-size or --draft-vocab-size"
        )


def split_positions(n: int, eval_fraction: float, eval_samples: int | None, seed: int) -> tuple[list[int], list[int]]:
    """Deterministic held-out split: a seeded shuffle of ``range(n)``; the first ``eval_samples`` (default
    ``max(1, round(n * eval_fraction))``) positions are held out, sorted."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = eval_samples if eval_samples is not None else max(1, round(n * eval_fraction))
    if not 0 < k < n:
        raise InvalidArgumentError(f"cannot hold out {k} of {n} samples (need at least one on each side)")
    return sorted(order[k:]), sorted(order[:k])


def train_draft(
    dataset: Any,
    head: TargetHead,
    mapping: Any,
    config: TrainConfig | None = None,
    *,
    init: Eagle3Draft | None = None,
    log: Callable[[str], None] | None = print,
) -> TrainResult:
    """Trains a draft on ``dataset`` and measures it on held-out samples before and after.

    Args:
        dataset: a path (or list of paths) or an :class:`eagle_io.feed.ShardDataset` (EAGLE-3 schema; metadata
            ``hidden_size``, ``aux_layer_ids``); paths are opened with ``max_length=config.seq_length``. A
            ``ShardDataset(..., on_corrupt="skip")`` trains past bad records; ``skipped_records`` counts them
            (distinct sample ids) and ``empty_steps`` the steps whose every sample was one (no update). Samples
            that ``max_length`` truncates to no supervised token are left out of their batches and counted
            (``unsupervised_samples``).
        head: the target's frozen head (:func:`load_target_head` / :meth:`TargetHead.from_model`).
        mapping: :class:`eagle_io.interop.vocab.VocabMapping` whose ``target_vocab_size`` is the head's vocabulary.
        config: :class:`TrainConfig`.
        init: a draft to continue training from (trained in place; its weights are the step-0 weights, so
            ``initial`` measures it) instead of a freshly initialised one: :func:`eagle_io.spec.init_from.
            load_init_draft` loads and checks an exported one. Its draft vocabulary must be ``mapping``'s.
        log: progress lines (None for silence).

    Returns:
        :class:`TrainResult` with ``initial`` / ``final`` held-out metrics (:func:`evaluate`) and the loss history.

    Raises:
        IncompatibleDatasetError: hidden or vocabulary sizes of dataset, head and mapping disagree, or no training
            sample, or no held-out sample, keeps a supervised token within ``max_length``
            (:meth:`ShardDataset.require_supervision`).
        NonFiniteTrainingError: a batch's states hold NaN/Inf, or the loss becomes NaN/Inf: training stops (no
            metric is computed from NaN, nothing is returned to export).
    """
    from ..feed import ShardDataset

    cfg = config or TrainConfig()  # its settings were checked when it was made (TrainConfig.__post_init__)
    say = log or (lambda _m: None)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    ds = dataset if isinstance(dataset, ShardDataset) else ShardDataset(dataset, max_length=cfg.seq_length)
    if mapping.target_vocab_size != head.config["vocab_size"]:
        raise IncompatibleDatasetError(
            f"vocab mapping target_vocab_size {mapping.target_vocab_size} != target vocab {head.config['vocab_size']}"
        )
    check_draft_memory(head, ds.metadata, mapping.draft_vocab_size, cfg.intermediate_size)
    if init is None:
        model = build_draft(head, ds.metadata, mapping.draft_vocab_size, cfg.intermediate_size)
    elif init.config.draft_vocab_size != mapping.draft_vocab_size:
        raise IncompatibleDatasetError(
            f"the init draft's draft vocabulary has {init.config.draft_vocab_size} entries, the mapping "
            f"{mapping.draft_vocab_size}: continue on the draft's own map (eagle_io.spec.init_from.load_init_draft)"
        )
    else:
        model = init
    model.set_vocab_mapping(mapping.d2t, mapping.t2d)
    head_w = head.lm_head.float()
    head_draft = head_w[mapping.t2d].contiguous()  # rows in ascending target id = draft id order

    train_pos, eval_pos = split_positions(len(ds), cfg.eval_fraction, cfg.eval_samples, cfg.seed)
    ds.require_supervision(train_pos, option="max_length (train-draft --max-length)")
    try:  # held-out metrics over no position were 0s, and train-draft's profile a TypeError after training
        ds.require_supervision(eval_pos, option="max_length (train-draft --max-length)")
    except IncompatibleDatasetError as e:
        raise IncompatibleDatasetError(
            f"the {len(eval_pos)} held-out samples (eval_samples, train-draft --eval-samples) measure nothing: {e}"
        ) from e
    t0 = time.perf_counter()
    teacher = Teacher(head_w)
    say(f"data      {len(train_pos)} train + {len(eval_pos)} held-out samples, draft vocab {mapping.draft_vocab_size}")

    initial = evaluate(model, ds, eval_pos, teacher, head_draft, cfg.batch_size, cfg.accept_steps)
    say(f"initial   held-out loss {initial['loss']:.3f}, agreement {initial['agreement']:.4f}{_accept_note(initial)}")
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    rng = random.Random(cfg.seed + 1)
    order: list[int] = []
    history: list[dict[str, float]] = []
    tokens = empty_steps = 0
    t_train = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        if len(order) < cfg.batch_size:
            more = list(train_pos)
            rng.shuffle(more)
            order += more
        picked, order = order[: cfg.batch_size], order[cfg.batch_size :]
        batch = make_batch(ds, picked)
        if not batch["positions"]:
            empty_steps += 1  # every sample was a skipped corrupt or unsupervised one: no update
            continue
        check_finite_batch(batch, f"step {step + 1}")
        batch = teacher.add_target_ids(batch)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, st = _losses(model, batch, head_draft, cfg.ttt_length)
        if not math.isfinite(loss.item()):
            raise NonFiniteTrainingError(
                f"step {step + 1}: the training loss is {loss.item()} on sample id(s) {batch['sample_ids']} (the "
                f"draft diverged: lower --lr, now {cfg.lr}); training stopped, nothing exported"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
        opt.step()
        tokens += int(st["n_mask"])
        rec = {"step": step + 1, "loss": loss.item(), "train_agreement": st["n_agree"] / max(st["n_mask"], 1.0)}
        if "step_agree" in st:  # TTT: every unroll step's loss and agreement
            rec["ttt_step_loss"] = st["step_loss"]
            rec["ttt_step_agreement"] = [
                a / max(m, 1.0) for a, m in zip(st["step_agree"], st["step_mask"], strict=True)
            ]
        if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            ev = evaluate(model, ds, eval_pos, teacher, head_draft, cfg.batch_size, cfg.accept_steps)
            rec.update({"eval_loss": ev["loss"], "eval_agreement": ev["agreement"]})
            if ev.get("accept_length") is not None:
                rec["eval_accept_length"] = ev["accept_length"]
            say(
                f"eval      step {step + 1}: held-out loss {ev['loss']:.3f}, agreement {ev['agreement']:.4f}"
                f"{_accept_note(ev)}"
            )
        history.append(rec)
        if cfg.log_every and ((step + 1) % cfg.log_every == 0 or step == 0):
            el = time.perf_counter() - t_train
            say(
                f"step {step + 1:5d}  loss {rec['loss']:.3f}  agree {rec['train_agreement']:.3f}  "
                f"lr {lr_at(step):.2e}  {el / (step + 1):.2f} s/step"
            )
    final = evaluate(model, ds, eval_pos, teacher, head_draft, cfg.batch_size, cfg.accept_steps)
    seconds = time.perf_counter() - t0
    say(
        f"final     held-out loss {final['loss']:.3f}, agreement {final['agreement']:.4f}{_accept_note(final)} "
        f"({seconds:.0f} s)"
    )
    return TrainResult(
        model=model,
        initial=initial,
        final=final,
        history=history,
        train_samples=len(train_pos),
        eval_samples=len(eval_pos),
        steps=cfg.steps,
        train_tokens=tokens,
        seconds=seconds,
        teacher_seconds=teacher.seconds,
        skipped_records=len({s.sample_id for s in ds.skipped}),
        empty_steps=empty_steps,
        unsupervised_samples=len({s.sample_id for s in ds.unsupervised}),
        train_sample_ids=sorted(ds.entry(p).sample_id for p in train_pos),
        eval_sample_ids=sorted(ds.entry(p).sample_id for p in eval_pos),
        ttt_length=cfg.ttt_length,
    )


def write_summary(path: str | os.PathLike[str], result: TrainResult, extra: dict[str, Any] | None = None) -> None:
    """Writes :meth:`TrainResult.summary` (plus ``extra``) as JSON."""
    with open(path, "w") as f:
        json.dump({**result.summary(), **(extra or {})}, f, indent=2)
