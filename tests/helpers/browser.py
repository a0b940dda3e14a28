"""Rendering a page in headless Chromium (Debian's ``chromium`` package) for the report tests: a full-page
screenshot, where each image landed, and every network request the page made (from Chromium's NetLog)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

WIDTH = 1200
# Keep Chromium's own background traffic (updates, sync, time checks) out of the NetLog; no name resolves.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",  # containers often have a small /dev/shm
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]
PROBE = (
    '<script>addEventListener("load", () => { document.title = JSON.stringify({height: '
    "document.documentElement.scrollHeight, images: [...document.images].map(i => { const r = "
    "i.getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, r.height, i.naturalWidth]; })}); "
    "});</script>"
)


def chromium() -> str:
    """The Chromium binary, or a skip saying how to get it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip(
            "headless Chromium is not installed (Debian: `apt-get install chromium`; `make venv` does it as root)"
        )
    return found


@dataclass
class Rendered:
    screenshot: Path
    images: list[tuple[int, int, int, int, int]]  # left, top, width, height (CSS px), natural width (0: broken)
    page_requests: list[str]  # URLs the page itself asked the network for


def _run(args: list[str]) -> str:
    r = subprocess.run([chromium(), *FLAGS, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def page_requests(netlog: Path) -> list[str]:
    """URLs requested on behalf of a page loaded from file:// (its network isolation key is file://)."""
    events = json.loads(netlog.read_text())["events"]
    by_source: dict[int, set[str]] = {}
    from_file: set[int] = set()
    for e in events:
        params, source = e.get("params") or {}, e["source"]["id"]
        if isinstance(params.get("url"), str):
            by_source.setdefault(source, set()).add(params["url"])
        if str(params.get("network_isolation_key", "")).startswith("file://") or params.get("initiator") == "null":
            from_file.add(source)
    return sorted(u for s in from_file for u in by_source.get(s, ()) if not u.startswith(("file:", "data:")))


def render(page: Path, work: Path) -> Rendered:
    """Loads ``page`` (a copy with a probe script that records the image boxes), then screenshots it whole."""
    work.mkdir(parents=True, exist_ok=True)
    probe = work / "probe.html"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    netlog = work / "netlog.json"
    dom = _run([f"--window-size={WIDTH},900", "--virtual-time-budget=10000", f"--log-net-log={netlog}",
                "--dump-dom", probe.as_uri()])  # fmt: skip
    title = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert title, "the page has no title"
    layout = json.loads(html.unescape(title.group(1)))
    shot = work / "screenshot.png"
    _run([f"--window-size={WIDTH},{layout['height']}", f"--screenshot={shot}", page.as_uri()])
    boxes = [tuple(round(v) for v in box) for box in layout["images"]]
    return Rendered(shot, boxes, page_requests(netlog))


def colored_pixels(image) -> int:
    """Pixels of a PIL image whose channels spread by more than 60 (plot data; axes and text are grey)."""
    import numpy as np

    rgb = np.asarray(image.convert("RGB")).astype(int)
    return int(((rgb.max(axis=2) - rgb.min(axis=2)) > 60).sum())
