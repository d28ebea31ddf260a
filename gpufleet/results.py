"""The result model of verify, below the reports that render it: one CheckResult per check, per host, per fleet.

Verdicts: ``pass``, ``warn`` (passes, but look at it), ``fail``, ``skip`` (could not be judged, with the reason)
and ``unreachable`` (the host could not be probed at all). The fleet result serialises to the versioned JSON
report (``FleetResult.to_dict()``); every renderer in gpufleet.report works from that dict, so a report can be
re-rendered from a stored JSON file.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

REPORT_SCHEMA = "gpufleet.verify.report"
REPORT_SCHEMA_VERSION = 1

PASS, WARN, FAIL, SKIP, UNREACHABLE = "pass", "warn", "fail", "skip", "unreachable"
VERDICTS = (PASS, WARN, FAIL, SKIP, UNREACHABLE)
# Severity order used to pick the worst verdict (skip never hides a real result).
_SEVERITY = {SKIP: 0, PASS: 1, WARN: 2, FAIL: 3, UNREACHABLE: 4}

EXIT_OK, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2


def worst_verdict(verdicts: list[str] | tuple[str, ...]) -> str:
    """The most severe verdict; ``skip`` only when there is nothing else; ``pass`` for an empty list."""
    if not verdicts:
        return PASS
    return max(verdicts, key=lambda v: _SEVERITY[v])


def utc_now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int((now % 1) * 1000):03d}Z"


@dataclass
class CheckResult:
    """One verdict about one host or one GPU of a host. ``check`` is a stable dotted id (``health.ecc``)."""

    check: str
    verdict: str
    host: str
    message: str
    remediation: str = ""
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    category: str = ""
    observed: Any = None
    expected: Any = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}; expected one of {', '.join(VERDICTS)}")
        if not self.category:
            self.category = self.check.split(".", 1)[0]

    @property
    def gpu_label(self) -> str:
        """``gpu3 (GPU-...)``, ``gpu3`` or ``""`` for a host-level check."""
        if self.gpu_index is None:
            return ""
        return f"gpu{self.gpu_index}" + (f" ({self.gpu_uuid})" if self.gpu_uuid else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        return cls(**{k: data.get(k) for k in ("check", "verdict", "host", "message")},
                   remediation=data.get("remediation") or "", gpu_index=data.get("gpu_index"),
                   gpu_uuid=data.get("gpu_uuid"), category=data.get("category") or "",
                   observed=data.get("observed"), expected=data.get("expected"))


@dataclass
class HostResult:
    """Everything verify knows about one host: its probe document (bench inside), checks and GPU summary.

    ``status``: ``ok`` (probed), ``unreachable`` (no connection) or ``error`` (connected, but the probe did not
    produce a document). ``gpus`` is the per-GPU summary the renderers draw (identity, temperatures, bench figures
    next to the catalog's dense peaks).
    """

    host: str
    status: str = "ok"
    error: str | None = None
    probe: dict[str, Any] | None = None
    checks: list[CheckResult] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.status == "unreachable":
            return UNREACHABLE
        return worst_verdict([c.verdict for c in self.checks])

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status, "error": self.error, "verdict": self.verdict,
                "counts": dict(Counter(c.verdict for c in self.checks)), "gpus": self.gpus,
                "checks": [c.to_dict() for c in self.checks], "probe": self.probe}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostResult:
        return cls(host=data["host"], status=data.get("status", "ok"), error=data.get("error"),
                   probe=data.get("probe"), checks=[CheckResult.from_dict(c) for c in data.get("checks", [])],
                   gpus=list(data.get("gpus") or []))


@dataclass
class FleetResult:
    hosts: list[HostResult]
    generated_at: str = field(default_factory=utc_now)
    bench_profile: str | None = None
    regressions: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def checks(self) -> list[CheckResult]:
        return [c for h in self.hosts for c in h.checks]

    @property
    def verdict(self) -> str:
        return worst_verdict([h.verdict for h in self.hosts])

    def summary(self) -> dict[str, Any]:
        counts = Counter(c.verdict for c in self.checks)
        return {
            "hosts": len(self.hosts),
            "hosts_ok": sum(1 for h in self.hosts if h.status == "ok"),
            "hosts_unreachable": sum(1 for h in self.hosts if h.status == "unreachable"),
            "hosts_error": sum(1 for h in self.hosts if h.status == "error"),
            "hosts_failed": sum(1 for h in self.hosts if h.verdict in (FAIL, UNREACHABLE)),
            "gpus": sum(len(h.gpus) for h in self.hosts),
            "checks": {v: counts.get(v, 0) for v in VERDICTS},
            "regressions": len(self.regressions),
            "verdict": self.verdict,
            "exit_code": exit_code(self),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "schema_version": REPORT_SCHEMA_VERSION,
            "generated_at": self.generated_at,
            "bench_profile": self.bench_profile,
            "summary": self.summary(),
            "hosts": [h.to_dict() for h in self.hosts],
            "regressions": list(self.regressions),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetResult:
        check_report_schema(data)
        return cls(hosts=[HostResult.from_dict(h) for h in data.get("hosts", [])],
                   generated_at=data.get("generated_at") or utc_now(), bench_profile=data.get("bench_profile"),
                   regressions=list(data.get("regressions") or []), meta=dict(data.get("meta") or {}))


class ReportSchemaError(ValueError):
    """A JSON report of another schema or a newer schema version than this gpufleet reads."""


def check_report_schema(data: Any) -> None:
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        raise ReportSchemaError(f"not a gpufleet verify report (schema {REPORT_SCHEMA!r} expected)")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > REPORT_SCHEMA_VERSION:
        raise ReportSchemaError(f"report schema_version {version!r} is not supported "
                                f"(this gpufleet reads <= {REPORT_SCHEMA_VERSION})")


def exit_code(fleet: FleetResult | dict[str, Any]) -> int:
    """0: every check passed (warnings allowed); 1: a check failed or a host was unreachable;
    2: verify could not run at all (no hosts, or no host could be probed)."""
    if isinstance(fleet, dict):
        fleet = FleetResult.from_dict(fleet)
    if not fleet.hosts or all(h.status != "ok" for h in fleet.hosts):
        return EXIT_COULD_NOT_RUN
    if any(h.verdict in (FAIL, UNREACHABLE) for h in fleet.hosts):
        return EXIT_FAILED
    return EXIT_OK
