# The outbox's processes (migrate, claimer, worker, dashboard) for docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY outbox ./outbox
COPY workers ./workers
COPY migrations ./migrations
RUN pip install --no-cache-dir '.[embedded,celery]' \
 && pip install --no-cache-dir --no-deps 'dramatiq-dashboard==0.4.0'
ENV PYTHONUNBUFFERED=1
USER nobody
CMD ["outbox", "--help"]
