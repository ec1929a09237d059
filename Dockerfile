# The outbox's processes (migrate, claimer, worker, dashboard, demo) in one image; the command
# chooses the role (docker-compose.yml). tests/test_ops_deploy.py checks what this file promises.
FROM python:3.11.14-slim-bookworm

# OUTBOX_HEALTH_DIR: where the claimer and each worker process keep the health file that
# `outbox health` reads.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OUTBOX_HEALTH_DIR=/tmp/outbox-health

# A user of its own with a fixed uid, so a volume's or a policy's uid is known in advance.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /app --shell /usr/sbin/nologin outbox

WORKDIR /app

# Dependencies first, in a layer of their own: it is rebuilt only when the lock changes, not on
# every source change. requirements-image.txt (`make lock`) pins every one with the hashes of its
# files; no embedded PostgreSQL, no test tools. The dashboard's queue view declares dramatiq<2 but
# works with dramatiq 2, hence its own line without dependencies.
COPY requirements-image.txt ./
RUN pip install --require-hashes --no-deps -r requirements-image.txt \
 && pip install --no-deps 'dramatiq-dashboard==0.4.0'

# Then the outbox itself, without touching the dependencies above (only its build backend,
# hatchling, is fetched for the build).
COPY pyproject.toml README.md ./
COPY outbox ./outbox
COPY workers ./workers
COPY migrations ./migrations
RUN pip install --no-deps .

USER outbox

# The claimer and the worker pool report their health (docs/operations.md, "Health"): this
# checks whichever of the two the container runs (compose names the role per service; a
# container running neither, such as the dashboard, sets its own check).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["outbox", "health"]

CMD ["outbox", "--help"]
