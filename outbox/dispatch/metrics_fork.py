"""The function Dramatiq runs in the metrics fork process (``MetricsExposition`` adds it).

Dramatiq imports this module in the fork process after it set up that process's logging and
before it logs that the fork is ready, so ``OUTBOX_LOG_FORMAT`` is applied here, at import: a
spawned fork process does not inherit the launcher's set-up.
"""

from outbox.logs import apply_log_format
from outbox.metrics import serve_metrics_fork

apply_log_format()


def serve_metrics() -> int:
    """Serves every worker process's metrics on ``$OUTBOX_METRICS_HOST:$OUTBOX_METRICS_PORT``."""
    return serve_metrics_fork()
