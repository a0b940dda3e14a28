"""The report page: one self-contained HTML file (plots as inline ``data:image/png`` images, inline CSS, no
script, no external reference), built from :func:`eagle_io.report.figures.build_figures`'s figures."""

from __future__ import annotations

import base64
import html
import json
import time
from typing import Any

from . import plots

SHARD_ROWS = 50  # shards listed in the table (all are plotted)
CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1060px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; border-bottom: 1px solid #ccc; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border: 1px solid #ddd; padding: 2px 8px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #555; } .bad { color: #b00; font-weight: 600; } code { font-size: 13px; }
img.plot { display: block; margin: 8px 0; max-width: 100%; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(v: Any) -> str:
    """Integers with thousands separators; floats to 4 significant digits (whole numbers from 1,000 up)."""
    if v is None:
        return "n/a"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:,.2f} {unit} ({n:,} bytes)"
    return f"{n:,} bytes"


def _table(rows: list[tuple], head: tuple | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        cells = [f'<td class="n">{_num(c)}</td>' if isinstance(c, (int, float)) else f"<td>{_e(c)}</td>" for c in row]
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join([*out, "</table>"])


def _img(png: bytes | None, alt: str) -> str:
    if png is None:
        return f'<p class="note">({_e(alt)}: nothing to plot)</p>'
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="plot" alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _summary(f: dict[str, Any]) -> str:
    s = f["summary"]
    rows = [
        ("samples", s["samples"]),
        ("shards", s["shards"]),
        ("tokens", s["tokens"]),
        ("decoded", _bytes(s["raw_bytes"])),
        ("stored", _bytes(s["stored_bytes"])),
        ("ratio (decoded / stored)", s["ratio"]),
        ("complete", "yes" if f["complete"] else "NO: the writer did not close"),
        ("lossy", "; ".join(f.get("lossy_history") or []) or "no: stored lossless, never transcoded from lossy"),
        ("written by", f["writer"]),
    ]
    return "<h2>Summary</h2>" + _table(rows)


def _metadata(f: dict[str, Any]) -> str:
    m = f["metadata"] if isinstance(f["metadata"], dict) else {}
    tok = m.get("tokenizer") if isinstance(m.get("tokenizer"), dict) else {}
    pkg = tok.get("tokenizer_package")
    target = m.get("target_model")
    rows = [
        ("target", json.dumps(target) if isinstance(target, (dict, list)) else target),
        ("layers (num_layers / hidden_size / vocab_size)", f"{m.get('num_layers')} / {m.get('hidden_size')} / "
                                                           f"{m.get('vocab_size')}"),
        ("aux layer ids", m.get("aux_layer_ids")),
        ("aux layer convention", m.get("aux_layer_convention")),
        ("state dtype", m.get("dtype")),
        ("max_length", m.get("max_length")),
        ("tokenizer", f"{tok.get('tokenizer')}" + (f" (package {pkg})" if pkg else "")),
        ("chat template sha256", tok.get("chat_template_sha256")),
        ("loss mask method", tok.get("loss_mask_method")),
    ]  # fmt: skip
    schema = ", ".join(
        f"{t['name']} {t['dtype']}" + (f"[L, {t['width']}]" if t["width"] else "[L]") for t in f["schema"]
    )
    full = _e(json.dumps(f["metadata"], indent=2, sort_keys=True))
    return (
        "<h2>Metadata</h2>"
        + _table([(k, "n/a" if v is None else v) for k, v in rows] + [("schema", schema)])
        + f"<details><summary>all metadata</summary><pre>{full}</pre></details>"
    )


def _lengths(f: dict[str, Any]) -> str:
    p = f["lengths"]["percentiles"]
    return (
        "<h2>Token lengths</h2><p class='note'>All samples, from the shard indexes.</p>"
        + _img(plots.lengths_plot(f["lengths"]), "token length histogram")
        + _table([tuple(p.values())], tuple(p.keys()))
    )


def _masks(f: dict[str, Any]) -> str:
    m = f["loss_mask"]
    bad = m.get("unreadable") or []
    out = "<h2>Loss-mask coverage</h2>"
    if not m.get("samples_read"):
        return out + "<p class='note'>No loss_mask tensor could be read.</p>"
    out += (
        "<p class='note'>All samples; only each record's loss_mask is read (not checksummed: "
        "<code>eagle-io verify</code> checks records).</p>"
    )
    out += _img(plots.mask_plot(m), "supervised share histogram")
    rows = [
        ("supervised tokens", m["supervised_tokens"]),
        ("supervised share of all tokens", m["supervised_share"]),
        ("mean supervised share per sample", m["mean_sample_share"]),
        ("samples with no supervised token (all-zero mask)", m["all_zero"]),
        ("samples fully supervised (all-one mask)", m["all_one"]),
        ("samples of 0 tokens", m["empty"]),
        ("masks that did not decode", len(bad)),
    ]
    out += _table(rows)
    for b in bad[:20]:
        out += f"<p class='bad'>{_e(b['shard'])}: sample {b['sample_id']}: {_e(b['error'])}</p>"
    return out


def _states(f: dict[str, Any]) -> str:
    st = f["states"]
    if st["all_samples"]:
        scope = f"all {st['samples']:,} samples ({st['tokens_read']:,} tokens) were read"
    else:
        scope = (
            f"a sample of {st['samples_read']:,} of the {st['samples']:,} samples ({st['tokens_read']:,} tokens, "
            f"drawn with seed {st['seed']}; <code>--sample N</code> reads more): the dataset is not read whole, so "
            "memory stays bounded on a dataset larger than RAM"
        )
    out = f"<h2>Hidden states per layer</h2><p class='note'>Statistics from {scope}. Rows holding NaN/Inf are counted "
    out += "and left out of the other figures.</p>"
    rows = [
        (ly["name"], ly["rows"], ly["rms"], ly["max_abs"], ly["nan"], ly["inf"], ly["nonfinite_rows"])
        for ly in st["layers"]
    ]
    out += _table(rows, ("layer", "finite rows", "RMS", "max |x|", "NaN", "Inf", "rows with NaN/Inf"))
    out += _values(st.get("values"))
    for ly in st["layers"]:
        out += f"<h3>{_e(ly['name'])}</h3>" + _img(plots.layer_plot(ly), f"{ly['name']} statistics")
        if ly["nan"] or ly["inf"]:
            out += f"<p class='bad'>{ly['nan']:,} NaN and {ly['inf']:,} Inf values in {ly['nonfinite_rows']:,} rows</p>"
        top = [(c["channel"], c["rms"], c["max_abs"], c["ratio"]) for c in ly["top_channels"]]
        out += _table(top, ("top channel", "RMS", "max |x|", "RMS / median channel RMS"))
    return out


def _values(v: dict[str, Any] | None) -> str:
    """``eagle-io verify``'s value categories over the samples read (:func:`eagle_io.report.figures.value_figures`)."""
    if not v or not v["checked"]:
        return ""
    out = (
        f"<h3>Value checks</h3><p class='note'><code>eagle-io verify</code>'s categories over the {v['samples']:,} "
        "samples read (copies looked for among them): samples per kind.</p>"
    )
    out += _table([(kind, n) for kind, n in v["counts"].items()], ("kind", "samples"))
    for p in v["problems"]:
        out += f"<p class='bad'>{_e(p['kind'])}: {_e(p['message'])}</p>"
    return out


def _shards(f: dict[str, Any]) -> str:
    shards = f["shards"]
    rows = [(s["file"], s["samples"], s["tokens"], s["bytes"], s["raw_bytes"], s["ratio"]) for s in shards[:SHARD_ROWS]]
    more = f"<p class='note'>... and {len(shards) - SHARD_ROWS:,} more shards</p>" if len(shards) > SHARD_ROWS else ""
    return (
        "<h2>Shards</h2>"
        + _img(plots.shards_plot(shards), "bytes and ratio per shard")
        + _table(rows, ("file", "samples", "tokens", "stored bytes", "decoded bytes", "ratio"))
        + more
    )


def _capture(f: dict[str, Any]) -> str:
    c = f["capture"]
    out = "<h2>Capture</h2>"
    if not c["available"]:
        return out + "<p class='note'>No capture log (capture_log*.jsonl) in the dataset directory.</p>"
    out += f"<p class='note'>From {', '.join(c['logs'])}: {c['runs']} run(s), {c['finished_runs']} finished"
    out += f", {c['torn_lines']} torn line(s) ignored.</p>" if c["torn_lines"] else ".</p>"
    out += _img(plots.capture_plot(c), "capture throughput over time")
    out += (
        "<p class='note'>One point per logged interval (10 s by default). A run's last interval includes its close "
        "(draining the capture ring, committing the last shard): few tokens, mostly outside the forward.</p>"
    )
    out += _table(
        [
            ("capture seconds", c["seconds"]),
            ("tokens", c["tokens"]),
            ("tokens / s", c["tokens_per_s"]),
            ("share of time outside the forward", c["outside_forward_share"]),
        ]
    )
    out += "<h3>Source records skipped (last finished run of each log) or modified (all finished runs)</h3>"
    rows = [("skipped", k, v) for k, v in c["skipped"].items()] + [("modified", k, v) for k, v in c["modified"].items()]
    return out + (_table(rows, ("", "reason", "records")) if rows else "<p class='note'>none</p>")


def render(figures: dict[str, Any]) -> str:
    """The whole page for ``figures``."""
    title = f"eagle-io report: {figures['dataset']}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p class='note'>Written {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by <code>eagle-io report</code>.</p>",
        _summary(figures),
        _lengths(figures),
        _masks(figures),
        _states(figures),
        _shards(figures),
        _capture(figures),
        _metadata(figures),
        "</body></html>",
    ]
    return "\n".join(parts)
