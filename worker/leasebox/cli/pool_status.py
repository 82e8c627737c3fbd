"""What `kubectl leasebox status POOL` says about a pool, gathered and put into words.

The pool, its worker Deployment's pods and its Events come from the API with the user's
kubeconfig; the backlog per kind comes from the pool's own database, through the DSN of the
Secret the pool names (or `--dsn` where that DSN does not resolve from here). When the
database cannot be read, the status says why in one line and falls back on the backlog the
operator last wrote to the pool's status. The verdict comes first, in the manner of
`kubectl cnpg status`: is the SLA met, and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from leasebox.inspection.narrative import duration

WORKER_SELECTOR = "app.kubernetes.io/instance={name},app.kubernetes.io/name=leasebox-worker"
RECENT_EVENTS = 10


@dataclass
class PoolStatus:
    """Everything `status` shows, as plain values (also what `-o json|yaml` prints)."""

    name: str
    namespace: str
    pool: dict[str, Any]
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    backlog: list[dict[str, Any]] | None = None
    database_problem: str | None = None
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.pool.get("spec") or {})

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.pool.get("status") or {})

    @property
    def sla_seconds(self) -> float:
        return float((self.spec.get("sla") or {}).get("oldestPendingAgeSeconds", 60))

    @property
    def oldest_pending_age_seconds(self) -> float | None:
        if self.backlog is not None:
            return max((k["oldestPendingAgeSeconds"] for k in self.backlog), default=0.0)
        age = (self.status.get("backlog") or {}).get("oldestPendingAgeSeconds")
        return None if age is None else float(age)

    def verdict(self) -> tuple[bool | None, str]:
        """(SLA met, the line that says so); None when nothing tells the backlog's age."""
        paused = (
            " The pool is paused: its workers are held at 0." if self.spec.get("paused") else ""
        )
        age, sla = self.oldest_pending_age_seconds, self.sla_seconds
        if age is None:
            return None, f"SLA unknown: no backlog has been read yet.{paused}"
        if age <= sla:
            line = (
                f"SLA met: the oldest pending message is {duration(age)} old, "
                f"{duration(sla - age)} within its {duration(sla)}."
            )
            return True, line + paused
        line = (
            f"SLA MISSED: the oldest pending message is {duration(age)} old, "
            f"{duration(age - sla)} over its {duration(sla)}."
        )
        return False, line + paused

    def facts(self) -> dict[str, str]:
        spec, status = self.spec, self.status
        scaling = spec.get("scaling") or {}
        database = spec.get("database") or {}
        ref = database.get("secretRef") or {}
        reachable = (
            "read from here"
            if self.database_problem is None
            else f"not read from here ({self.database_problem})"
        )
        last = status.get("lastScaleTime")
        return {
            "Name": f"{self.namespace}/{self.name}",
            "Kinds": ", ".join(spec.get("kinds") or []),
            "SLA": f"oldest pending message under {duration(self.sla_seconds)}",
            "Scaling": f"{scaling.get('mode', 'Operator')}, "
            f"{scaling.get('minReplicas', '?')}..{scaling.get('maxReplicas', '?')} replicas",
            "Paused": "yes (workers held at 0)" if spec.get("paused") else "no",
            "Replicas": f"{status.get('desiredReplicas', '?')} desired, "
            f"{status.get('replicas', '?')} requested, {status.get('readyReplicas', 0)} ready",
            "Database": f"schema {database.get('schema', 'leasebox')} (Secret "
            f"{ref.get('name', '?')}, key {ref.get('key', 'dsn')}): {reachable}",
            "Rates": f"{(status.get('rates') or {}).get('arrivalPerSecond', 0)} arriving/s, "
            f"{(status.get('rates') or {}).get('sentPerSecond', 0)} sent/s",
            "Last scale": f"{last}: {status.get('lastScaleReason', '')}" if last else "never",
            "Generation": f"{status.get('observedGeneration', '?')} observed of "
            f"{(self.pool.get('metadata') or {}).get('generation', '?')}",
        }

    def replica_rows(self) -> list[dict[str, Any]]:
        rows = []
        for pod in self.pods:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            containers = status.get("containerStatuses") or []
            ready = sum(1 for c in containers if c.get("ready"))
            rows.append(
                {
                    "pod": meta.get("name"),
                    "phase": status.get("phase", "Unknown"),
                    "ready": f"{ready}/{len(containers) or 1}",
                    "restarts": sum(int(c.get("restartCount", 0)) for c in containers),
                    "age": self._age(meta.get("creationTimestamp")),
                    "node": (pod.get("spec") or {}).get("nodeName") or "",
                }
            )
        return rows

    def backlog_rows(self) -> list[dict[str, Any]]:
        if self.backlog is not None:
            return self.backlog
        total = self.status.get("backlog") or {}
        if not total:
            return []
        kinds = ", ".join(self.spec.get("kinds") or [])
        return [{"kind": f"{kinds} (from the pool's status)", **_status_backlog(total)}]

    def condition_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "type": c.get("type"),
                "status": c.get("status"),
                "reason": c.get("reason"),
                "since": self._age(c.get("lastTransitionTime")),
                "message": c.get("message", ""),
            }
            for c in self.status.get("conditions") or []
        ]

    def event_rows(self) -> list[dict[str, Any]]:
        def when(event: dict[str, Any]) -> str:
            return str(event.get("lastTimestamp") or event.get("eventTime") or "")

        recent = sorted(self.events, key=when)[-RECENT_EVENTS:]
        return [
            {
                "lastSeen": self._age(when(e) or None),
                "type": e.get("type"),
                "reason": e.get("reason"),
                "count": e.get("count", 1),
                "message": e.get("message", ""),
            }
            for e in recent
        ]

    def _age(self, stamp: str | None) -> str:
        if not stamp:
            return "?"
        then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        return duration((self.now - then).total_seconds())

    def as_dict(self) -> dict[str, Any]:
        met, line = self.verdict()
        return {
            "pool": {"name": self.name, "namespace": self.namespace},
            "verdict": line,
            "slaMet": met,
            "oldestPendingAgeSeconds": self.oldest_pending_age_seconds,
            "slaSeconds": self.sla_seconds,
            "paused": bool(self.spec.get("paused")),
            "facts": self.facts(),
            "replicas": self.replica_rows(),
            "backlog": self.backlog_rows(),
            "database": {"read": self.database_problem is None, "problem": self.database_problem},
            "conditions": self.condition_rows(),
            "events": self.event_rows(),
        }


