"""Train the reference EAGLE-3 draft on shards (CPU) and export it for SGLang (safetensors + config.json), with its
held-out offline accept length (speculation_profile.json) and the sample ids it trained on (training_samples.json).
``--init-from DRAFT`` continues from a draft train-draft exported (:mod:`eagle_io.spec.init_from`)."""

from __future__ import annotations

import argparse
import json
import os

from ..errors import IncompatibleDatasetError, InvalidArgumentError
from .io_paths import check_input, check_output

DEFAULT_DRAFT_VOCAB = 4096


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="eagle-io dataset from `eagle-io generate` (EAGLE-3 schema)")
    p.add_argument("--out", required=True, help="output directory: model.safetensors, config.json, train_summary.json")
    p.add_argument("--target-model", help="HF directory or .gguf of the target (default: embedded SmolLM2)")
    p.add_argument(
        "--allow-other-target",
        action="store_true",
        help="accept a --target-model whose files' sha256 (or name) differ from those the dataset records (the same "
        "weights re-saved); its architecture, layers, width and vocabulary must still match",
    )
    p.add_argument("--vocab-map", help="mapping from `eagle-io vocab-map` (checked against this dataset)")
    p.add_argument(
        "--keep-vocab-map",
        metavar="DRAFT",
        help="train on the vocab map of this exported draft (its d2t/t2d), e.g. the served one a `swap-draft` will "
        "replace: SGLang fixes the map at server start",
    )
    p.add_argument(
        "--init-from",
        metavar="DRAFT",
        help="continue training from this exported draft (train-draft --out DIR): its weights, its vocab map (d2t/t2d "
        "value for value: the result can be swapped into a server serving DRAFT), architecture and widths are kept; "
        "optimizer and learning-rate schedule start fresh. Refused, each difference named: a draft for another target "
        "(--allow-other-target as for eval-draft), other aux layer ids, vocabulary or hidden size than the dataset's, "
        "the check-serving errors eval-draft refuses, and --vocab-map / --keep-vocab-map / an --intermediate-size or "
        "--draft-vocab-size other than the draft's",
    )
    p.add_argument(
        "--draft-vocab-size",
        type=int,
        help="when no --vocab-map: build one of this size (default 4096); with --vocab-map it must equal the map's",
    )
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (one batch each)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per step")
    p.add_argument(
        "--max-length", dest="seq_length", type=int, default=512, help="truncate samples to this many tokens"
    )
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    p.add_argument("--warmup-steps", type=int, default=20, help="steps of linear learning-rate warmup")
    p.add_argument("--eval-samples", type=int, help="held-out samples (default 10%% of the dataset)")
    p.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (0: only at the end)")
    p.add_argument("--intermediate-size", type=int, help="draft MLP width (default: the target's)")
    p.add_argument(
        "--ttt-length",
        type=int,
        default=1,
        help="test-time-training unroll steps (SpecForge --ttt-length; its loss weights 0.8**k)",
    )
    p.add_argument(
        "--accept-steps",
        type=int,
        default=3,
        help="draft steps of the held-out offline accept length logged and written to speculation_profile.json",
    )
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the draft's initial weights, the split and the batch order"
    )
    p.add_argument(
        "--on-corrupt",
        default="raise",
        choices=["raise", "skip"],
        help="bad records: fail (default), or leave them out of the vocabulary counts and batches and count them",
    )


