"""What the serving checks report: :class:`Finding` (severity, stable code, message, fix) and its text form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["ERROR", "INFO", "WARNING", "Finding", "Findings", "format_findings"]

ERROR, WARNING, INFO = "error", "warning", "info"


@dataclass(frozen=True)
class Finding:
    """One problem (or, with severity ``info``, one fact the user must know, e.g. the layer ids SGLang will
    capture by default). ``code`` is stable (tests and scripts match on it); ``fix`` says exactly what to do."""

    severity: str  # "error" | "warning" | "info"
    code: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


class Findings(list[Finding]):
    """A list of findings with a shorthand to add one."""

    def add(self, severity: str, code: str, message: str, fix: str) -> None:
        self.append(Finding(severity, code, message, fix))

    def has(self, *codes: str) -> bool:
        """Whether a finding with one of ``codes`` was added."""
        return any(f.code in codes for f in self)


def format_findings(findings: Sequence[Finding]) -> str:
    """Human-readable report, one block per finding; ``OK`` first when nothing is an error or warning."""
    if not findings:
        return "OK: no problems found"
    lines = []
    n_err = sum(f.severity == ERROR for f in findings)
    n_warn = sum(f.severity == WARNING for f in findings)
    if not n_err and not n_warn:
        lines.append("OK: no problems found")
    for f in findings:
        lines.append(f"{f.severity.upper()} [{f.code}] {f.message}")
        lines.append(f"    fix: {f.fix}")
    lines.append(f"{n_err} error(s), {n_warn} warning(s)")
    return "\n".join(lines)
