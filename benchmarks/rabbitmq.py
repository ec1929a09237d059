"""``rabbitmq``: the Dramatiq scenarios on RabbitMQ (``OUTBOX_BENCH_AMQP_URL``) instead of
Redis, each against raw Dramatiq on the same RabbitMQ, built the same way (``broker_from_url``:
publisher confirms on, so a send returns once RabbitMQ holds the message, as the claimer's push
does).

- ``dramatiq-raw-rabbitmq``: raw Dramatiq's throughput through RabbitMQ and its send -> actor
  start latency at 100 messages/s (the ceilings of the two below);
- ``e2e-rabbitmq``: ``e2e`` through RabbitMQ, paired rounds (a fresh raw throughput, then e2e),
  ``ratio`` the median round's;
- ``latency-rabbitmq``: ``latency`` through RabbitMQ, ``ratio`` its p50 over the raw pool's.

A RabbitMQ consumer has its messages pushed to it (no poll, no wake list), so the raw pool's
``worker_timeout`` matters less there than on Redis; both pools keep the same settings as on
Redis. The run's queues (the raw actor's and the no-op kind's, each with its delay and
dead-letter queue) are deleted before and after each pool.
"""

from __future__ import annotations

from benchmarks import dramatiq_raw, e2e, latency
from benchmarks.common import AMQP_URL, Result, Scale


def run(scale: Scale) -> list[Result]:
    raw = dramatiq_raw.measure(scale, AMQP_URL)
    n = dramatiq_raw.raw_n(scale)
    runs: list[e2e.Run] = []
    for index in range(scale.n(*e2e.ROUNDS)):
        ceiling = raw.per_s if index == 0 else dramatiq_raw.throughput(n, AMQP_URL).per_s
        runs.append(e2e.run_once(n, ceiling, many=True, broker_url=AMQP_URL))
    paced_n = scale.n(300, 3_000, floor=20)
    latencies, measured = latency.latencies_of(paced_n, "latency_amqp", OUTBOX_BROKER_URL=AMQP_URL)
    ceiling_row = dramatiq_raw.result(raw, "dramatiq-raw-rabbitmq")
    e2e_row = e2e.result(
        "e2e-rabbitmq", runs, f"enqueue_many, {e2e.PER_TX} a transaction", "dramatiq-raw-rabbitmq"
    )
    latency_row = latency.result(
        "latency-rabbitmq",
        latencies,
        measured,
        raw.latencies,
        "dramatiq-raw-rabbitmq-latency-p50",
    )
    for row in (ceiling_row, e2e_row, latency_row):
        row.extra["broker"] = "rabbitmq"
    return [ceiling_row, e2e_row, latency_row]
