"""`leasebox feedback serve`: the mail services' webhook receivers as an HTTP server.

The services and their secrets come from `LEASEBOX_FEEDBACK_*` variables
(`leasebox.feedback.receiver.Receivers.from_env`); a service without them answers 404. The
server is uvicorn running `leasebox.feedback.asgi.FeedbackApp` with its `/metrics`.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from leasebox.cli.common import add_database_options, database
from leasebox.errors import ConfigurationError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "feedback",
        help="receive the mail services' events (bounces, complaints, deliveries)",
        description="Receive the webhooks of SES (through SNS), SendGrid, Postmark, Mailgun "
        "and Resend: each checked as its service signs it, stored once, feeding the "
        "suppression list and the reputation metrics.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    serve = actions.add_parser(
        "serve",
        help="serve POST /<service> (ses, sendgrid, postmark, mailgun, resend), /metrics",
        description="Secrets from LEASEBOX_FEEDBACK_SES_TOPIC_ARNS, _SENDGRID_PUBLIC_KEYS, "
        "_POSTMARK_CREDENTIALS (user:password), _MAILGUN_SIGNING_KEYS, _RESEND_SECRETS "
        "(comma-separated, for rotation); rules from _HARD_BOUNCE_DAYS (365), "
        "_SOFT_BOUNCE_LIMIT (3), _SOFT_BOUNCE_WINDOW_HOURS (72), _SOFT_BOUNCE_DAYS (3), "
        "_PROVIDER_DAYS (30).",
    )
    add_database_options(serve)
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")  # noqa: S104
    serve.add_argument("--port", type=int, default=9110, help="port (default: 9110)")
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from leasebox.db.connections import check_migrated, connect
    from leasebox.feedback.asgi import FeedbackApp
    from leasebox.feedback.receiver import Receivers

    try:
        receivers = Receivers.from_env()
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if not receivers.served:
        raise ConfigurationError(
            "no service to receive: set LEASEBOX_FEEDBACK_SES_TOPIC_ARNS, "
            "_SENDGRID_PUBLIC_KEYS, _POSTMARK_CREDENTIALS, _MAILGUN_SIGNING_KEYS or "
            "_RESEND_SECRETS"
        )
    db = database(args)
    with connect(db.dsn) as conn:
        check_migrated(conn, db.schema)
    app = FeedbackApp(receivers, dsn=db.dsn, schema=db.schema, serve_metrics=True)
    logging.getLogger("leasebox.feedback").info(
        "receiving %s on %s:%d", ", ".join(receivers.served), args.host, args.port
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", lifespan="on")
    return 0
