"""How the claimer tells a broker that restarted from one that did not (``RestartWatch``): a
run it has not seen before, read at most once an interval, never from a broker that cannot
say or does not answer. The restart itself, with a real Redis, is in test_dispatch_faults.py."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
import redis

from outbox.dispatch import broker_from_url
from outbox.dispatch.pushing import OffLoop, broker_identity
from outbox.dispatch.restart_watch import RestartWatch


@pytest.fixture
def off_loop() -> Iterator[OffLoop]:
    threads = OffLoop(timeout=2.0)
    yield threads
    threads.close()


def _runs(*runs: str | Exception | None) -> Callable[[], str | None]:
    answers = iter(runs)

    def identity() -> str | None:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return identity


async def test_only_a_run_not_seen_before_is_a_restart(off_loop: OffLoop) -> None:
    watch = RestartWatch(_runs("a", "a", "b", "b"), off_loop, every=0.0)
    assert [await watch.restarted() for _ in range(4)] == [False, False, True, False]


async def test_the_first_run_seen_is_no_restart(off_loop: OffLoop) -> None:
    watch = RestartWatch(_runs("b"), off_loop, every=0.0)
    assert await watch.restarted() is False
    assert watch.known == "b"


async def test_the_broker_is_read_once_an_interval_unless_asked_now(off_loop: OffLoop) -> None:
    reads: list[str] = []

    def identity() -> str:
        reads.append("read")
        return "a" if len(reads) < 3 else "b"

    watch = RestartWatch(identity, off_loop, every=60.0)
    assert await watch.restarted() is False
    assert await watch.restarted() is False
    assert len(reads) == 1, "a second look within the interval"
    assert await watch.restarted(now=True) is False
    assert await watch.restarted(now=True) is True
    assert len(reads) == 3


async def test_a_broker_that_cannot_say_or_fails_to_answer_is_no_restart(
    off_loop: OffLoop, caplog: pytest.LogCaptureFixture
) -> None:
    down = ConnectionError("Connection refused")
    watch = RestartWatch(_runs("a", None, down, down, "a", "c"), off_loop, every=0.0)
    with caplog.at_level(logging.WARNING, logger="outbox.claimer"):
        answers = [await watch.restarted() for _ in range(6)]
    assert answers == [False, False, False, False, False, True]
    failures = [r for r in caplog.records if "could not read which run" in r.getMessage()]
    assert len(failures) == 1, "one line for a run of failures"


def test_the_dramatiq_broker_identity_is_a_redis_run_and_none_on_rabbitmq(
    redis_url: str, rabbitmq_url: str
) -> None:
    run_id = redis.Redis.from_url(redis_url).info("server")["run_id"]
    assert broker_identity(broker_from_url(redis_url)) == run_id
    assert broker_identity(broker_from_url(rabbitmq_url)) is None
