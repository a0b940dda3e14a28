"""The report's plots, drawn with matplotlib (imported lazily, Agg backend) from the figures of
:mod:`eagle_io.report.figures`; each function returns PNG bytes, or None when there is nothing to draw."""

from __future__ import annotations

import io
import itertools
from typing import Any

from ..errors import MissingDataPackageError

WIDTH, HEIGHT, DPI = 7.2, 3.0, 100  # inches, inches, dots per inch: 720 x 300 pixels per plot


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MissingDataPackageError(
            "matplotlib", "eagle-io report draws its plots with matplotlib (the `report` extra)"
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    """The figure as a 128-colour palette PNG (a third of matplotlib's RGBA size, no visible change)."""
    from PIL import Image  # a dependency of matplotlib

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    _pyplot().close(fig)
    out = io.BytesIO()
    Image.open(buf).convert("RGB").quantize(colors=128).save(out, format="png", optimize=True)
    return out.getvalue()


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _yscale(ax, values) -> None:
    """Log scale when the positive values span more than 20x, else linear with plain tick labels."""
    pos = [v for v in values if v is not None and v > 0]
    if pos and max(pos) > 20 * min(pos):
        from matplotlib.ticker import NullFormatter

        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())  # decade labels only


def _bars(ax, hist: dict[str, list], color: str) -> None:
    edges, counts = hist["edges"], hist["counts"]
    widths = [b - a for a, b in itertools.pairwise(edges)]
    ax.bar(edges[:-1], counts, width=widths, align="edge", color=color, edgecolor="white", linewidth=0.5)


def lengths_plot(fig_lengths: dict[str, Any]) -> bytes | None:
    """Histogram of tokens per sample, with the p50 / p90 / p99 lines."""
    if not sum(fig_lengths["histogram"]["counts"]):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    _bars(ax, fig_lengths["histogram"], "tab:blue")
    pct = fig_lengths["percentiles"]
    for key, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
        ax.axvline(pct[key], color="tab:red", linestyle=style, label=f"{key} = {pct[key]:,}")
    ax.set(xlabel="tokens per sample", ylabel="samples", title="Token lengths")
    ax.legend(fontsize=8)
    return _png(fig)


def mask_plot(fig_mask: dict[str, Any]) -> bytes | None:
    """Histogram of the supervised share (loss_mask = 1) per sample."""
    if not fig_mask.get("samples_read"):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    _bars(ax, fig_mask["share_histogram"], "tab:green")
    ax.set(xlabel="supervised share of the sample's tokens", ylabel="samples", title="Loss-mask coverage", xlim=(0, 1))
    return _png(fig)


def layer_plot(layer: dict[str, Any]) -> bytes | None:
    """One layer: RMS and max |x| by token position (left), RMS per channel with the top outliers (right)."""
    if not layer["rows"]:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(WIDTH * 1.4, HEIGHT))
    bins = layer["position_bins"]
    step = bins["max_length"] / bins["count"]
    pos = [b * step for b in range(bins["count"])]
    for key, color, label in (("rms_by_position", "tab:blue", "RMS"), ("max_abs_by_position", "tab:orange", "max |x|")):
        pts = [(p, v) for p, v in zip(pos, layer[key], strict=True) if v is not None and v > 0]
        if pts:
            left.plot(*zip(*pts, strict=True), color=color, label=label, linewidth=1)
    _yscale(left, layer["rms_by_position"] + layer["max_abs_by_position"])
    left.set(xlabel="token position", title=f"{layer['name']}: by position")
    left.legend(fontsize=8)
    rms = layer["channel_rms"]
    right.plot(range(len(rms)), rms, color="tab:purple", linewidth=0.8)
    top = layer["top_channels"][:3]
    right.scatter([c["channel"] for c in top], [c["rms"] for c in top], color="tab:red", s=14, zorder=3)
    for c in top:
        right.annotate(
            str(c["channel"]), (c["channel"], c["rms"]), fontsize=7, xytext=(3, 2), textcoords="offset points"
        )
    _yscale(right, rms)
    right.set(xlabel="channel", ylabel="RMS over tokens", title=f"{layer['name']}: by channel")
    return _png(fig)


def shards_plot(shards: list[dict[str, Any]]) -> bytes | None:
    """Stored MB per shard (bars) and compression ratio (line)."""
    if not shards:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    x = range(len(shards))
    ax.bar(x, [s["bytes"] / 1e6 for s in shards], color="tab:blue", label="stored MB")
    ax.set(xlabel="shard (manifest order)", ylabel="stored MB (bars)", title="Shards")
    if len(shards) <= 20:
        ax.set_xticks(range(len(shards)))
    else:
        ax.xaxis.set_major_locator(_integer_ticks())
    ratio = ax.twinx()
    ratio.plot(x, [s["ratio"] or 0 for s in shards], color="tab:red", marker="o", markersize=3, label="ratio")
    ratio.set_ylabel("ratio (red): decoded / stored")
    ratio.set_ylim(bottom=0)
    return _png(fig)


def capture_plot(capture: dict[str, Any]) -> bytes | None:
    """Tokens per second per logged interval (line) and the share of each interval outside the forward."""
    points = sorted(capture.get("intervals") or [], key=lambda i: i["start_s"])
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    mid = [(i["start_s"] + i["seconds"] / 2) / 60 for i in points]
    for run in sorted({i["run"] for i in points}):  # one line per run: no line across the pause between runs
        pts = [(m, i["tokens_per_s"]) for m, i in zip(mid, points, strict=True) if i["run"] == run]
        ax.plot(*zip(*pts, strict=True), color="tab:blue", marker="o", markersize=3)
    ax.set(xlabel="minutes since the first run began", ylabel="tokens / s", title="Capture throughput")
    ax.set_ylim(bottom=0)
    shares = [(m, i) for m, i in zip(mid, points, strict=True) if i["outside_forward_share"] is not None]
    if shares:
        other = ax.twinx()
        for run in sorted({i["run"] for _, i in shares}):
            pts = [(m, 100 * i["outside_forward_share"]) for m, i in shares if i["run"] == run]
            other.plot(*zip(*pts, strict=True), color="tab:orange", linestyle="--", marker=".", markersize=3)
        other.set_ylabel("% of time outside the forward (dashed)")
        other.set_ylim(0, max(5.0, 120 * max(i["outside_forward_share"] for _, i in shares)))
    return _png(fig)
