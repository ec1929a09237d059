"""``manage.py outbox_migrate``: the outbox's tables in the project's database, and the
project's kinds declared (what ``outbox migrate APP`` does, on Django's settings)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from outbox.django.conf import get_outbox


class Command(BaseCommand):
    help = "Apply the outbox's migrations and declare the project's kinds (settings.OUTBOX)."

    def handle(self, *args: Any, **options: Any) -> None:
        outbox = get_outbox()
        report = outbox.migrate()
        applied = ", ".join(report.applied) or "nothing (up to date)"
        declared = ", ".join(report.kinds_declared) or "none"
        self.stdout.write(f"outbox schema {outbox.schema}: applied {applied}")
        self.stdout.write(f"kinds declared or changed: {declared}")