def run(args: argparse.Namespace) -> int:
    from ..draft import TrainConfig, load_target_head, save_draft, train_draft
    from ..draft.export import eagle_config_ids
    from ..draft.train import check_draft_memory
    from ..feed import ShardDataset
    from ..interop.speculation_profile import PROFILE_NAME, TRAINING_SAMPLES_NAME, build_profile, write_json
    from ..interop.vocab import build_vocab_mapping, dataset_fingerprint, draft_vocab_mapping, load_vocab_mapping
    from ..store.eagle3 import check_eagle3_dataset, require_samples
    from ..store.reader import Dataset
    from ..store.target_identity import dataset_target, require_same_target

    # Every option is checked before anything is read or written (--ttt-length 0 left a vocab_map in --out).
    check_output("--out", args.out, directory=True, makes_parents=True)
    check_input("--vocab-map", args.vocab_map, "a vocab map (eagle-io vocab-map --out FILE)")
    kept = None if args.keep_vocab_map is None else os.path.join(args.keep_vocab_map, "config.json")
    check_input("--keep-vocab-map", kept, "an exported draft directory (eagle-io train-draft --out DIR)")
    init = None if args.init_from is None else os.path.join(args.init_from, "config.json")
    check_input("--init-from", init, "an exported draft directory (eagle-io train-draft --out DIR)")
    if args.vocab_map and args.keep_vocab_map:
        raise InvalidArgumentError("--vocab-map and --keep-vocab-map each name the map to train on: pick one")
    if args.init_from and (args.vocab_map or args.keep_vocab_map):
        given = "--vocab-map" if args.vocab_map else "--keep-vocab-map"
        raise InvalidArgumentError(f"--init-from keeps the draft's own vocab map: drop {given}")
    cfg = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_length=args.seq_length,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        eval_samples=args.eval_samples,
        eval_every=args.eval_every,
        seed=args.seed,
        threads=args.threads,
        intermediate_size=args.intermediate_size,
        ttt_length=args.ttt_length,
        accept_steps=args.accept_steps,
    )
    if args.draft_vocab_size is not None and args.draft_vocab_size < 1:
        raise InvalidArgumentError(f"--draft-vocab-size {args.draft_vocab_size}: must be >= 1")
    ds = Dataset(args.path)
    check_eagle3_dataset(ds, "train-draft")
    meta = ds.metadata
    aux_ids = meta.get("aux_layer_ids")
    # Refused before the target is loaded and the draft trained (the eagle_config write needs the ids).
    if not aux_ids:
        raise IncompatibleDatasetError(
            f"{args.path}: the dataset metadata has no aux_layer_ids: cannot write eagle_config for SGLang"
        )
    # The target the data came from: its architecture picks SGLang's setter rule for the eagle_config ids.
    tm = meta.get("target_model") if isinstance(meta.get("target_model"), dict) else {}
    target = {k: tm[k] for k in ("model_id", "architecture") if tm.get(k)}
    target |= {k: meta[k] for k in ("num_layers", "hidden_size") if isinstance(meta.get(k), int)}
    eagle_config_ids(aux_ids, target)  # refuse ids SGLang cannot capture on this target before training
    # One held out, one to train on, before the vocabulary map is built and written.
    held = "1 held out" if args.eval_samples is None else f"--eval-samples {args.eval_samples} held out"
    require_samples(
        ds, f"train-draft ({held}, at least 1 to train on)", 2 if args.eval_samples is None else args.eval_samples + 1
    )
    head = load_target_head(args.target_model)
    if head.identity is not None:  # the dataset's target, every fact it records (the hidden size alone let through
        # an 8-layer target of the same width, its head and embedding then trained against a 10-layer one's states)
        require_same_target(
            dataset_target(meta),
            head.identity,
            where=ds.manifest_path,
            option="--target-model",
            allow_other_target=args.allow_other_target,
        )
    # The draft's training memory, estimated before the vocabulary map is written or the draft built.
    check_draft_memory(head, meta, args.draft_vocab_size or DEFAULT_DRAFT_VOCAB, args.intermediate_size)
    vocab = head.config["vocab_size"]
    init_model = None
    if args.init_from:  # eval-draft's checks of a draft against a target and dataset, before anything is written
        from ..spec.init_from import load_init_draft

        init_model, mapping = load_init_draft(
            args.init_from,
            head,
            meta,
            dataset=args.path,
            allow_other_target=args.allow_other_target,
            intermediate_size=args.intermediate_size,
            draft_vocab_size=args.draft_vocab_size,
        )
    elif args.vocab_map or args.keep_vocab_map:
        if args.vocab_map:
            mapping = load_vocab_mapping(args.vocab_map, dataset=args.path, target_vocab_size=vocab)
        else:
            mapping = draft_vocab_mapping(args.keep_vocab_map, target_vocab_size=vocab)
        if args.draft_vocab_size is not None and args.draft_vocab_size != mapping.draft_vocab_size:
            given = f"--vocab-map {args.vocab_map}" if args.vocab_map else f"--keep-vocab-map {args.keep_vocab_map}"
            raise InvalidArgumentError(
                f"{given} has {mapping.draft_vocab_size} entries but --draft-vocab-size "
                f"{args.draft_vocab_size} was asked for: drop one, or build a map of that size (`eagle-io vocab-map`)"
            )
    else:
        size = args.draft_vocab_size if args.draft_vocab_size is not None else DEFAULT_DRAFT_VOCAB
        mapping = build_vocab_mapping(args.path, size, target_vocab_size=vocab, on_corrupt=args.on_corrupt)
        os.makedirs(args.out, exist_ok=True)
        mapping.save(os.path.join(args.out, "vocab_map.safetensors"))
    print(
        f"vocab     draft {mapping.draft_vocab_size} of {vocab} target ids, "
        f"coverage {mapping.key.get('coverage', float('nan')):.4f}, padded {mapping.key.get('padded')}"
    )
    data = ShardDataset(args.path, max_length=cfg.seq_length, on_corrupt=args.on_corrupt)
    result = train_draft(data, head, mapping, cfg, init=init_model)
    fingerprint = dataset_fingerprint(args.path)
    provenance = {
        "dataset_sha256": fingerprint,
        "target_model": head.config.get("model_id"),
        "vocab_map": dict(mapping.key),
        "ttt_length": args.ttt_length,
        "training_samples": TRAINING_SAMPLES_NAME,
    }
    if args.init_from:
        provenance["init_from"] = os.path.abspath(args.init_from)
    paths = save_draft(
        result.model,
        args.out,
        aux_ids,
        bos_token_id=head.config.get("bos_token_id"),
        eos_token_id=head.config.get("eos_token_id"),
        provenance=provenance,
        target=target,
    )
    source = meta.get("source_dataset")
    paths["training_samples"] = write_json(
        os.path.join(args.out, TRAINING_SAMPLES_NAME),
        {
            "dataset_sha256": fingerprint,
            "source_dataset": source,
            "train_sample_ids": result.train_sample_ids,
            "held_out_sample_ids": result.eval_sample_ids,
        },
    )
    off = result.final.get("offline")
    if off is not None:
        n = len(result.eval_sample_ids)
        data = {"dataset_sha256": fingerprint, "source_dataset": source, "samples": n, "held_out": "recorded"}
        profile = build_profile(
            num_steps=args.accept_steps, live=None, offline=off, data=data, target={"model_id": head.config["model_id"]}
        )
        paths["speculation_profile"] = write_json(os.path.join(args.out, PROFILE_NAME), profile)
    summary = {**result.summary(), **paths, "history": result.history}
    with open(os.path.join(args.out, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(result.summary(), indent=2))
    return 0
