"""`kubectl leasebox`: a pool's status, pausing and resuming it, and redriving its dead letters.

Installed as the `kubectl-leasebox` console script, so `kubectl leasebox status POOL` works
the way kubectl plugins do. It needs nothing but the user's kubeconfig (`--kubeconfig`,
`--context`, `-n`, or `KUBECONFIG` and the current context, as kubectl reads them): the pool
comes through the API, and the database through the DSN of the pool's own Secret, read with
the user's permissions (`--dsn` overrides it where that DSN does not resolve from here). A
redrive is written to the pool's audit trail (`leasebox web` shows it) in the name of the
kubeconfig's user.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Sequence
from typing import Any

from leasebox.errors import ConfigurationError, LeaseboxError

GROUP, VERSION, PLURAL = "leasebox.dev", "v1alpha1", "outboxworkerpools"
RESOURCE = "outboxworkerpool.leasebox.dev"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl leasebox",
        description="Look at and steer leasebox OutboxWorkerPools with your kubeconfig.",
        epilog="exit status: 0 done, 1 the API or the database refused or is unreachable, "
        "2 usage error.",
    )
    parser.add_argument("--kubeconfig", help="path to the kubeconfig (default: $KUBECONFIG)")
    parser.add_argument("--context", help="the kubeconfig context (default: the current one)")
    parser.add_argument(
        "-n", "--namespace", help="the pool's namespace (default: the context's namespace)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    status = commands.add_parser(
        "status",
        help="the pool's verdict, facts, replicas, backlog per kind, conditions and Events",
    )
    status.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    pause = commands.add_parser("pause", help="scale the pool's workers to 0 and hold them")
    resume = commands.add_parser("resume", help="hand the pool back to its scaling mode")
    redrive = commands.add_parser(
        "redrive", help="requeue the dead letters of the pool's kinds (fresh attempts)"
    )
    redrive.add_argument("--reason", help="only this dead reason, e.g. rejected")
    redrive.add_argument("--error-class", help="only this error class, e.g. smtp_550")
    redrive.add_argument("--newer-than", metavar="DURATION", help="dead for less than this")
    redrive.add_argument("--older-than", metavar="DURATION", help="dead for longer than this")
    redrive.add_argument(
        "--dry-run", action="store_true", help="say how many would be requeued; change nothing"
    )
    for command in (status, pause, resume, redrive):
        command.add_argument("pool", metavar="POOL", help="the OutboxWorkerPool's name")
        command.add_argument("-n", "--namespace", dest="command_namespace", help=argparse.SUPPRESS)
    for command in (status, redrive):
        command.add_argument(
            "--dsn", help="the database's DSN (default: the one in the pool's Secret)"
        )
    return parser


class Cluster:
    """The API as the kubeconfig's user sees it."""

    def __init__(self, args: argparse.Namespace) -> None:
        from kubernetes import client, config

        try:
            contexts, active = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
                config_file=args.kubeconfig
            )
            chosen = (
                next((c for c in contexts if c["name"] == args.context), active)
                if args.context
                else active
            )
            api = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=args.kubeconfig, context=args.context
            )
        except (config.ConfigException, OSError, StopIteration) as exc:
            raise ConfigurationError(f"cannot load the kubeconfig: {exc}") from None
        context = (chosen or {}).get("context") or {}
        self.user = str(context.get("user") or "unknown")
        self.namespace = (
            args.command_namespace or args.namespace or context.get("namespace") or "default"
        )
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def _call(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call(*args, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                raise LeaseboxError(f"{what} does not exist") from None
            reason = (json.loads(exc.body or "{}") or {}).get("message") or exc.reason
            raise LeaseboxError(f"{what}: the API refused ({exc.status}): {reason}") from None
        except HTTPError as exc:
            raise LeaseboxError(f"{what}: the API is unreachable ({type(exc).__name__})") from None

    def pool(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self._call(
            f"OutboxWorkerPool {self.namespace}/{name}",
            self.custom.get_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURAL, name,
        )  # fmt: skip
        return found

    def set_paused(self, name: str, paused: bool) -> None:
        self._call(
            f"OutboxWorkerPool {self.namespace}/{name}",
            self.custom.patch_namespaced_custom_object,
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": {"paused": paused}},
        )  # fmt: skip

    def pods(self, selector: str) -> list[dict[str, Any]]:
        found = self._call(
            "the pool's pods", self.core.list_namespaced_pod, self.namespace,
            label_selector=selector,
        )  # fmt: skip
        return [self.core.api_client.sanitize_for_serialization(p) for p in found.items]

    def events(self, name: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={name},involvedObject.kind=OutboxWorkerPool"
        found = self._call(
            "the pool's Events", self.core.list_namespaced_event, self.namespace,
            field_selector=selector,
        )  # fmt: skip
        return [self.core.api_client.sanitize_for_serialization(e) for e in found.items]

    def secret_value(self, name: str, key: str) -> str:
        secret = self._call(
            f"Secret {self.namespace}/{name}", self.core.read_namespaced_secret, name,
            self.namespace,
        )  # fmt: skip
        data = secret.data or {}
        if key not in data:
            raise LeaseboxError(f"Secret {self.namespace}/{name} has no key {key!r}")
        return base64.b64decode(data[key]).decode()


def _database(pool: dict[str, Any]) -> tuple[str, str, str]:
    """(Secret name, key, schema) of the pool's database."""
    database = (pool.get("spec") or {}).get("database") or {}
    ref = database.get("secretRef") or {}
    return (
        str(ref.get("name", "")),
        str(ref.get("key") or "dsn"),
        database.get("schema", "leasebox"),
    )


def _dsn(cluster: Cluster, pool: dict[str, Any], explicit: str | None) -> str:
    if explicit:
        return explicit
    name, key, _ = _database(pool)
    return cluster.secret_value(name, key)


def run_status(cluster: Cluster, args: argparse.Namespace) -> int:
    from leasebox.cli.pool_status import WORKER_SELECTOR, PoolStatus, backlog_of, render_text
    from leasebox.db.connections import check_migrated, connect

    pool = cluster.pool(args.pool)
    state = PoolStatus(args.pool, cluster.namespace, pool)
    selector = (pool.get("status") or {}).get("selector") or WORKER_SELECTOR.format(name=args.pool)
    state.pods = cluster.pods(selector)
    state.events = cluster.events(args.pool)
    kinds = list((pool.get("spec") or {}).get("kinds") or [])
    schema = _database(pool)[2]
    try:
        with connect(_dsn(cluster, pool, args.dsn), autocommit=True, connect_timeout=5) as conn:
            check_migrated(conn, schema)
            state.backlog = backlog_of(conn, kinds, schema)
    except LeaseboxError as exc:
        state.database_problem = f"{exc}; pass --dsn to read it from here"
    if args.output == "json":
        print(json.dumps(state.as_dict(), indent=2))
    elif args.output == "yaml":
        import yaml

        print(yaml.safe_dump(state.as_dict(), sort_keys=False, allow_unicode=True), end="")
    else:
        print(render_text(state), end="")
    return 0


def run_pause(cluster: Cluster, args: argparse.Namespace, paused: bool) -> int:
    cluster.pool(args.pool)
    cluster.set_paused(args.pool, paused)
    if paused:
        print(
            f"{RESOURCE}/{args.pool} paused: the operator scales its workers to 0 and holds "
            "them there; nothing is deleted"
        )
    else:
        print(f"{RESOURCE}/{args.pool} resumed: its scaling mode sizes it again")
    return 0


def run_redrive(cluster: Cluster, args: argparse.Namespace) -> int:
    from leasebox.cli.common import parse_duration
    from leasebox.db.connections import check_migrated, connect
    from leasebox.store.dead_letters import (
        DeadLetterFilter,
        count_dead_letters,
        requeue_dead_letters,
    )

    pool = cluster.pool(args.pool)
    kinds = tuple((pool.get("spec") or {}).get("kinds") or ())
    schema = _database(pool)[2]
    selection = DeadLetterFilter(
        kinds=kinds,
        reason=args.reason,
        error_class=args.error_class,
        newer_than_seconds=parse_duration(args.newer_than) if args.newer_than else None,
        older_than_seconds=parse_duration(args.older_than) if args.older_than else None,
    )
    with connect(_dsn(cluster, pool, args.dsn)) as conn:
        check_migrated(conn, schema)
        if args.dry_run:
            count = count_dead_letters(conn, selection, schema=schema)
            print(f"would requeue {count} dead letters of {', '.join(kinds)} (dry run)")
            return 0
        ids = requeue_dead_letters(conn, selection, schema=schema)
        _audit(conn, schema, cluster.user, args, len(ids))
    print(f"requeued {len(ids)} dead letters of {', '.join(kinds)} in pool {args.pool}")
    return 0


def _audit(conn: Any, schema: str, user: str, args: argparse.Namespace, count: int) -> None:
    """The redrive in the audit trail, where the schema has one (migration 0008)."""
    from leasebox.web.actions import record

    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".audit',)).fetchone()
    if not row or not row[0]:
        return
    chosen = {"pool": args.pool}
    for name in ("reason", "error_class", "newer_than", "older_than"):
        if getattr(args, name):
            chosen[name] = getattr(args, name)
    record(
        conn,
        actor=f"kubectl:{user}",
        action="redrive",
        outcome="done",
        selection=chosen,
        affected=count,
        schema=schema,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cluster = Cluster(args)
        if args.command == "status":
            return run_status(cluster, args)
        if args.command in ("pause", "resume"):
            return run_pause(cluster, args, args.command == "pause")
        return run_redrive(cluster, args)
    except ModuleNotFoundError as exc:
        print(
            f"kubectl leasebox: error: {exc.name} is missing: pip install 'leasebox[operator]'",
            file=sys.stderr,
        )
        return 2
    except LeaseboxError as exc:
        print(f"kubectl leasebox: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
