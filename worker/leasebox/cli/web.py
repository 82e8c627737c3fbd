"""`leasebox web`: serve the dashboard (overview, dead letters, traces, audit trail).

Flags have `LEASEBOX_WEB_*` variables where a Deployment sets them; tokens and the CSRF key
come only from the environment (a Secret), never from a flag. Authentication off (`--auth
none`, the default) is refused unless the server listens on loopback.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from leasebox.cli.common import add_database_options, parse_duration


def register(subparsers: Any) -> None:
    env = os.environ.get
    web = subparsers.add_parser(
        "web",
        help="serve the dashboard: overview, dead letters, traces, audit trail",
        description="A server-rendered dashboard of the outbox: every kind's backlog against "
        "its SLA with its send and failure rates and the alert conditions that hold, the dead "
        "letters with filters, each message's story (as `leasebox trace` tells it), and the "
        "audit trail. Read-only unless --allow-actions; requeue and purge then need the "
        "operator role and are audited. Tokens come from LEASEBOX_WEB_TOKEN (viewer) and "
        "LEASEBOX_WEB_OPERATOR_TOKEN (operator); LEASEBOX_WEB_SECRET keys the CSRF tokens "
        "(random per process when unset).",
    )
    add_database_options(web)
    web.add_argument(
        "--host",
        default=env("LEASEBOX_WEB_HOST", "127.0.0.1"),
        help="address to listen on (default: 127.0.0.1) [LEASEBOX_WEB_HOST]",
    )
    web.add_argument(
        "--port",
        type=int,
        default=int(env("LEASEBOX_WEB_PORT", "8080")),
        help="port to listen on (default: 8080) [LEASEBOX_WEB_PORT]",
    )
    web.add_argument(
        "--auth",
        choices=("none", "token", "proxy"),
        default=env("LEASEBOX_WEB_AUTH", "none"),
        help="none (loopback only), token (bearer tokens from the environment) or proxy "
        "(user and groups headers of an authenticating proxy) (default: none) "
        "[LEASEBOX_WEB_AUTH]",
    )
    web.add_argument(
        "--user-header",
        default=env("LEASEBOX_WEB_USER_HEADER", "X-Forwarded-User"),
        help="with --auth proxy: the header naming the user (default: X-Forwarded-User) "
        "[LEASEBOX_WEB_USER_HEADER]",
    )
    web.add_argument(
        "--groups-header",
        default=env("LEASEBOX_WEB_GROUPS_HEADER", "X-Forwarded-Groups"),
        help="with --auth proxy: the header listing the user's groups, comma-separated "
        "(default: X-Forwarded-Groups) [LEASEBOX_WEB_GROUPS_HEADER]",
    )
    web.add_argument(
        "--operator-group",
        action="append",
        default=[g for g in env("LEASEBOX_WEB_OPERATOR_GROUPS", "").split(",") if g.strip()],
        metavar="GROUP",
        help="with --auth proxy: members of this group have the operator role (repeatable) "
        "[LEASEBOX_WEB_OPERATOR_GROUPS, comma-separated]",
    )
    web.add_argument(
        "--allow-actions",
        action="store_true",
        default=env("LEASEBOX_WEB_ALLOW_ACTIONS", "").lower() in ("1", "true", "yes"),
        help="allow operators to requeue and purge (default: read-only) "
        "[LEASEBOX_WEB_ALLOW_ACTIONS]",
    )
    web.add_argument(
        "--sla",
        action="append",
        default=[],
        metavar="[KIND=]DURATION",
        help="the SLA of the oldest pending message: for every kind, or KIND=DURATION for one "
        "(repeatable; default: 60s) [LEASEBOX_WEB_SLA, comma-separated]",
    )
    web.add_argument(
        "--window",
        default=env("LEASEBOX_WEB_WINDOW", "5m"),
        metavar="DURATION",
        help="the window of the send and failure rates (default: 5m) [LEASEBOX_WEB_WINDOW]",
    )
    web.set_defaults(func=run_web)


def settings_of(args: argparse.Namespace, environ: Any = None) -> Any:
    """`WebSettings` from the flags and the environment; `ConfigurationError` when unsafe."""
    from leasebox.db.connections import resolve_dsn
    from leasebox.errors import ConfigurationError
    from leasebox.web.settings import DEFAULT_SLA_SECONDS, WebSettings, tokens_from

    environ = os.environ if environ is None else environ
    default_sla, per_kind = DEFAULT_SLA_SECONDS, {}
    given = args.sla or [s for s in environ.get("LEASEBOX_WEB_SLA", "").split(",") if s.strip()]
    for item in given:
        kind, equals, text = item.strip().rpartition("=")
        if equals and not kind:
            raise ConfigurationError(f"--sla {item!r}: name the kind before '='")
        if kind:
            per_kind[kind] = parse_duration(text)
        else:
            default_sla = parse_duration(text)
    if not 0 < args.port <= 65535:
        raise ConfigurationError(f"--port must be 1 to 65535, got {args.port}")
    found = tokens_from(environ)
    secret = found["secret"]
    extra = {"secret": secret.encode()} if secret else {}
    return WebSettings(
        dsn=resolve_dsn(args.dsn, environ),
        schema=args.schema,
        host=args.host,
        port=args.port,
        auth=args.auth,
        user_header=args.user_header,
        groups_header=args.groups_header,
        operator_groups=tuple(g.strip() for g in args.operator_group if g.strip()),
        allow_actions=args.allow_actions,
        sla_seconds=default_sla,
        kind_sla_seconds=per_kind,
        window_seconds=parse_duration(args.window),
        viewer_token=found["viewer_token"],
        operator_token=found["operator_token"],
        **extra,
    ).check()


def run_web(args: argparse.Namespace) -> int:
    from leasebox.web.serving import serve

    settings = settings_of(args)
    return serve(settings)
