"""Reading what tqdm wrote to a captured stderr."""

from __future__ import annotations


def final_bar(err: str, desc: str) -> str:
    """The last state tqdm wrote for the bar named ``desc`` (off a terminal it separates states with \\r)."""
    states = [part for line in err.splitlines() for part in line.split("\r") if part.startswith(f"{desc}:")]
    assert states, f"no {desc!r} bar in {err!r}"
    return states[-1]
