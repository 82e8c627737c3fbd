"""`leasebox operator` and `leasebox crd`: the operator's entry points.

The operator lives in the `leasebox_operator` package, which `leasebox` itself never
imports; this module (part of the composition root) loads it only when one of these
commands runs, so `leasebox --help` and the worker never pay for kopf.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from leasebox.cli.common import gc_thresholds
from leasebox.config import AUTO, EVENT_LOOP, EVENT_LOOPS

DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
# The operator's young collections come every 50,000 allocations instead of 700. At hundreds
# of pools it holds several hundred thousand long-lived objects, and each poll's objects live
# across its round trips: with the default thresholds enough of them outlived two young
# collections to start a full collection every 16 s or so (0.3 s each), and garbage
# collection took a fifth of the operator's CPU (bench/README.md). Collected this seldom, a
# poll's objects are gone before they are looked at.
GC_THRESHOLDS = (50_000, 20, 20)


def register(subparsers: Any) -> None:
    operator = subparsers.add_parser(
        "operator",
        help="run the OutboxWorkerPool operator (kopf)",
        description="Reconcile OutboxWorkerPool resources: own each pool's worker Deployment, "
        "poll its backlog and scale it to meet the pool's SLA.",
    )
    scope = operator.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="watch this namespace (repeatable; kopf glob patterns allowed)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="watch every namespace (the default when no --namespace is given)",
    )
    peering = operator.add_mutually_exclusive_group()
    peering.add_argument(
        "--standalone",
        action="store_true",
        help="run without peering (only one operator instance may run)",
    )
    peering.add_argument(
        "--priority",
        type=_priority,
        default=0,
        help="peering priority; the highest-priority instance works, others wait; 'random' "
        "draws one at start, so replicas of one Deployment rank themselves (default: 0)",
    )
    operator.add_argument(
        "--peering-name", default="leasebox", help="KopfPeering object name (default: leasebox)"
    )
    operator.add_argument(
        "--liveness",
        default=DEFAULT_LIVENESS,
        metavar="URL",
        help=f"liveness endpoint, or 'none' to disable (default: {DEFAULT_LIVENESS})",
    )
    operator.add_argument(
        "--metrics-port",
        type=int,
        default=9109,
        help="port of the operator's Prometheus metrics, 0 to disable (default: 9109)",
    )
    operator.add_argument(
        "--worker-image",
        help="image of worker pods whose pool names none "
        "(default: $LEASEBOX_OPERATOR_WORKER_IMAGE, else this version's image)",
    )
    operator.add_argument(
        "--log-format",
        choices=("json", "plain", "full"),
        default="json",
        help="log format (default: json)",
    )
    operator.add_argument(
        "--event-loop",
        type=_event_loop,
        default=AUTO,
        metavar="{" + ",".join(EVENT_LOOPS) + "}",
        help=f"{EVENT_LOOP.help}, as kopf's own CLI chooses it (default: {AUTO})",
    )
    operator.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    operator.set_defaults(func=run_operator)

    crd = subparsers.add_parser(
        "crd",
        help="print the OutboxWorkerPool CustomResourceDefinition as YAML",
        description="Print the CRD generated from the operator's models (kubectl apply -f -).",
    )
    crd.set_defaults(func=run_crd)


def _event_loop(value: str) -> str:
    try:
        return EVENT_LOOP.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: choose {exc}") from None


def _priority(value: str) -> int:
    """A peering priority, or `random`: distinct replicas never share one (kopf pauses both)."""
    if value.strip().lower() == "random":
        import secrets

        return 1 + secrets.randbelow(2**31 - 2)
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number or 'random'") from None


def operator_settings(args: argparse.Namespace) -> Any:
    """The `OperatorSettings` the flags describe (environment fills what flags leave out)."""
    from dataclasses import replace

    from leasebox_operator.settings import OperatorSettings

    base = OperatorSettings.from_environ()
    liveness = None if args.liveness.strip().lower() in ("", "none", "off") else args.liveness
    return replace(
        base,
        namespaces=tuple(args.namespace),
        clusterwide=not args.namespace,
        standalone=args.standalone,
        priority=args.priority,
        peering_name=args.peering_name,
        liveness_endpoint=liveness,
        metrics_port=args.metrics_port,
        log_format=args.log_format,
        verbose=args.verbose,
        worker_image=args.worker_image or base.worker_image,
    )


def run_operator(args: argparse.Namespace) -> int:
    import kopf

    import leasebox_operator.handlers  # noqa: F401 (registers the handlers)
    from leasebox.runtime.event_loops import run
    from leasebox_operator.logs import configure_logging

    settings = operator_settings(args)
    configure_logging(settings.log_format, verbose=settings.verbose)
    # kopf's own CLI runs on uvloop when it is installed; `kopf.run` does not choose.
    with gc_thresholds(GC_THRESHOLDS), contextlib.suppress(asyncio.CancelledError):
        run(
            lambda: kopf.operator(
                standalone=settings.standalone,
                priority=settings.priority,
                # Naming a peering makes it mandatory in kopf: only when peering is wanted.
                peering_name=None if settings.standalone else settings.peering_name,
                liveness_endpoint=settings.liveness_endpoint,
                clusterwide=settings.clusterwide,
                namespaces=settings.namespaces,
                memo=kopf.Memo(settings=settings),
            ),
            args.event_loop,
        )
    return 0


def run_crd(args: argparse.Namespace) -> int:
    from leasebox_operator.crd import crd_yaml

    print(crd_yaml(), end="")
    return 0
