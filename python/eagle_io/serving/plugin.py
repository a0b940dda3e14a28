"""The eagle-io SGLang plugin: fail loudly when an EAGLE-3 draft is served without aux-state capture.

SGLang's plugin loader (``sglang/srt/plugins/__init__.py``, ``load_plugins``) calls :func:`register` in every
SGLang process that loads plugins (Engine/main, each ``run_scheduler_process``, the DP controller, the
detokenizer), through the entry point::

    [project.entry-points."sglang.srt.plugins"]
    eagle_io = "eagle_io.sglang_plugin:register"

(:mod:`eagle_io.sglang_plugin` calls this module's :func:`register` with the SGLang capture's hook installer, so
this room never imports :mod:`eagle_io.capturing`.)

``SGLANG_PLUGINS=eagle_io`` (SGLang's own whitelist) selects it by that name. Hooks are installed only through
``sglang.srt.plugins.hook_registry.HookRegistry``:

* **Startup guard** (BEFORE ``Scheduler.init_all_cuda_graphs``: after attention backends configured capture,
  before any CUDA graph is captured). When the draft is EAGLE-3-style it requires ``spec_algorithm.is_eagle3()``,
  aux capture enabled on the target (through a wrapper's ``language_model`` too) and wired to the module that runs
  the decoder layers (:func:`eagle_io.sglang.probe.capture_wiring_problems`), capturable and distinct
  ``layers_to_capture``, and ``len(captured) * target_hidden == fc input width``; otherwise startup aborts with
  :class:`ServingGuardError` saying how to launch. It then installs the runtime hooks below, in that scheduler
  process only, and only for speculative EAGLE-family launches.
* **Draft-extend width check** (BEFORE ``_draft_extend_for_prefill`` / ``_draft_extend_for_decode`` of the live
  draft worker's class, ``EagleDraftWorker`` or ``MultiLayerEagleDraftWorker``: exactly the two places that build an
  ``EagleDraftExtendInput``; draft decode steps legitimately carry H-wide states and are not checked). Reads
  ``Tensor.shape`` only: no device sync.
* **Acceptance watchdog** (AFTER ``on_verify_complete_cpu`` where the live worker's class defines it, whose counts
  are already on the CPU): a loud warning when the mean accept length stays exactly 1.0 over a window of request
  steps, and, when the served draft directory holds a ``speculation_profile.json`` (``eagle-io eval-draft`` /
  ``train-draft``), when a window's pooled mean accept length (bonus token counted) falls below
  ``EAGLE_IO_ACCEPT_FRACTION`` of the accept length the profile expects at the served ``--speculative-num-steps``.

Every target is resolved before it is registered and checked in place after SGLang applied it
(:mod:`eagle_io.sglang.hooks`); a target that cannot be placed, or an SGLang outside the supported range, stops
the launch with :class:`~eagle_io.errors.SGLangCompatError` naming the switch that runs without it.

Environment switches (read when the plugin loads and at startup):

=================================  ===========  ========================================================
SGLang versions: :data:`eagle_io.sglang.compat.SUPPORTED_SGLANG`; every SGLang name used is in :mod:`eagle_io.sglang`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import DraftWidthError, ServingGuardError, SGLangCompatError
from ..sglang import compat, hooks, probe
from ..sglang.draft_build import EAGLE3_CLASS_FIX, eagle3_class_problem, fc_skip_problem
from ..sglang.launch_args import LaunchArgs, launch_args
from ..sglang.setters import capturable_range, captured_ids, setter_rule, short_capture

__all__ = [
    "ENV_ACCEPT_FRACTION",
    "ENV_ACCEPT_WATCHDOG",
    "ENV_ACCEPT_WINDOW",
    "ENV_ALLOW_SGLANG",
    "ENV_CAPTURE",
    "ENV_DRAFT_WIDTH_CHECK",
    "ENV_GUARD_REPORT",
    "ENV_PLUGIN",
    "ENV_STARTUP_GUARD",
    "AcceptanceWatchdog",
    "DraftWidthError",
    "ServingGuardError",
    "draft_is_eagle3",
    "register",
    "startup_decision",
]

logger = logging.getLogger("eagle_io.serving")

ENV_PLUGIN = "EAGLE_IO_SGLANG_PLUGIN"
ENV_STARTUP_GUARD = "EAGLE_IO_STARTUP_GUARD"
ENV_DRAFT_WIDTH_CHECK = "EAGLE_IO_DRAFT_WIDTH_CHECK"
ENV_ACCEPT_WATCHDOG = "EAGLE_IO_ACCEPT_WATCHDOG"
ENV_ACCEPT_WINDOW = "EAGLE_IO_ACCEPT_WINDOW"
ENV_ACCEPT_FRACTION = "EAGLE_IO_ACCEPT_FRACTION"
ENV_GUARD_REPORT = "EAGLE_IO_GUARD_REPORT"
ENV_CAPTURE = "EAGLE_IO_SGLANG_CAPTURE"
ENV_ALLOW_SGLANG = "EAGLE_IO_ALLOW_SGLANG_VERSION"

_OFF = {"0", "false", "no", "off"}


def _enabled(name: str) -> bool:
    return os.environ.get(name, "1").strip().lower() not in _OFF


def _env_number(name: str, default: str, kind: Callable[[str], float], ok: Callable[[float], bool], what: str) -> Any:
    """``kind(os.environ[name])`` (``default`` when unset).

    Raises:
        InvalidArgumentError: a value that does not parse or breaks ``ok``, naming the variable and ``what`` it
            must be.
    """
    from ..errors import InvalidArgumentError

    raw = os.environ.get(name, default)
    try:
        value = kind(raw.strip())
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise InvalidArgumentError(f"{name}={raw!r}: must be {what}")
    return value


# ------------------------------------------------------------------------------------------------ decisions


def draft_is_eagle3(facts: probe.StartupFacts) -> list[str]:
    """Evidence that the loaded draft is EAGLE-3-style (empty list = not): its config's ``eagle_config`` layer ids,
    ``draft_vocab_size``, ``target_hidden_size``, or an ``fc`` whose input is ``k >= 3`` target hidden states.
    Not the architecture name alone (some EAGLE-3 drafts declare a plain one)."""
    cfg = facts.draft_config
    sig: list[str] = []
    ec = cfg.get("eagle_config")
    if isinstance(ec, dict) and ec.get("eagle_aux_hidden_state_layer_ids"):
        sig.append(f"eagle_config.eagle_aux_hidden_state_layer_ids = {ec['eagle_aux_hidden_state_layer_ids']}")
    for key in ("draft_vocab_size", "target_hidden_size"):
        if cfg.get(key) is not None:
            sig.append(f"{key} = {cfg[key]}")
    w, h = facts.fc_in_width, facts.target_hidden_size
    if w is not None and h and w % h == 0 and w // h >= 3:
        sig.append(f"fc input width {w} = {w // h} x target hidden {h}")
    return sig


def startup_decision(facts: probe.StartupFacts) -> str | None:
    """The startup guard's verdict: None = fine, else the error message (what is wrong, how to launch).

    Applies only when a draft is loaded here and it is EAGLE-3-style (:func:`draft_is_eagle3`).
    """
    if not facts.draft_present:
        return None
    signals = draft_is_eagle3(facts)
    if not signals:
        return None
    h = facts.target_hidden_size
    w = facts.fc_in_width
    problems: list[str] = []
    if not facts.is_eagle3:
        problems.append(
            f"the draft is an EAGLE-3 draft ({'; '.join(signals)}) but the speculative algorithm is "
            f"{facts.algorithm} (NEXTN is an alias of EAGLE): the target captures no aux states, the draft would get "
            f"{h}-wide final states instead of {w}, skip its fc, and accept nothing beyond the bonus token. "
            "Relaunch with --speculative-algorithm EAGLE3"
        )
    else:
        if facts.draft_class is not None:
            built = eagle3_class_problem(facts.draft_class, has_fc=facts.fc_in_width is not None)
            if built is not None:
                problems.append(f"{built}. Fix: {EAGLE3_CLASS_FIX}")
        if facts.spec_aux_enabled is False:
            problems.append(
                "EAGLE3 is selected but aux-state capture is switched off for the target "
                "(the draft's eagle_config has use_aux_hidden_state: false). Remove that key from the draft's "
                "config.json"
            )
        if not facts.capture_enabled:
            problems.append(
                f"EAGLE3 is selected but the target model {facts.target_architecture} does not capture aux states "
                "(capture_aux_hidden_states is off on the model and on its language_model: a wrapper model that "
                "does not delegate set_eagle3_layers_to_capture). Use an SGLang version whose "
                f"{facts.target_architecture} delegates the capture setter, or serve the text model directly"
            )
        n = facts.target_num_layers
        layers = list(facts.layers_to_capture)
        if n is not None:
            lo, hi = capturable_range(facts.target_architecture, int(n))
            captured = captured_ids(facts.target_architecture, int(n), layers)
            outside = [i for i in layers if not lo <= i <= hi]
            dups = sorted({i for i in layers if layers.count(i) > 1})
            if outside:
                problems.append(
                    f"layers_to_capture {layers} has ids outside {lo}..{hi} for a {n}-layer target: "
                    f"{short_capture(facts.target_architecture, len(captured), len(layers))}. Fix "
                    "eagle_config.eagle_aux_hidden_state_layer_ids in the draft's config.json "
                    f"({setter_rule(facts.target_architecture)}); `eagle-io check-serving` computes the ids"
                )
            if dups:
                problems.append(
                    f"layers_to_capture {layers} names layer {', '.join(map(str, dups))} more than once: the forward "
                    f"captures each layer once: {short_capture(facts.target_architecture, len(captured), len(layers))}"
                    ". List each trained layer once in eagle_config.eagle_aux_hidden_state_layer_ids"
                )
            layers = captured
        if facts.capture_enabled:
            problems.extend(
                f"the target's capture is not wired: {p}. Serve the text model directly, or use an SGLang version "
                "whose wrapper delegates set_eagle3_layers_to_capture to its language model"
                for p in facts.wiring_problems
            )
        skip = fc_skip_problem(len(layers), h, facts.draft_embed_width) if facts.capture_enabled else None
        if skip:
            problems.append(f"{skip}. Retrain the draft on 2 or more aux layers (or with another hidden size)")
        if facts.capture_enabled and w is not None and len(layers) * h != w:
            problems.append(
                f"the target captures {len(layers)} aux states ({list(facts.layers_to_capture)}) x hidden {h} = "
                f"{len(layers) * h} wide, but the draft's fc expects {w}. Set "
                "eagle_config.eagle_aux_hidden_state_layer_ids in the draft's config.json to the "
                f"{w // h if h and w % h == 0 else '?'} layer ids the draft was trained on "
                "(`eagle-io check-serving` computes them)"
            )
    if not problems:
        return None
    return (
        "eagle-io serving guard: refusing to start an EAGLE-3 draft that would run without its aux states:\n  - "
        + "\n  - ".join(problems)
        + f"\n(SGLang {compat.sglang_version()}; switch this check off with {ENV_STARTUP_GUARD}=0)"
    )


# ------------------------------------------------------------------------------------------------ runtime


@dataclass
class AcceptanceWatchdog:
    """Counts request steps and correct drafts; warns when a full window accepted no draft token at all, and when
    its mean accept length is below ``fraction`` of ``expected``.

    Accept length of one request step = correct drafts + 1 (the bonus token), so a window mean of exactly 1.0
    means zero correct drafts in ``window`` request steps. The window mean is pooled (total accept lengths / request
    steps, SGLang's ``spec_accept_length``). ``expected``: what the draft's speculation profile predicts at the
    served number of steps (:func:`eagle_io.interop.speculation_profile.expected_accept_length`), None without one;
    ``expected_from`` says where it came from.
    """

    window: int = 256
    context: str = ""
    expected: float | None = None
    fraction: float = 0.5
    expected_from: str = ""
    steps: int = 0
    correct: int = 0
    windows: int = 0
    warnings: int = 0
    low_warnings: int = 0
    log: Callable[[str], None] = field(default=logger.warning)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, num_correct_drafts_per_req: Any) -> None:
        counts = [int(c) for c in (num_correct_drafts_per_req or ())]
        with self._lock:
            self.steps += len(counts)
            self.correct += sum(counts)
            if self.steps < self.window:
                return
            steps, correct = self.steps, self.correct
            self.steps = self.correct = 0
            self.windows += 1
        if correct == 0:
            self.warnings += 1
            bar = "!" * 100
            self.log(
                f"\n{bar}\neagle-io acceptance watchdog: mean accept length 1.00 over the last {steps} request "
                f"steps: the draft has not produced a single accepted token. Speculative decoding is only costing "
                f"time. Typical cause: an EAGLE-3 draft served without aux states (--speculative-algorithm EAGLE or "
                f"NEXTN instead of EAGLE3), wrong aux layer ids, or a draft trained for another target. "
                f"{self.context}\nRun `eagle-io check-serving --target ... --draft ... -- <launch args>`.\n{bar}"
            )
            return
        mean = 1.0 + correct / steps
        if self.expected is not None and self.fraction > 0 and mean < self.fraction * self.expected:
            self.low_warnings += 1
            bar = "!" * 100
            self.log(
                f"\n{bar}\neagle-io acceptance watchdog: mean accept length {mean:.2f} over the last {steps} request "
                f"steps (bonus token counted), below {self.fraction:g} x the {self.expected:.2f} this draft is "
                f"expected to reach ({self.expected_from}). Likely causes: aux layer ids other than the draft was "
                "trained on, another chat template than the training data's (or a thinking switch), a wrong or "
                "missing d2t vocab map, the wrong --speculative-algorithm (EAGLE instead of EAGLE3), or traffic "
                f"unlike the profiled data. {self.context}\nRun `eagle-io check-serving` on the launch and "
                f"`eagle-io eval-draft` on a sample of this traffic.\n{bar}"
            )

    @property
    def mean_accept_length(self) -> float | None:
        """Mean accept length of the current (partial) window."""
        with self._lock:
            return None if self.steps == 0 else 1.0 + self.correct / self.steps


@dataclass
class _Runtime:
    """Per-process state the runtime hooks read (set by the startup guard in the scheduler process)."""

    fc_in_width: int | None = None
    width_mode: str = "raise"
    width_checks: int = 0
    width_errors: int = 0
    watchdog: AcceptanceWatchdog | None = None


_RUNTIME = _Runtime()
_REGISTERED: set[str] = set()


def _check_width(method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    expected = _RUNTIME.fc_in_width
    if expected is None:
        return
    width = probe.draft_extend_width(method, args, kwargs)
    if width is None:
        return
    _RUNTIME.width_checks += 1
    if width == expected:
        return
    _RUNTIME.width_errors += 1
    msg = (
        f"eagle-io draft-extend check ({method}): the draft receives {width}-wide states but its fc expects "
        f"{expected}: the target is not capturing the aux states this EAGLE-3 draft was trained on "
        f"(relaunch with --speculative-algorithm EAGLE3 and the draft's layer ids; {ENV_DRAFT_WIDTH_CHECK}=warn "
        "only logs)"
    )
    if _RUNTIME.width_mode == "warn":
        if _RUNTIME.width_errors == 1 or _RUNTIME.width_errors % 1000 == 0:
            logger.error(msg)
        return
    raise DraftWidthError(msg)


def _prefill_width_hook(*args: Any, **kwargs: Any) -> None:
    _check_width(hooks.PREFILL_METHOD, args, kwargs)


def _decode_width_hook(*args: Any, **kwargs: Any) -> None:
    _check_width(hooks.DECODE_METHOD, args, kwargs)


def _accept_hook(result: Any, *args: Any, **kwargs: Any) -> None:
    wd = _RUNTIME.watchdog
    if wd is not None:
        counts = kwargs.get("num_correct_drafts_per_req", args[1] if len(args) > 1 else None)
        wd.observe(counts)
    return None


def _place(worker: Any, method: str, fn: Callable[..., Any], hook_type: str, switch: str) -> str:
    """Registers ``fn`` on ``method`` where the live ``worker``'s class defines it (:func:`hooks.defining_target`);
    returns the target. Raises :class:`SGLangCompatError` (naming ``switch``) when no class of it does."""
    target = hooks.defining_target(worker, method)
    if target is None:
        where = f"{type(worker).__module__}.{type(worker).__qualname__}.{method}"
        raise hooks.hook_error(where, f"no class of the live {type(worker).__name__} defines {method}", switch)
    if target not in _REGISTERED:
        hooks.register(target, fn, hook_type, switch=switch)
        _REGISTERED.add(target)
    return target


def expected_from_profile(
    draft_path: str | None, num_steps: int | None, revision: str | None = None
) -> tuple[float | None, str]:
    """``(expected accept length, where from)`` from the served draft's ``speculation_profile.json`` at the served
    ``num_steps`` (the profile's own when unknown); ``(None, why)`` without a usable profile. A Hub id is read from
    its snapshot in the local cache at ``revision`` (:func:`eagle_io.sglang.checkpoint.checkpoint_dir`, what SGLang
    downloaded). Never raises: an unreadable profile, or a draft path that names no local directory, is logged and
    ignored (the exactly-1.00 rule still runs)."""
    from ..errors import CheckpointError
    from ..interop.speculation_profile import PROFILE_NAME, expected_accept_length, read_profile
    from ..sglang.checkpoint import checkpoint_dir

    if not draft_path:
        return None, "no draft path"
    try:
        where = checkpoint_dir(draft_path, revision)
        prof = read_profile(where)
    except CheckpointError as e:  # was silent for a Hub id: read as a local path that does not exist
        logger.warning("eagle-io acceptance watchdog: ignoring the draft's %s: %s", PROFILE_NAME, e)
        return None, str(e)
    if prof is None:
        return None, f"no {PROFILE_NAME} in {where}"
    steps = num_steps if num_steps is not None else prof["num_steps"]
    value = expected_accept_length(prof, steps)
    data = prof.get("data")  # descriptive keys read_profile does not check: a hand-made profile may lack them
    samples = data.get("samples", "?") if isinstance(data, dict) else "?"
    measured = f"{prof.get('source', '?')} on {samples} samples"
    if steps > prof["num_steps"]:
        measured += f"; profiled at {prof['num_steps']} steps, a lower bound at {steps}"
    return value, f"{where / PROFILE_NAME}: {value:.2f} at {steps} steps, {measured}"


def install_runtime_hooks(
    scheduler: Any, facts: probe.StartupFacts, *, eagle3_draft: bool, launch: LaunchArgs | None = None
) -> list[str]:
    """Registers the runtime hooks through ``HookRegistry`` on the methods the scheduler's live draft workers run
    (``EagleDraftWorker`` for EAGLE / EAGLE3, ``MultiLayerEagleDraftWorker`` under ``--enable-multi-layer-eagle``;
    the accept hook where the outer worker's class defines ``on_verify_complete_cpu``), applies them
    (``HookRegistry.apply_hooks`` skips targets already patched) and checks each is in place. Returns the targets
    newly registered here. ``launch``: the served draft path and number of steps, for the watchdog's expected value
    (:func:`expected_from_profile`).

    Raises:
        SGLangCompatError: a target is not defined on the live worker or not in place after applying (naming the
            switch that runs without it: the startup guard lets it stop the launch).
        InvalidArgumentError: ``EAGLE_IO_ACCEPT_WINDOW`` not an integer >= 1, ``EAGLE_IO_ACCEPT_FRACTION`` not a
            finite number >= 0 (naming the variable).
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    outer, inner = probe.draft_workers(scheduler)
    before = set(_REGISTERED)
    mode = os.environ.get(ENV_DRAFT_WIDTH_CHECK, "raise").strip().lower()
    if eagle3_draft and mode not in _OFF and facts.fc_in_width is not None:
        _RUNTIME.fc_in_width = facts.fc_in_width
        _RUNTIME.width_mode = "warn" if mode == "warn" else "raise"
        switch = f"{ENV_DRAFT_WIDTH_CHECK}=0"
        _place(inner, hooks.PREFILL_METHOD, _prefill_width_hook, "BEFORE", switch)
        _place(inner, hooks.DECODE_METHOD, _decode_width_hook, "BEFORE", switch)
    if _enabled(ENV_ACCEPT_WATCHDOG):
        # 0 or less made every verify step a window (a loud warning per step); NaN switched the rule off silently.
        window = _env_number(ENV_ACCEPT_WINDOW, "256", int, lambda v: v >= 1, "an integer >= 1 (request steps)")
        fraction = _env_number(
            ENV_ACCEPT_FRACTION, "0.5", float, lambda v: 0 <= v < float("inf"), "a number >= 0 (0: no expected rule)"
        )
        expected, source = (None, "")
        if eagle3_draft and fraction > 0 and launch is not None:
            expected, source = expected_from_profile(launch.draft_path, launch.num_steps, launch.draft_revision)
            if expected is not None:
                logger.info("eagle-io acceptance watchdog: expecting %s (warning below %g x)", source, fraction)
        _RUNTIME.watchdog = AcceptanceWatchdog(
            window=window,
            expected=expected,
            fraction=fraction,
            expected_from=source,
            context=(
                f"(algorithm {facts.algorithm}, draft {facts.draft_architecture}, fc input width "
                f"{facts.fc_in_width}, target capture {list(facts.layers_to_capture)} x {facts.target_hidden_size})"
            ),
        )
        _place(outer, hooks.ACCEPT_METHOD, _accept_hook, "AFTER", f"{ENV_ACCEPT_WATCHDOG}=0")
    HookRegistry.apply_hooks()
    added = sorted(_REGISTERED - before)
    hooks.verify(added)
    return added


def _report(entry: dict[str, Any]) -> None:
    path = os.environ.get(ENV_GUARD_REPORT)
    if not path:
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry

        patched = sorted(HookRegistry._patched)
    except (ImportError, AttributeError):
        patched = []
    entry = {"pid": os.getpid(), "sglang": compat.sglang_version(), "patched": patched, **entry}
    try:
        with open(path, "a", encoding="utf-8") as f:  # one short line: appends from several processes stay whole
            f.write(json.dumps(entry, default=str) + "\n")
    except OSError as e:
        logger.warning("eagle-io: cannot write %s=%s: %s", ENV_GUARD_REPORT, path, e)


def _startup_guard(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on ``Scheduler.init_all_cuda_graphs``."""
    algo = getattr(scheduler, "spec_algorithm", None)
    if algo is None or not algo.is_eagle():
        # Not speculative (or not EAGLE-family): nothing to guard.
        _report({"algorithm": str(getattr(algo, "name", algo)), "guarded": False})
        return None
    facts = probe.startup_facts(scheduler)
    signals = draft_is_eagle3(facts) if facts.draft_present else []
    entry: dict[str, Any] = {
        "algorithm": facts.algorithm,
        "guarded": _enabled(ENV_STARTUP_GUARD),
        "eagle3_draft": signals,
        "layers_to_capture": list(facts.layers_to_capture),
        "target_hidden_size": facts.target_hidden_size,
        "fc_in_width": facts.fc_in_width,
    }
    if _enabled(ENV_STARTUP_GUARD):
        verdict = startup_decision(facts)
        if verdict is not None:
            logger.error(verdict)
            _report({**entry, "verdict": verdict})
            raise ServingGuardError(verdict)
        if signals:
            logger.info(
                "eagle-io serving guard: EAGLE-3 draft OK (algorithm %s, capture %s x %d = fc input %s)",
                facts.algorithm,
                list(facts.layers_to_capture),
                facts.target_hidden_size,
                facts.fc_in_width,
            )
    if facts.draft_present:
        launch = launch_args(getattr(scheduler, "server_args", None))
        install_runtime_hooks(scheduler, facts, eagle3_draft=bool(signals), launch=launch)
    _report({**entry, "verdict": None})
    return None


def _stop_at_scheduler_init(problem: SGLangCompatError | None) -> Callable[..., None]:
    """The BEFORE hook on ``Scheduler.__init__``: raises what went wrong at plugin load (SGLang's
    ``load_plugins`` only logs a plugin's error), else checks that the hooks registered then are in place."""
    at_load = sorted(_REGISTERED)

    def check(*args: Any, **kwargs: Any) -> None:
        if problem is not None:
            raise problem
        hooks.verify(at_load)

    return check


def _version_problem() -> SGLangCompatError | None:
    v = compat.sglang_version()
    if compat.version_supported(v) or (v is not None and os.environ.get(ENV_ALLOW_SGLANG) == v):
        return None
    return SGLangCompatError(
        f"SGLang {v} is outside the range eagle-io supports ({compat.SUPPORTED_SGLANG}, tested "
        f"{compat.TESTED_SGLANG}): the guard's hooks and probes may not hold there, so the launch is stopped. To run "
        f"on it knowingly (every hook is still resolved and checked), set {ENV_ALLOW_SGLANG}={v}"
    )


def _hosts_http_server() -> bool:
    """Whether this process serves SGLang's HTTP routes: its module is loaded, or this is the process of ``python -m
    sglang.launch_server`` itself (its ``load_plugins()`` runs before it imports the HTTP server; the processes it
    spawns re-run that main module, but have a parent)."""
    import multiprocessing

    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    launched = getattr(main, "name", None) == "sglang.launch_server" and multiprocessing.parent_process() is None
    return launched or hooks.SERVER_INFO_HOOK.rsplit(".", 1)[0] in sys.modules


_KEY_FIELDS = ("api_key", "admin_api_key")


def redact_keys(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER :data:`eagle_io.sglang.hooks.SERVER_INFO_HOOK`: SGLang's keys in ``/server_info``'s answer, and the
    value after ``--api-key`` / ``--admin-api-key`` in its ``launch_command``, become ``<redacted>``."""
    if isinstance(result, dict):
        for k in _KEY_FIELDS:
            if result.get(k) is not None:
                result[k] = "<redacted>"
        cmd = result.get("launch_command")
        if isinstance(cmd, str):
            result["launch_command"] = " ".join(_redacted_argv(cmd.split(" ")))
        elif isinstance(cmd, list):
            result["launch_command"] = _redacted_argv(cmd)
    return result


def _redacted_argv(argv: list[Any]) -> list[Any]:
    flags = {f"--{k.replace('_', '-')}" for k in _KEY_FIELDS}
    out: list[Any] = []
    for a in argv:
        if out and out[-1] in flags:
            out.append("<redacted>")
        elif isinstance(a, str) and a.split("=", 1)[0] in flags and "=" in a:
            out.append(a.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(a)
    return out


def register(install_capture: Callable[[str], list[str]] | None = None) -> None:
    """Behind the ``sglang.srt.plugins`` entry point (:func:`eagle_io.sglang_plugin.register`): registers the startup
    guard (and, through ``install_capture(switch)``, which returns the targets it hooked, the SGLang capture's hooks)
    in SGLang processes that host a ``Scheduler`` (the module is already imported there; other processes are left
    alone, so the detokenizer does not import the scheduler stack for nothing). Does nothing when
    ``EAGLE_IO_SGLANG_PLUGIN=0``.

    Every target is resolved before it is registered (:func:`eagle_io.sglang.hooks.register`). SGLang's
    ``load_plugins`` only logs what this function raises, so a target that does not resolve, or an SGLang outside
    :data:`eagle_io.sglang.compat.SUPPORTED_SGLANG` without ``EAGLE_IO_ALLOW_SGLANG_VERSION``, is raised from a
    BEFORE hook on ``Scheduler.__init__``, which stops the launch; that hook also checks that the hooks registered
    here are in place once SGLang applied them."""
    if not _enabled(ENV_PLUGIN):
        logger.info("eagle-io SGLang plugin disabled (%s=0)", ENV_PLUGIN)
        return
    if _hosts_http_server() and hooks.SERVER_INFO_HOOK not in _REGISTERED:
        try:  # the HTTP server's process: its /server_info must not hand SGLang's keys to any caller
            hooks.register(hooks.SERVER_INFO_HOOK, redact_keys, "AFTER", switch=f"{ENV_PLUGIN}=0")
            _REGISTERED.add(hooks.SERVER_INFO_HOOK)
        except SGLangCompatError as e:
            logger.error("eagle-io: SGLang's keys stay readable in /server_info: %s", e)
    if hooks.STARTUP_HOOK.rsplit(".", 2)[0] not in sys.modules:
        return
    problem = _version_problem()
    if problem is None:
        try:
            if hooks.STARTUP_HOOK not in _REGISTERED:
                hooks.register(hooks.STARTUP_HOOK, _startup_guard, "BEFORE", switch=f"{ENV_PLUGIN}=0")
                _REGISTERED.add(hooks.STARTUP_HOOK)
            if install_capture is not None and _enabled(ENV_CAPTURE) and hooks.TP_FORWARD_HOOK not in _REGISTERED:
                _REGISTERED.update(install_capture(f"{ENV_CAPTURE}=0"))
        except SGLangCompatError as e:
            problem = e
    if problem is not None:
        logger.error("%s", problem)
    if hooks.SCHEDULER_INIT_HOOK not in _REGISTERED:
        hooks.register(hooks.SCHEDULER_INIT_HOOK, _stop_at_scheduler_init(problem), "BEFORE", switch=f"{ENV_PLUGIN}=0")
        _REGISTERED.add(hooks.SCHEDULER_INIT_HOOK)
