"""`manage.py leasebox_migrate`: create or upgrade leasebox's tables in a Django database.

`manage.py migrate` applies them too (the app's migration calls the same function); this
command exists for upgrades between Django migrations and for the schema option, and it is
safe to run from many pods at once (leasebox's migrations take an advisory lock).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from leasebox.django.schema import apply_schema
from leasebox.errors import LeaseboxError


class Command(BaseCommand):
    help = "Create or upgrade the leasebox outbox tables (safe to run concurrently)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--database", help="the connection alias (default: LEASEBOX['DATABASE'] or default)"
        )
        parser.add_argument(
            "--schema", help="the schema of the tables (default: LEASEBOX['SCHEMA'] or leasebox)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            applied = apply_schema(options.get("database"), options.get("schema"))
        except LeaseboxError as exc:
            raise CommandError(str(exc)) from None
        if applied:
            for migration in applied:
                self.stdout.write(
                    f"applied leasebox migration {migration.version:04d} {migration.name}"
                )
        else:
            self.stdout.write("leasebox schema is up to date")