def _status_backlog(total: dict[str, Any]) -> dict[str, Any]:
    return {
        "pending": total.get("pending", 0),
        "ready": total.get("ready", 0),
        "processing": total.get("processing", 0),
        "dead": total.get("dead", 0),
        "expiredLeases": total.get("expiredLeases", 0),
        "oldestPendingAgeSeconds": total.get("oldestPendingAgeSeconds", 0.0),
        "sentPerSecond": total.get("sentPerSecond", 0.0),
    }


def backlog_of(conn: Any, kinds: list[str], schema: str) -> list[dict[str, Any]]:
    """The pool's backlog per kind, read from its database."""
    from leasebox.store.backlog import fetch_backlog

    found = fetch_backlog(conn, kinds, schema=schema)
    return [
        {"kind": kind, **_status_backlog(one.as_dict())} for kind, one in found.by_kind().items()
    ]


def table(title: str, rows: list[dict[str, Any]], columns: dict[str, str]) -> list[str]:
    """A titled table of `rows` with `columns` (key -> header), or one line saying none."""
    if not rows:
        return [title, "  (none)", ""]
    cells = [[_cell(row.get(key)) for key in columns] for row in rows]
    header = list(columns.values())
    widths = [max(len(r[i]) for r in (header, *cells)) for i in range(len(header))]
    lines = [title]
    for row in (header, *cells):
        lines.append(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        )
    return [*lines, ""]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


def render_text(state: PoolStatus) -> str:
    """The whole status for a terminal."""
    _, line = state.verdict()
    facts = state.facts()
    width = max(len(k) for k in facts) + 1
    lines = [line, ""]
    lines += [f"{(key + ':').ljust(width)} {value}" for key, value in facts.items()]
    lines.append("")
    lines += table(
        "Replicas",
        state.replica_rows(),
        {"pod": "POD", "phase": "PHASE", "ready": "READY", "restarts": "RESTARTS",
         "age": "AGE", "node": "NODE"},
    )  # fmt: skip
    rows = [
        {**row, "oldest": duration(float(row["oldestPendingAgeSeconds"]))}
        for row in state.backlog_rows()
    ]
    lines += table(
        "Backlog",
        rows,
        {"kind": "KIND", "pending": "PENDING", "ready": "READY", "processing": "PROCESSING",
         "dead": "DEAD", "expiredLeases": "EXPIRED LEASES", "oldest": "OLDEST PENDING",
         "sentPerSecond": "SENT/S"},
    )  # fmt: skip
    lines += table(
        "Conditions",
        state.condition_rows(),
        {"type": "TYPE", "status": "STATUS", "reason": "REASON", "since": "SINCE",
         "message": "MESSAGE"},
    )  # fmt: skip
    lines += table(
        "Recent events",
        state.event_rows(),
        {"lastSeen": "LAST SEEN", "type": "TYPE", "reason": "REASON", "count": "COUNT",
         "message": "MESSAGE"},
    )  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"
