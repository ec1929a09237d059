"""The Django app config: ``INSTALLED_APPS = [..., "outbox.django"]``."""

from __future__ import annotations

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox.django"
    label = "outbox"
    verbose_name = "Outbox"
