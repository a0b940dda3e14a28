"""Capture the traffic running SGLang servers serve (an EAGLE-3 draft under EAGLE3, or capture-only mode): start
a live capture, read its status, stop it (docs/SERVING.md, "Live capture of served traffic")."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .. import defaults
from ..capturing.options import CaptureOptions
from ..capturing.sglang.client import ServerCapture, capture_status, join_live_capture, stop_server_capture
from ..capturing.sglang.live import LivePolicy
from .server_keys import add_key_args


def add_parser(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, help="start, join, status or stop")
    fmt = p.formatter_class
    start = sub.add_parser("start", formatter_class=fmt,
                           help="start a live capture on each server, then return (it runs until stopped)")  # fmt: skip
    start.add_argument("urls", nargs="+", metavar="URL",
                       help="each server's base URL (http://host:port), or SGLang's gateway's (SMG, with "
                            "--enable-rl)")  # fmt: skip
    start.add_argument("--out", required=True, help="the dataset: a directory every server can write, or s3://...")
    start.add_argument("--rate", type=float, default=0.0,
                       help="fraction of requests sampled by a hash of their request id; 0: only requests with "
                            "custom_params {\"eagle_io_capture\": true}")  # fmt: skip
    start.add_argument("--max-samples-per-s", type=float, help="cap on sampled requests per second")
    start.add_argument("--max-tokens-per-s", type=float, help="cap on prompt tokens of sampled requests per second")
    start.add_argument("--max-bytes-per-hour", type=float, help="cap on bytes of states stored per hour")
    start.add_argument("--max-inflight", type=int, default=defaults.LIVE_MAX_INFLIGHT,
                       help="sampled requests not finished yet (each holds its rows in device memory)")  # fmt: skip
    start.add_argument("--max-length", type=int, help="longest sample in tokens; longer ones are counted, not stored")
    start.add_argument("--precision", choices=["bf16", "fp8"], help="stored precision (default bf16)")
    start.add_argument("--ring-bytes", type=int, default=defaults.RING_BYTES,
                       help="each writing scheduler's host ring; a sample finding it full is dropped")  # fmt: skip
    start.add_argument("--resume", action="store_true",
                       help="continue the live capture this machine started into --out (the same options; another "
                            "capture's dataset is refused)")  # fmt: skip
    add_key_args(start)
    join = sub.add_parser("join", formatter_class=fmt,
                          help="start the live capture this machine started through a gateway on the workers that "
                               "joined the gateway since (the same dataset, options and policy; the next writer "
                               "ranks); run it after adding a worker")  # fmt: skip
    join.add_argument("urls", nargs="+", metavar="URL", help="the gateway's (or a server's) base URL")
    add_key_args(join)
    status = sub.add_parser("status", formatter_class=fmt, help="print each DP rank's capture status as JSON")
    status.add_argument("urls", nargs="+", metavar="URL", help="each server's (or gateway's) base URL")
    add_key_args(status)
    stop = sub.add_parser("stop", formatter_class=fmt,
                          help="stop the capture on each server: drain, commit, mark it complete (a capture this "
                               "machine did not start: a forced stop, with the server's --admin-api-key, left "
                               "incomplete)")  # fmt: skip
    stop.add_argument("urls", nargs="+", metavar="URL", help="each server's (or gateway's) base URL")
    add_key_args(stop)


def run(args: argparse.Namespace) -> int:
    keys = {"api_key": args.api_key, "admin_api_key": args.admin_api_key}
    if args.action == "status":
        print(json.dumps([st for u in args.urls for st in capture_status(u, **keys)], indent=2))
        return 0
    if args.action == "join":
        joined = []
        for u in args.urls:
            cap = join_live_capture(u, **keys)
            joined.append({"url": u, "out": cap.url, "joined": [s.url for s in cap.joined], "writers": cap.writers,
                           "capture": cap.capture_id})  # fmt: skip
        print(json.dumps(joined, indent=2))
        return 0
    if args.action == "stop":
        out: list[dict[str, Any]] = []
        for u in args.urls:
            out += [{"url": u, **st} for st in stop_server_capture(u, complete=True, **keys)]
        print(json.dumps(out, indent=2, default=str))
        for out_dir, manifest in _merge_where_reachable(out).items():
            print(f"eagle-io: merged the writers of {out_dir} into {manifest}", file=sys.stderr)
        return 0
    policy = LivePolicy(
        sample_rate=args.rate,
        max_samples_per_s=args.max_samples_per_s,
        max_tokens_per_s=args.max_tokens_per_s,
        max_bytes_per_hour=args.max_bytes_per_hour,
        max_inflight=args.max_inflight,
    )
    options = CaptureOptions(max_length=args.max_length, precision=args.precision, ring_bytes=args.ring_bytes,
                             writer_options={"resume": True} if args.resume else {})  # fmt: skip
    cap = ServerCapture(args.urls, os.fspath(args.out), options, live=policy, **keys)  # started; left running
    print(json.dumps({"out": cap.url, "servers": [s.url for s in cap.servers], "writers": cap.writers,
                      "capture": cap.capture_id, "live": policy.to_dict()}))  # fmt: skip
    return 0


def _merge_where_reachable(statuses: list[dict[str, Any]]) -> dict[str, str]:
    """Merges the rank manifests of each dataset the stopped writers wrote into one ``manifest.json`` (several writers:
    several DP ranks, servers, or a gateway's workers), where this machine reaches it (a local directory, or
    ``s3://``); ``{out_dir: merged manifest}``. A dataset it cannot reach is left to ``eagle-io merge`` there."""
    from ..store import layout
    from ..store.merge import merge_ranks

    stopped = {st["out_dir"] for st in statuses if st.get("state") == "stopped" and st.get("out_dir")}
    merged = {}
    for out_dir in sorted(stopped):  # several writers (or one behind a gateway) wrote rank manifests
        if layout.is_url(out_dir) or layout.rank_manifests(out_dir):
            report = merge_ranks(out_dir)
            if report.manifest:
                merged[out_dir] = report.manifest
    return merged
