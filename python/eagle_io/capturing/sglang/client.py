"""Capturing from running SGLang servers over HTTP only: :class:`ServerCapture`, what
``eagle_io.capture("http://host:30000", out_dir)`` returns and ``eagle-io generate --server URL`` drives.

The server is one users launch themselves, with SGLang's own flags for aux capture and every other setting at its
default (chunked prefill and the radix cache on)::

    python -m sglang.launch_server --model-path M --enable-return-aux-hidden-states --speculative-algorithm EAGLE3

with eagle-io installed in its environment (the plugin, :mod:`eagle_io.serving.plugin`, loads in every scheduler).
Nothing is shared between client and server but HTTP (:mod:`.protocol`): the preflight reads ``GET /server_info``
(the resolved launch settings, and each DP rank's eagle-io status with the target's facts) and ``GET /model_info``;
start and stop go through ``POST /set_internal_state``, which SGLang fans out to every DP rank; samples are
``POST /generate`` requests carrying eagle-io's ``custom_params`` (each scheduler computes a sample's whole prompt,
or, storing shared prefixes once, serves it from its radix cache up to a prefix record it stored:
:class:`~eagle_io.capturing.sglang.capture.SchedulerCapture`; with ``dedup_prefixes=False`` each request carries a
unique ``extra_key``, a radix-cache namespace of its own), with
``routed_dp_rank`` fixed by the sample id (a resumed capture sends each sample to the rank that holds its
manifest). Several servers are several groups of shard writers, numbered one after the other, writing into the one
``out_dir`` (a path each server can write, or an ``s3://`` prefix); ``close`` merges their manifests where the client
can reach them. A URL may also be SGLang's gateway (SMG, ``--enable-rl``): each worker it lists is then one such
server, its routes reached through the gateway's control plane (:mod:`eagle_io.sglang.gateway`), while the sample
requests go to the gateway's ``/generate`` (no ``routed_dp_rank``: the gateway picks the worker).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ... import defaults
from ...errors import CaptureStopTimeoutError, InvalidArgumentError, SGLangError, StorageError
from ...host import cache_dir
from ...sglang.gateway import Route, routes
from ...sglang.servers import ServerKeys, http_json, server_url
from ...store import layout
from ...store.manifest import read_manifest
from ...store.upload import combine_upload_reports
from ..options import CaptureOptions
from ..store import check_sample
from .live import LivePolicy
from .protocol import (
    CLIENT_TARGET_INFO,
    ENV_CAPTURE_SECRET,
    STATUS_KEY,
    capture_id,
    control_args,
    new_secret,
    sample_params,
)

__all__ = [
    "ServerCapture",
    "ServerFacts",
    "capture_status",
    "committed_ids",
    "join_live_capture",
    "preflight",
    "server_facts",
    "stop_server_capture",
    "writer_world",
]

logger = logging.getLogger("eagle_io.capture")

_RETRYABLE = {429, 500, 502, 503, 504}
# Through a gateway a retry may reach another worker than the failed attempt, which may have stored the sample: only
# the gateway's own "not taken" answers (rate limited, no worker available) are retried there.
_RETRYABLE_VIA_GATEWAY = {429, 503}


def committed_ids(out_dir: str | os.PathLike[str]) -> set[int]:
    """Sample ids the manifests of a capture into ``out_dir`` list: its rank manifests (``manifest.rNNNNN.json``,
    whichever writers wrote them: workers behind a gateway come and go), else its ``manifest.json``. For an
    object-storage ``out_dir`` (``s3://...``): those its remote manifests list. Shards committed in the staging but
    not uploaded yet are left out; the schedulers' writers know them and skip their samples, counted as
    ``already_done``.

    Raises:
        ObjectStorageError: a request failed.
        CorruptRecordError, StorageError: a manifest, or a shard it lists, cannot be read (as
            :class:`eagle_io.Dataset` raises).
    """
    from ... import _native
    from ...store.reader import Dataset

    root = os.fspath(out_dir).rstrip("/")
    if layout.is_url(root):
        names = [u[len(root) + 1 :] for u, _ in _native.list_objects(root, [])]
    else:
        names = os.listdir(root) if os.path.isdir(root) else []
    ranks = sorted(n for n in names if layout.RANK_MANIFEST.match(n))
    ids: set[int] = set()
    for name in ranks or [n for n in names if n == layout.MANIFEST]:
        ds = Dataset(f"{root}/{name}", threads=1)
        ids.update(ds.entry(p).sample_id for p in range(len(ds)))
    return ids


def writer_world(servers: Sequence[ServerFacts]) -> int:
    """The ``world_size`` the shard writers of a capture through ``servers`` name their manifests by
    (:func:`eagle_io.store.layout.manifest_name`): their count, and at least 2 when one is reached through a gateway,
    whose workers come and go: such a capture always writes rank manifests, so a worker joining it later (or a
    resume by fewer workers) never meets a ``manifest.json`` of one writer."""
    writers = sum(s.writers for s in servers)
    return max(writers, 2) if any(s.route.via_gateway for s in servers) else writers


@dataclass(frozen=True)
class ServerFacts:
    """What the preflight read from one server (or one worker behind SGLang's gateway).

    Attributes:
        route: how it is reached (:class:`eagle_io.sglang.gateway.Route`): directly, or through a gateway.
        model_path: ``/model_info``'s ``model_path`` (what the server was launched with).
        tokenizer_path: ``/model_info``'s ``tokenizer_path``.
        target: the target's facts as the scheduler sees them (:func:`eagle_io.sglang.probe.capture_target`:
            ``architecture``, ``num_layers``, ``hidden_size``, ``vocab_size``, ``layers`` (eagle-io ids), ``writers``).
        ranks: the DP ranks' eagle-io statuses (``internal_states[i]["eagle_io_capture"]``), in SGLang's order.
    """

    route: Route
    model_path: str
    tokenizer_path: str | None
    target: Mapping[str, Any]
    ranks: tuple[Mapping[str, Any], ...]

    @property
    def url(self) -> str:
        """What names it: the server's base URL, or ``"GATEWAY worker ID (URL)"`` (:attr:`Route.name`)."""
        return self.route.name

    @property
    def writers(self) -> int:
        return int(self.target["writers"])

    @property
    def target_info(self) -> dict[str, Any]:
        t = self.target
        info = {k: t[k] for k in ("num_layers", "hidden_size", "vocab_size", "architecture")}
        return {**info, "model_id": os.path.basename(self.model_path.rstrip("/")) or self.model_path}


def preflight(url: str, *, model: str | None = None, aux_layer_ids: Sequence[int] | None = None,
              keys: ServerKeys | None = None,
              timeout_s: float = defaults.SERVER_REQUEST_TIMEOUT_S) -> list[ServerFacts]:  # fmt: skip
    """:func:`server_facts` of every worker behind ``url``: the server itself, or each worker SGLang's gateway lists
    (:func:`eagle_io.sglang.gateway.routes`).

    Raises:
        what :func:`~eagle_io.sglang.gateway.routes` and :func:`server_facts` raise.
    """
    found = routes(url, keys=keys, timeout_s=timeout_s)
    return [server_facts(r, model=model, aux_layer_ids=aux_layer_ids, keys=keys, timeout_s=timeout_s) for r in found]


def server_facts(url: str | Route, *, model: str | None = None, aux_layer_ids: Sequence[int] | None = None,
                 keys: ServerKeys | None = None,
                 timeout_s: float = defaults.SERVER_REQUEST_TIMEOUT_S) -> ServerFacts:  # fmt: skip
    """The preflight of one server (a URL, reached directly) or one worker behind a gateway (its :class:`Route`):
    reads ``/server_info`` and ``/model_info`` (with ``keys``) and refuses, naming the URL, what this capture cannot
    use.

    Raises:
        SGLangError: the server does not answer, or refuses the key (naming the option to pass).
        InvalidArgumentError: the server does not run eagle-io's plugin; its target captures no aux states (launched
            without ``--speculative-algorithm EAGLE3``: with no draft that also needs
            ``--enable-return-aux-hidden-states``; ``EAGLE`` / ``NEXTN`` named as the wrong flag); was launched with
            pipeline parallelism or with Ray (its schedulers never load plugins); serves another model than
            ``model``; captures other layers than ``aux_layer_ids``.
    """
    route = url if isinstance(url, Route) else Route.direct(url)
    url = route.name
    # a busy server answers /server_info after the forwards queued before it (its own warm-up request included)
    info = route.call("server_info", timeout_s=timeout_s, keys=keys)
    model_info = route.call("model_info", timeout_s=timeout_s, keys=keys)
    problems = []
    if info.get("pp_size", 1) not in (None, 1):
        problems.append(f"pipeline parallelism (pp_size {info['pp_size']}): only the last stage sees the states")
    if info.get("use_ray"):
        problems.append("Ray (--use-ray): SGLang's Ray scheduler actors never load plugins, so nothing captures")
    states = info.get("internal_states") or []
    ranks = tuple(s.get(STATUS_KEY) for s in states if isinstance(s, dict))
    if not ranks or any(r is None for r in ranks):
        problems.append(
            "it does not run eagle-io's SGLang plugin (install eagle-io in the server's environment; SGLANG_PLUGINS, "
            "when set, must name eagle_io; EAGLE_IO_SGLANG_PLUGIN and EAGLE_IO_SGLANG_CAPTURE must not be 0)"
        )
    if problems:
        raise InvalidArgumentError(f"cannot capture from {url}: " + "; ".join(problems))
    target = ranks[0]["target"]
    if "error" in target:
        raise InvalidArgumentError(f"cannot capture from {url}: its scheduler cannot read the target: {target['error']}"
                                   )  # fmt: skip
    algo = target.get("speculative_algorithm")
    if algo not in (None, "EAGLE3") or not target.get("capture_enabled") or not target.get("layers"):
        wrong = f"it runs --speculative-algorithm {algo}, whose target captures no aux hidden states; " if algo else ""
        raise InvalidArgumentError(
            f"cannot capture from {url}: {wrong}launch it with --speculative-algorithm EAGLE3 (serving an EAGLE-3 "
            "draft, or SGLang's capture-only mode: --enable-return-aux-hidden-states and no draft)"
        )
    model_path = str(model_info.get("model_path") or info.get("model_path") or "")
    if model is not None and os.path.normpath(model) != os.path.normpath(model_path):
        raise InvalidArgumentError(f"{url} serves {model_path}, not the model asked for ({model})")
    if aux_layer_ids is not None and list(aux_layer_ids) != list(target["layers"]):
        raise InvalidArgumentError(
            f"{url} captures aux layers {target['layers']} (eagle-io ids: input of layer i), not "
            f"{list(aux_layer_ids)}; "
            "launch it with --return-aux-hidden-state-layer-ids in SGLang's convention (eagle-io check-serving "
            "prints them)"
        )
    return ServerFacts(route, model_path, model_info.get("tokenizer_path"), target, ranks)


def _same_target(first: ServerFacts, other: ServerFacts) -> None:
    """Raises InvalidArgumentError unless ``other`` serves ``first``'s target with the same aux layers."""
    if dict(other.target_info) != dict(first.target_info) or other.target["layers"] != first.target["layers"]:
        raise InvalidArgumentError(
            f"{other.url} serves {other.target_info} (layers {other.target['layers']}), {first.url} serves "
            f"{first.target_info} (layers {first.target['layers']}): one capture needs one target"
        )


class ServerCapture:
    """A capture through running SGLang servers (a :class:`eagle_io.capturing.session.Capture`).

    Args:
        urls: one server's base URL or several (each its own group of shard writers), or SGLang's gateway (SMG,
            launched with ``--enable-rl``: each worker it lists is one such group, reached through its control
            plane, while sample requests go to its ``/generate`` like its users' traffic), or their
            :func:`preflight` (already made).
        out_dir: the dataset: a directory every server can write (the same path on each), or ``s3://bucket/run``.
        options: the capture's options; ``target_info`` and ``aux_layer_ids`` default to the servers' (which must
            agree); ``writer_options`` ``rank`` / ``world_size`` are refused (the servers' layout numbers them).
        sampling_params: SGLang sampling parameters of every sample request. The default,
            ``{"max_new_tokens": 1}``, stores the prompt only; with ``max_new_tokens`` above 1 a sample is the prompt
            plus the answer the server generates (its decode forwards' states; the last generated token is not
            stored, its state is never computed; the loss mask is 1 over the generated tokens).
        model: refuse servers that serve another model path.
        concurrency: sample requests in flight per server.
        retries, backoff_s: retries of a request that failed to reach a server (connection error, 5xx, 429), the
            first after ``backoff_s``, each next twice as long.
        progress: show a progress bar (tqdm, on stderr) over the samples of each :meth:`submit`.
        live: a live capture of the traffic the servers serve (:class:`~eagle_io.capturing.sglang.live.LivePolicy`:
            the requests sampled, the caps); it runs until :meth:`close`. Its samples are dropped rather than waited
            for (ring or hand-off queue full, counted). :meth:`submit` still sends sample requests of its own.
        api_key, admin_api_key: SGLang's keys (:class:`eagle_io.sglang.servers.ServerKeys`; default
            ``EAGLE_IO_API_KEY`` / ``EAGLE_IO_ADMIN_API_KEY``); for a gateway, its inference key and a key of its
            control plane's admin role.

    The capture's secret (made here, sent once in the start) proves its sample requests and its stop; the servers
    show only its id (:attr:`capture_id`). It is kept in this user's cache (:func:`remember_secret`, mode 0600) so
    that ``resume`` (and ``eagle-io live stop``) can prove the capture again; a dataset another capture wrote is
    not resumed.

    Raises:
        InvalidArgumentError: a preflight refusal (:func:`server_facts`), servers that disagree on the target,
            ``options.dedup_prefixes`` True into object storage, ``sampling_params`` ``n`` other than 1, a
            start a server refused (its status' error, naming the URL and rank).
        SGLangError: a server that does not answer.
    """

    def __init__(
        self,
        urls: str | Sequence[str] | Sequence[ServerFacts],
        out_dir: str | os.PathLike[str],
        options: CaptureOptions,
        *,
        sampling_params: Mapping[str, Any] | None = None,
        model: str | None = None,
        concurrency: int = defaults.SERVER_CONCURRENCY,
        retries: int = defaults.SERVER_RETRIES,
        backoff_s: float = defaults.SERVER_BACKOFF_S,
        request_timeout_s: float = defaults.SERVER_REQUEST_TIMEOUT_S,
        progress: bool = False,
        live: LivePolicy | None = None,
        api_key: str | None = None,
        admin_api_key: str | None = None,
    ) -> None:
        self.keys = ServerKeys.resolve(api_key, admin_api_key)
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise InvalidArgumentError("capture from servers: no URL given")
        if concurrency < 1 or retries < 0 or backoff_s < 0:
            raise InvalidArgumentError(
                f"concurrency {concurrency} (>= 1), retries {retries} (>= 0), backoff_s {backoff_s} (>= 0)"
            )
        options.refuse_writer_ranks()
        # Shared prefixes stored once: the schedulers decide per request (eagle_io.capturing.sglang.capture), so a
        # sample request carries no radix-cache namespace of its own; else each attempt gets a fresh one.
        self._own_namespace = not options.stores_prefixes_once(os.fspath(out_dir))
        self.servers = [
            f
            for u in urls
            for f in (
                [u]
                if isinstance(u, ServerFacts)
                else preflight(
                    u, model=model, aux_layer_ids=options.aux_layer_ids, keys=self.keys, timeout_s=request_timeout_s
                )
            )
        ]
        first = self.servers[0]
        for s in self.servers[1:]:
            _same_target(first, s)
        # the target's shapes are the servers' own: only its name and files travel
        info = options.target_info or first.target_info
        options = options.replace(target_info={k: v for k, v in info.items() if k in CLIENT_TARGET_INFO})
        self.options = options
        self.url = os.fspath(out_dir)
        if not layout.is_url(self.url):  # the servers resolve a relative path in their own working directory
            self.url = os.path.abspath(self.url)
        self.sampling_params = {"max_new_tokens": 1, **(sampling_params or {})}
        if self.sampling_params.get("n", 1) != 1:  # SGLang forks such a request: its copies get a cached prompt
            raise InvalidArgumentError(
                f"sampling_params n={self.sampling_params['n']}: a sample request generates one answer (n=1); submit "
                "the sample under several ids for several answers"
            )
        self.concurrency, self.retries, self.backoff_s = concurrency, retries, backoff_s
        self.request_timeout_s, self.progress = request_timeout_s, progress
        self.aux_layer_ids = list(first.target["layers"])
        self.writers = sum(s.writers for s in self.servers)
        self.ranked = writer_world(self.servers) > 1  # several writers' manifests, merged at close
        self.manifest_path = self.url if self.ranked else os.path.join(self.url, layout.MANIFEST)
        self.merge_warnings: list[str] | None = None  # after close, when several writers' manifests were merged
        self.counts = dict.fromkeys(("submitted", "already_done", "sent", "retried", "prefix_tokens_reused"), 0)
        self.answers: list[dict[str, Any]] = []
        self.joined: list[ServerFacts] = []  # workers started after others already ran this capture
        self.not_joined: list[str] = []  # workers a gateway listed later that could not join (why)
        self._sent_ids: set[int] = set()
        self.manifest: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._model, self._live = model, live
        self.done = self._committed()
        resume = bool(options.writer_options.get("resume"))
        self._secret = (recall_secret(self.url) if resume else None) or new_secret()
        self.capture_id = capture_id(self._secret)
        running = self._running() if resume else {}
        # A resume while some workers still run this capture (a worker that joined the gateway since): those go on
        # as they are, the others start after the highest writer rank the capture has used.
        self._next_rank = self._highest_rank(running) + 1 if running else 0
        todo = [s for s in self.servers if s.route.name not in running]
        self._start(todo, world=writer_world(self.servers) if not running else None)
        self.joined = todo if running else []
        remember_secret(self.url, self._secret)  # once started: a refused start leaves no secret to stop with
        if live is not None:
            for u in {s.route.url for s in self.servers}:
                remember_secret(u, self._secret)
                remember_start(u, {"out_dir": self.url, "options": options.to_dict(), "live": live.to_dict()})

    def _running(self) -> dict[str, list[int]]:
        """The writer ranks of each server (by :attr:`ServerFacts.url`) that already runs this capture."""
        out: dict[str, list[int]] = {}
        for name, _, st in _statuses([s.route for s in self.servers], self.keys):
            if st.get("id") == self.capture_id and st.get("state") in ("capturing", "starting"):
                out.setdefault(name, []).append(int(st["writer_rank"]))
        return out

    def _highest_rank(self, running: Mapping[str, list[int]]) -> int:
        """The highest writer rank this capture has used: a running writer's, or a rank manifest's in ``out_dir``
        where this client sees it (a worker that left)."""
        held = [-1, *(r for ranks in running.values() for r in ranks)]
        if not layout.is_url(self.url):
            held += [int(layout.RANK_MANIFEST.match(p.name).group(1)) for p in layout.rank_manifests(self.url)]
        return max(held)

    def _start(self, servers: Sequence[ServerFacts], world: int | None = None) -> None:
        """Starts this capture on ``servers``, their writers numbered from ``self._next_rank`` on (``world``: the
        world size their manifests are named by; None: each names its own, as a later joiner of a gateway's
        capture does); returns once every one of them captures.

        Raises:
            InvalidArgumentError: a start refused (what :func:`_wait_ranks` raises).
        """
        if not servers:
            return
        options = self.options.replace(writer_options={**self.options.writer_options, "resume": True}) if (
            world is None) else self.options  # fmt: skip
        for s in servers:
            cmd = control_args("start", self._secret, out_dir=self.url, options=options.to_dict(),
                               writer_offset=self._next_rank, all_writers=world or self._next_rank + s.writers,
                               client=_client_name(),
                               live=self._live.to_dict() if self._live is not None else None)  # fmt: skip
            s.route.call("set_internal_state", {"server_args": cmd}, keys=self.keys, control=True)
            self._next_rank += s.writers
        _wait_ranks([s.route for s in servers], self._secret, {"capturing"}, "id", defaults.STOP_TIMEOUT_S, "start",
                    keys=self.keys)  # fmt: skip

    def join_new_workers(self) -> list[ServerFacts]:
        """Starts this capture on the workers each gateway it captures through lists now and did not list before
        (the same options, the next writer ranks); returns them. :meth:`submit` calls it first. A worker that cannot
        join (refused by the preflight or its start) is logged and named in :attr:`not_joined`; what the gateway sends
        it is answered but not stored, which :meth:`close` reports.

        Raises:
            SGLangError: a gateway does not answer.
        """
        gateways = {s.route.url for s in self.servers if s.route.via_gateway}
        known = {s.route.worker_id for s in self.servers} | {n.split(" ", 1)[0] for n in self.not_joined}
        new = []
        for g in sorted(gateways):
            for route in routes(g, keys=self.keys, timeout_s=self.request_timeout_s):
                if route.worker_id in known:
                    continue
                try:
                    facts = server_facts(route, model=self._model, aux_layer_ids=self.aux_layer_ids, keys=self.keys,
                                         timeout_s=self.request_timeout_s)  # fmt: skip
                    _same_target(self.servers[0], facts)
                    self._start([facts])
                except (InvalidArgumentError, SGLangError) as e:
                    logger.warning("eagle-io: %s joined the gateway but not the capture: %s", route.name, e)
                    self.not_joined.append(f"{route.worker_id} {route.name}: {e}")
                    continue
                self.servers.append(facts)
                self.writers += facts.writers
                new.append(facts)
        self.joined += new
        return new

    forward_seconds = store_seconds = None  # the forwards run in the servers

    @property
    def upload_report(self) -> dict[str, Any] | None:
        """After :meth:`close` of a capture into object storage, what every writer uploaded
        (:func:`eagle_io.store.upload.combine_upload_reports`); else None."""
        return combine_upload_reports([a.get("upload") for a in self.answers])

    def _committed(self) -> set[int]:
        """Sample ids the dataset's manifests already list, where this client can read them (an ``s3://`` prefix,
        or a directory it shares with the servers); else none: each server's writer then skips what it holds,
        counted as ``already_done`` in its counts."""
        if layout.is_url(self.url) or os.path.isdir(self.url):
            return committed_ids(self.url)
        return set()

    def _wait(self, states: set[str], key: str, timeout_s: float, what: str) -> list[dict[str, Any]]:
        """:func:`_wait_ranks` over this capture's servers under its id."""
        return _wait_ranks([s.route for s in self.servers], self._secret, states, key, timeout_s, what, keys=self.keys,
                           sent=self.counts["sent"])  # fmt: skip

    # ----------------------------------------------------------------------------------------------- submitting

    def _send(self, server: ServerFacts, sample: Any, writer_in_server: int) -> None:
        body: dict[str, Any] = {
            "input_ids": [int(t) for t in sample.input_ids.tolist()],
            "sampling_params": {**self.sampling_params, "custom_params": sample_params(sample, self._secret)},
        }
        if server.writers > 1 and not server.route.via_gateway:  # the gateway picks the worker
            body["routed_dp_rank"] = writer_in_server
        retryable = _RETRYABLE_VIA_GATEWAY if server.route.via_gateway else _RETRYABLE
        wait = self.backoff_s
        for attempt in range(self.retries + 1):
            if self._own_namespace:
                body["extra_key"] = f"eagle-io-{uuid.uuid4().hex}"  # a fresh radix-cache namespace per attempt
            try:
                out = http_json(server.route.generate_url, body, timeout_s=self.request_timeout_s, keys=self.keys)
                break
            except SGLangError as e:
                if attempt == self.retries or (e.status is not None and e.status not in retryable):
                    raise SGLangError(
                        f"sample {sample.index}: {e} (after {attempt + 1} attempt(s))", status=e.status
                    ) from e
                with self._lock:
                    self.counts["retried"] += 1
                time.sleep(wait)
                wait *= 2
        meta = (out[0] if isinstance(out, list) else out or {}).get("meta_info") or {}
        finish = meta.get("finish_reason")
        if isinstance(finish, dict) and finish.get("type") == "abort":  # answered 200, but nothing was stored
            raise SGLangError(
                f"sample {sample.index}: {server.route.generate_url}: the server aborted the request "
                f"({finish.get('message')}); nothing of it was stored",
                status=finish.get("status_code"),
            )
        with self._lock:
            self.counts["sent"] += 1
            self._sent_ids.add(int(sample.index))
            self.counts["prefix_tokens_reused"] += int(meta.get("cached_tokens") or 0)

    def submit(self, samples: Sequence[Any]) -> None:
        """Sends each sample (``index``, ``input_ids [L]``, ``loss_mask [L]``, optional ``id``, e.g.
        :class:`eagle_io.data.TokenizedSample`) as one request, ``concurrency`` in flight per server; returns when
        every server has answered every request. Sample ``i`` goes to server ``i % len(urls)``, and there to DP rank
        ``(i // len(urls)) % writers``; through a gateway, where the gateway routes it, after the workers it lists
        now and did not before have joined the capture (:meth:`join_new_workers`). Committed samples are skipped and
        counted.

        Raises:
            SchemaError: a sample the capture cannot store (checked before anything is sent).
            SGLangError: a request that failed after its retries, or that the server aborted (``/abort_request``, a
                request it could not serve: answered, but not stored; not retried), naming the sample and the URL (the
                samples sent before stay captured; a failed sample is not counted done: submit it again).
            InvalidArgumentError: the capture is closed.
        """
        if self.manifest is not None:
            raise InvalidArgumentError(f"the capture into {self.url} is closed; start a new one")
        vocab = int(self.servers[0].target["vocab_size"])
        for s in samples:
            check_sample(s.index, s.input_ids, s.loss_mask, max_length=self.options.max_length, vocab_size=vocab)
        self.counts["submitted"] += len(samples)
        todo = [s for s in samples if int(s.index) not in self.done]
        self.counts["already_done"] += len(samples) - len(todo)
        if not todo:
            return
        if any(s.route.via_gateway for s in self.servers):
            self.join_new_workers()  # before the gateway can route a sample to a worker that does not capture
        n = len(self.servers)
        bar = _bar(len(todo)) if self.progress else None
        pools = [ThreadPoolExecutor(self.concurrency, thread_name_prefix="eagle-io-send") for _ in self.servers]
        try:
            futures = []
            for s in todo:
                i = int(s.index)
                server = self.servers[i % n]
                futures.append(pools[i % n].submit(self._send, server, s, (i // n) % server.writers))
            first_error = None
            for f in futures:
                try:
                    f.result()
                except SGLangError as e:
                    first_error = first_error or e
                if bar is not None:
                    bar.update(1)
            if first_error is not None:
                raise first_error
        finally:
            for p in pools:
                p.shutdown(wait=True, cancel_futures=True)
            if bar is not None:
                bar.close()
        self.done.update(int(s.index) for s in todo)

    # ------------------------------------------------------------------------------------------------- stopping

    def stats(self) -> dict[str, Any]:
        """``counts`` (``submitted``, ``already_done``, ``sent``, ``retried``, ``prefix_tokens_reused``: prompt
        tokens SGLang served from its cache, 0 when every prompt was computed); after :meth:`close`, plus the writers'
        counters summed (``scheduler_*``: :data:`eagle_io.capturing.store.COUNTS` and the scheduler's own
        :data:`~eagle_io.capturing.sglang.capture.REQUEST_COUNTS`), and the rings' statistics (sizes and times per
        rank: the largest)."""
        out: dict[str, Any] = dict(self.counts)
        per_rank = ("ring_capacity", "ring_high_water_bytes", "elapsed_seconds")
        for a in self.answers:
            for k, v in {
                **(a.get("stats") or {}),
                **{f"scheduler_{k}": v for k, v in (a.get("counts") or {}).items()},
            }.items():
                if isinstance(v, (int, float)):
                    out[k] = max(out.get(k, 0), v) if k in per_rank else out.get(k, 0) + v
        return out

    def close(self, timeout_s: float = defaults.STOP_TIMEOUT_S, complete: bool = True) -> dict[str, Any]:
        """Stops the capture on every server (each writer drains its ring, commits and answers in its status);
        merges several writers' manifests where this client can reach ``out_dir``. Returns the manifest (``{}``
        when several writers' manifests are left to merge: ``eagle-io merge`` where the dataset is).

        Raises:
            StorageError: a worker behind a gateway was lost (removed or down) during the capture, raised after the
                others stopped and the manifests were merged (naming each; the merged manifest is incomplete); what
                :func:`_wait_ranks` raises for a stop.
        """
        if self.manifest is not None:
            return self.manifest
        stop = control_args("stop", self._secret, complete=complete, client=_client_name())
        for s in self.servers:
            _send_stop(s.route, stop, self.keys)
        self.answers = self._wait({"stopped"}, "stop_id", timeout_s, "stop")
        lost = [a for a in self.answers if a.get("state") == "lost"]
        self.manifest = {}
        reachable = layout.is_url(self.url) or os.path.isdir(self.url)
        if reachable and not self.ranked and not layout.is_url(self.url):
            self.manifest = read_manifest(os.path.join(self.url, layout.MANIFEST))
        elif reachable and complete and self.ranked:
            from ...store.merge import merge_ranks

            left = self._close_ranks_left_behind() if not lost else []
            merged = merge_ranks(self.url)
            self.manifest_path, self.merge_warnings = merged.manifest, list(merged.warnings)
            self.manifest = read_manifest(merged.manifest) if not layout.is_url(self.url) else {}
            self.merge_warnings += left
        via_gateway = any(s.route.via_gateway for s in self.servers)
        if via_gateway and complete and not lost and self.manifest and not layout.is_url(self.url):
            unstored = sorted(self._sent_ids - committed_ids(self.url))
            if unstored:  # answered by a worker that holds no capture (one that joined the gateway after the start)
                raise StorageError(
                    f"{len(unstored)} sample(s) sent through the gateway were answered but not stored in {self.url} "
                    f"(e.g. ids {unstored[:5]}): a worker that joined the gateway after the capture started answers "
                    "without capturing (see each worker's counts for refusals); resume=True (--resume) captures them"
                )
        if lost:
            raise StorageError(
                f"{len(lost)} worker(s) left the gateway during the capture into {self.url}: "
                f"{'; '.join(a['worker'] for a in lost)}: what each committed is in the dataset, whose manifest is "
                "marked incomplete; the samples they held uncommitted were not stored (resume=True, or --resume, "
                "captures them again)"
            )
        return self.manifest

    def _close_ranks_left_behind(self) -> list[str]:
        """After a resumed capture through fewer workers than an earlier run of it (a worker left the gateway): the
        rank manifests in a local ``out_dir`` that no writer of this run continued and that are marked incomplete
        (their worker stopped without committing) are closed complete by this client, adding nothing (what they
        committed stays; the samples they had not committed were not in the dataset, so this run sent them again).
        Returns a line per rank closed, or per rank that could not be (another writer holds it)."""
        from ...store.reader import Dataset
        from ...store.writer import ShardWriter

        if not self.options.writer_options.get("resume") or layout.is_url(self.url):
            return []
        mine = {a.get("writer_rank") for a in self.answers}
        said = []
        for path in layout.rank_manifests(self.url):
            rank = int(layout.RANK_MANIFEST.match(path.name).group(1))
            if rank in mine:
                continue
            ds = Dataset(path, threads=1)
            if ds.manifest["complete"]:
                continue
            try:
                ShardWriter(self.url, ds.schema, ds.manifest["metadata"], rank=rank, world_size=max(rank + 1, 2),
                            resume=True).close(complete=True)  # fmt: skip
            except InvalidArgumentError as e:  # a writer still holds it: left as it is, merged incomplete
                said.append(f"{path.name}: left incomplete, no writer of this run continued it and it is held: {e}")
                continue
            said.append(f"{path.name}: closed complete by the client ({len(ds)} samples; no writer of this resumed "
                        "run continued it)")  # fmt: skip
        return said

    def __enter__(self) -> ServerCapture:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.close()
            return
        try:  # commit what the servers hold, marked incomplete, without hiding the error
            self.close(timeout_s=120.0, complete=False)
        except Exception as e:
            logger.error("eagle-io: could not stop the capture on %s after %s: %s",
                         [s.url for s in self.servers], exc_type.__name__, e)  # fmt: skip


def capture_status(url: str, *, api_key: str | None = None, admin_api_key: str | None = None) -> list[dict[str, Any]]:
    """The eagle-io capture status of every writing DP rank of the server at ``url`` (``GET /server_info``'s
    ``internal_states[i]["eagle_io_capture"]``): ``state``, ``out_dir``, ``writer_rank``, ``live`` (the policy, None for
    a client-driven capture), ``counts`` (the store's :data:`~eagle_io.capturing.store.COUNTS`, the scheduler's
    :data:`~eagle_io.capturing.sglang.capture.REQUEST_COUNTS` and
    :data:`~eagle_io.capturing.sglang.capture.PREFIX_COUNTS`, a live capture's
    :data:`~eagle_io.capturing.sglang.live.LIVE_COUNTS`), ``prefixes`` (``{"records": n}``: the prefix records
    its samples may start after; None when they are stored whole), ``ring`` (capacity, high-water mark, bytes in use
    and committed), ``error``.

    Raises:
        SGLangError: the server does not answer, or refuses the key.
    """
    keys = ServerKeys.resolve(api_key, admin_api_key)
    return [{"url": u, "dp_rank": i, **st} for u, i, st in _statuses(routes(url, keys=keys), keys)]


def _statuses(found: Sequence[Route], keys: ServerKeys) -> list[tuple[str, int, dict[str, Any]]]:
    """``(name, DP rank, eagle-io status)`` of every writing rank of the workers ``found``. A worker behind a gateway
    that no longer answers (removed from the gateway, or down) is one entry of state ``lost`` with the error."""
    out = []
    for route in found:
        try:
            answer = route.call("server_info", timeout_s=defaults.SERVER_REQUEST_TIMEOUT_S, keys=keys)
        except SGLangError as e:
            if not route.via_gateway or e.status not in _LOST:
                raise
            out.append((route.name, 0, {"state": "lost", "worker": route.name, "error": str(e)}))
            continue
        for i, st in enumerate(answer.get("internal_states") or []):
            cap = st.get(STATUS_KEY) or {}
            if cap.get("writes", cap.get("target", {}).get("writes", True)):
                out.append((route.name, i, cap))
    return out


# What the gateway answers for a worker it no longer has (404 worker_not_found) or cannot reach (502, 503).
_LOST = {404, 502, 503}


def _wait_ranks(
    found: Sequence[Route],
    secret: str,
    states: set[str],
    key: str,
    timeout_s: float,
    what: str,
    forced: bool = False,
    *,
    keys: ServerKeys,
    sent: int | None = None,
) -> list[dict[str, Any]]:
    """Polls every writing rank of the workers ``found`` until each reports one of ``states`` under the id of
    ``secret`` (``key``: ``id`` for a start, ``stop_id`` for a stop; a ``forced`` stop also takes a rank with no
    capture); returns their statuses. ``sent``: the sample requests this client sent, named when a forced stop ended
    its capture.

    Raises:
        InvalidArgumentError: a rank refused or failed the start (its reason), or runs another client's capture (names
            URL and rank).
        StorageError: a rank failed while stopping (its error, naming URL and rank), holds no capture to stop, or
            was stopped by a forced stop (:func:`stop_server_capture`) before this one's (how many samples are missing).
        CaptureStopTimeoutError: not every rank got there within ``timeout_s``.

    A worker behind a gateway found ``lost`` is not waited for: a stop goes on with the others and its status is
    returned as ``lost`` (what that worker committed stays; its manifest is incomplete); a start raises.
    """
    mine_id = capture_id(secret)
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = _statuses(found, keys)
        pending = []
        for url, rank, st in statuses:
            if st.get("state") == "lost":
                if what == "stop":
                    continue
                raise InvalidArgumentError(f"{url}: lost while the capture started: {st['error']}")
            mine = st.get(key) == mine_id
            if mine and st.get("state") == "failed":
                cls = StorageError if what == "stop" else InvalidArgumentError
                raise cls(f"{url} DP rank {rank}: the capture's {what} failed: {st.get('error')}")
            if not mine and what == "start" and st.get("state") in ("capturing", "starting", "stopping"):
                raise InvalidArgumentError(
                    f"{url} DP rank {rank} is already capturing into {st.get('out_dir')} for another client "
                    f"(capture {st.get('id')}): stop that capture first (its client's close(), or eagle-io live stop "
                    "from the machine that started it; if that client is gone, an operator's forced stop, "
                    f"eagle_io.capturing.sglang.client.stop_server_capture({url!r}, admin_api_key=...), commits what "
                    "it wrote, marked incomplete)"
                )
            if what == "stop" and st.get("state") == "idle":
                if forced:
                    continue
                raise StorageError(
                    f"{url} DP rank {rank} holds no capture to stop (was the server restarted?): what it had not "
                    "committed is lost; --resume captures it again"
                )
            if mine and what == "stop" and not forced and st.get("stopped_by") not in (None, mine_id):
                written = (st.get("counts") or {}).get("written")
                missing = (
                    f"{sent - written} of the {sent} samples sent"
                    if sent is not None and written is not None
                    else "the samples sent after it"
                )
                raise StorageError(
                    f"{url} DP rank {rank}: this capture was ended by a forced stop (stop {st.get('stopped_by')}) "
                    f"before this client's: {missing} were not stored, and its manifest is marked incomplete; "
                    "resume=True (--resume) captures them again"
                )
            if not (mine and st.get("state") in states):
                pending.append(f"{url} DP rank {rank} ({st.get('state')})")
        if not pending:
            return [st for _, _, st in statuses]
        if time.monotonic() > deadline:
            raise CaptureStopTimeoutError(
                f"the capture's {what} did not reach {', '.join(pending)} within {timeout_s:.0f} s"
            )
        time.sleep(0.2)


def stop_server_capture(
    url: str,
    timeout_s: float = defaults.STOP_TIMEOUT_S,
    complete: bool = False,
    *,
    api_key: str | None = None,
    admin_api_key: str | None = None,
) -> list[dict[str, Any]]:
    """Stops the capture running on the server at ``url``. With the secret this user's cache holds for that server
    (:func:`remember_secret`: a live capture this user started there, ``eagle-io live stop``), or else
    ``EAGLE_IO_CAPTURE_SECRET`` (the operator's capture started by environment), as its own client: committed, marked
    complete unless ``complete`` is False. Otherwise a forced stop, the recovery when the capture's
    client is gone: the server takes it only with its admin key (it must have been launched with
    ``--admin-api-key`` or ``--api-key``), and every writer commits what it wrote marked incomplete
    (``eagle_io.capture(url, out_dir, resume=True)`` continues it from the machine that started it); that client
    finds its capture stopped at its ``close`` (a StorageError). A capture started by environment without a secret
    is stopped by any stop.

    Returns:
        Every writing DP rank's status (``state`` ``stopped``, or ``idle`` where none ran; ``counts``).

    Raises:
        SGLangError: the server does not answer, or refuses the key (naming the option).
        StorageError: a rank failed while stopping (its error, naming URL and rank), or refused the stop (naming why).
        CaptureStopTimeoutError: not every rank stopped within ``timeout_s``.
    """
    url, keys = server_url(url), ServerKeys.resolve(api_key, admin_api_key)
    found = routes(url, keys=keys)
    secret = recall_secret(url) or os.environ.get(ENV_CAPTURE_SECRET) or None
    forced = secret is None or not any(
        st.get("id") == capture_id(secret) and st.get("state") in ("capturing", "stopping", "stopped")
        for _, _, st in _statuses(found, keys)
    )
    if forced:
        secret = new_secret()
    cmd = control_args("stop", secret, complete=complete, force=forced, client=_client_name())
    taken = [t for r in found for t in _send_stop(r, cmd, keys)]  # a bool per rank
    if (
        forced
        and not any(taken)
        and any(st.get("state") in ("capturing", "stopping") for _, _, st in _statuses(found, keys))
    ):
        raise StorageError(
            f"{url} refused the forced stop: only the capture's own client stops it, or an operator with the "
            "server's admin key (the server must have been launched with --admin-api-key; pass --admin-api-key)"
        )
    return _wait_ranks(found, secret, {"stopped"}, "stop_id", timeout_s, "stop", forced=True, keys=keys)


def _send_stop(route: Route, cmd: Mapping[str, Any], keys: ServerKeys) -> list[bool]:
    """Sends a stop to one worker; what each of its DP ranks answered (empty for a worker behind a gateway that is
    lost: :func:`_wait_ranks` reports it)."""
    try:
        return list(route.call("set_internal_state", {"server_args": cmd}, keys=keys, control=True) or [])
    except SGLangError as e:
        if not route.via_gateway or e.status not in _LOST:
            raise
        return []


def _client_name() -> str:
    """What the server's audit line names this client by (it sees no address): host and process id."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _secret_path(key: str) -> str:
    return os.path.join(cache_dir(), "captures", hashlib.sha256(key.encode()).hexdigest()[:32])


def remember_secret(key: str, secret: str) -> None:
    """Keeps a capture's secret for ``key`` (its dataset's URL, or a server's URL) in this user's cache
    (``$EAGLE_IO_CACHE/captures``, directory 0700, file 0600), so that a resume or a later stop can prove it."""
    _keep(_secret_path(key), secret)


def recall_secret(key: str) -> str | None:
    """The secret :func:`remember_secret` kept for ``key``, or None."""
    try:
        with open(_secret_path(key)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def remember_start(key: str, start: Mapping[str, Any]) -> None:
    """Keeps what a live capture through the server or gateway ``key`` was started with (``out_dir``, ``options``,
    ``live``: no secret) beside its secret, for :func:`join_live_capture`."""
    _keep(_secret_path(f"start {key}"), json.dumps(start))


def recall_start(key: str) -> dict[str, Any] | None:
    """What :func:`remember_start` kept for ``key``, or None."""
    try:
        with open(_secret_path(f"start {key}")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _keep(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def join_live_capture(url: str, *, api_key: str | None = None, admin_api_key: str | None = None) -> ServerCapture:
    """Starts the live capture this machine started through ``url`` (``eagle-io live start``; a gateway's URL) on
    every worker behind it that does not run it yet, e.g. one added to the gateway since: the same dataset, options
    and policy, the writer ranks after the highest the capture has used. Returns the capture
    (:attr:`ServerCapture.joined`: the workers started now; empty when every worker already runs it).

    Raises:
        InvalidArgumentError: this machine started no live capture through ``url``, or no worker runs it any more
            (``eagle-io live start --resume`` continues a stopped one); what :class:`ServerCapture` raises.
        SGLangError: ``url`` does not answer, or refuses the key.
    """
    url, keys = server_url(url), ServerKeys.resolve(api_key, admin_api_key)
    start, secret = recall_start(url), recall_secret(url)
    if start is None or secret is None:
        raise InvalidArgumentError(
            f"this machine started no live capture through {url} (eagle-io live start keeps its secret and options "
            "in this user's cache): join from the machine that started it"
        )
    if not any(st.get("id") == capture_id(secret) and st.get("state") == "capturing"
               for _, _, st in _statuses(routes(url, keys=keys), keys)):  # fmt: skip
        raise InvalidArgumentError(
            f"no worker behind {url} runs the live capture into {start['out_dir']} any more: eagle-io live start "
            "--resume continues a stopped capture on every worker"
        )
    options = CaptureOptions.from_dict(start["options"])
    options = options.replace(writer_options={**options.writer_options, "resume": True})
    return ServerCapture(url, start["out_dir"], options, live=LivePolicy.from_dict(start["live"]), api_key=api_key,
                         admin_api_key=admin_api_key)  # fmt: skip


def _bar(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="sample", desc="capture", dynamic_ncols=True)
