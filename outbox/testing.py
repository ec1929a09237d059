"""Helpers for the application's own tests: nothing runs on its own, ``drain`` runs it all."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from outbox import event_loop
from outbox._io import Operation, Statement
from outbox.errors import DrainDidNotSettle
from outbox.executor import Outcome
from outbox.maintenance import Maintenance
from outbox.outbox import Outbox
from outbox.queries import queries_for
from outbox.results import result_name
from outbox.rounds import run_until_idle
from outbox.store import ClaimedAction, Store


@dataclass
class DrainReport:
    """Every attempt ``drain`` ran, in order, and how many rounds it took."""

    outcomes: list[Outcome] = field(default_factory=list)
    rounds: int = 0

    def count(self) -> Counter[str]:
        """Attempts by result name: ``{"done": 3, "retry": 1}``."""
        return Counter(result_name(o.result) for o in self.outcomes)

    @property
    def attempts(self) -> int:
        return len(self.outcomes)


async def drain_async(
    outbox: Outbox, *, max_rounds: int = 1000, timeout: float = 60.0, concurrency: int = 1
) -> DrainReport:
    """Makes every waiting action due and runs the executor in-process until nothing is due.

    Retries and deferrals are made due again at once, and a down provider's hold of its kind
    ends at once, so a test sees an action's whole life in one call. Raises
    ``DrainDidNotSettle`` when actions are still due after ``max_rounds`` rounds or ``timeout``
    seconds (an adapter that defers forever, say). ``concurrency`` rounds overlap
    (``Outbox.run_until_idle``); each runs housekeeping and makes waiting actions due before
    its claim, and the report lists the rounds in the order they ended.
    """
    report = DrainReport()
    started = time.monotonic()
    async with outbox.store() as store:
        executor = outbox.executor(store)
        maintenance = Maintenance.for_drain(store, outbox.observers)

        async def claim() -> tuple[float, list[ClaimedAction]]:
            await maintenance.run_due()
            await make_due(store)
            return await outbox._claim(executor, None, None)

        def ended(outcomes: Sequence[Outcome]) -> None:
            report.outcomes.extend(outcomes)
            report.rounds += 1
            if report.rounds >= max_rounds or time.monotonic() - started > timeout:
                raise DrainDidNotSettle(
                    f"still running after {report.rounds} rounds and "
                    f"{time.monotonic() - started:.1f}s: {dict(report.count())}"
                )

        await run_until_idle(
            claim,
            lambda claim: outbox._run_claimed(executor, claim),
            ended,
            concurrency,
            claimed=lambda claim: bool(claim[1]),
        )
        return report


def make_due_operation(schema: str) -> Operation[None]:
    """Every admitted action that waits (a retry's backoff, a deferral) becomes due now, and
    every hold of a kind whose provider is down ends (``outbox.provider_outage``)."""
    yield Statement(queries_for(schema)["make_due"])


async def make_due(store: Store) -> None:
    """``make_due_operation`` on ``store``'s pool: a test need not wait out a backoff."""
    await store.run(make_due_operation(store.schema))


def drain(
    outbox: Outbox, *, max_rounds: int = 1000, timeout: float = 60.0, concurrency: int = 1
) -> DrainReport:
    """The sync twin of ``drain_async`` (runs its own event loop, the outbox's
    ``event_loop``)."""
    return event_loop.run(
        drain_async(outbox, max_rounds=max_rounds, timeout=timeout, concurrency=concurrency),
        outbox.settings.event_loop,
    )
