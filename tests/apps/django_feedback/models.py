from __future__ import annotations

from django.db import models


class Feedback(models.Model):
    text = models.TextField()

    class Meta:
        app_label = "django_feedback"
