"""``memory``: the resident size (RSS, ``VmRSS`` in ``/proc/<pid>/status``) of a real ``outbox
claimer`` and of a worker process of a real ``outbox worker`` pool (one process), idle and then
with the pool's concurrency in flight, held there by a slow provider (each call waits a few
seconds after its fence). The actions are enqueued while their kind is paused and resumed once
both processes were sampled idle, so that the whole run comes into flight at once.

Two runs on fresh processes: payloads of a few bytes, then of 1 MB (``OUTBOX_MAX_PAYLOAD_BYTES``
raised for the run). One row per process and payload size: ``n`` is the actions in flight at the
sample with the most of them, ``ratio`` its RSS over the same process's idle RSS, and
``kb_per_in_flight`` the growth over idle an action in flight. The claimer claims and pushes
``(id, epoch)`` pairs only, so its rows should not move with the payload size; a worker holds each
payload it took until the attempt ends.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.common import (
    DATABASE_URL,
    NOOP,
    Result,
    Scale,
    bench_schema,
    ended_count,
    migrated_outbox,
    ms,
    percentile,
)
from benchmarks.rig import ACTIONS_PER_MESSAGE, rig
from outbox import ActionRequest, Outbox
from outbox.operator import pause, resume

#: The payload sizes of the two runs, bytes of compact JSON (about).
PAYLOADS = {"small": 0, "1mb": 1_000_000}
#: Actions in flight: the pool's concurrency, one process of ``threads`` x 8 (a quick and a
#: default run).
IN_FLIGHT = (128, 256)
#: How long a provider call holds its action (the scenario samples while they wait).
HOLD_S = (5.0, 8.0)
#: Actions an enqueue transaction, so the enqueuing client never holds many 1 MB payloads.
PER_TX = 16
#: Seconds the started claimer and pool are left alone before their idle sample.
IDLE_SETTLE = 1.0
#: How often RSS and the in-flight count are sampled.
SAMPLE_EVERY = 0.05


def rss_kib(pid: int) -> int | None:
    """``VmRSS`` of a live process, in KiB (Linux); None elsewhere or once it exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def child_pids(parent: int) -> list[int]:
    """The live processes whose parent is ``parent`` (a ``dramatiq`` master's workers)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            children.append(int(entry.name))
    return sorted(children)


def _request(i: int, blob: int) -> ActionRequest:
    payload: dict[str, Any] = {"i": i}
    if blob:
        payload["blob"] = "x" * blob
    return ActionRequest(
        kind=NOOP.name,
        workspace_id="w",
        lane_key=f"lane-{i}",
        idempotency_key=f"memory-{i}",
        payload=payload,
    )


def _enqueue(outbox: Outbox, n: int, blob: int) -> None:
    """``n`` actions in transactions of ``PER_TX``."""
    with psycopg.connect(DATABASE_URL) as conn:
        for start in range(0, n, PER_TX):
            outbox.enqueue_many(
                conn, [_request(i, blob) for i in range(start, min(n, start + PER_TX))]
            )
            conn.commit()


def _taken(conn: psycopg.Connection[Any], schema: str) -> int:
    """Actions a worker took and has not finished: each has its payload in the worker."""
    row = conn.execute(
        f'SELECT count(*) FROM "{schema}".agent_action'
        " WHERE state = 'EXECUTING' AND taken_epoch = epoch"
    ).fetchone()
    return row[0] if row else 0


def _measure(scale: Scale, size: str, blob: int) -> list[Result]:
    in_flight = scale.n(*IN_FLIGHT, floor=ACTIONS_PER_MESSAGE * 2)
    threads = in_flight // ACTIONS_PER_MESSAGE
    hold = HOLD_S[0 if scale.quick else 1] * min(1.0, max(scale.factor, 0.25))
    settings = {
        "BENCH_PROVIDER_SECONDS": str(hold),
        "OUTBOX_IN_FLIGHT": str(in_flight),
        "OUTBOX_MAX_PAYLOAD_BYTES": str(blob + 1000),
    }
    name = f"memory_{size}"
    with bench_schema(name) as schema, rig(schema, **settings) as r:
        outbox = migrated_outbox(schema, max_payload_bytes=blob + 1000)
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            # Enqueued while the kind is paused, so that the idle sample comes before the first
            # claim and the whole run comes into flight at once (an enqueue of 1 MB payloads is
            # slower than a provider call).
            pause(watch, NOOP.name, actor="benchmark", schema=schema)
            _enqueue(outbox, in_flight, blob)
            workers = r.outbox_workers(processes=1, threads=threads)
            (worker,) = child_pids(workers.pid)
            claimer = r.claimer().pid
            time.sleep(IDLE_SETTLE)
            idle = {"claimer": rss_kib(claimer), "worker": rss_kib(worker)}
            peak = {"claimer": 0, "worker": 0}
            most, at_most = 0, dict(idle)
            started = time.time()
            resume(watch, NOOP.name, actor="benchmark", schema=schema)
            while ended_count(watch, schema) < in_flight:
                now = {"claimer": rss_kib(claimer), "worker": rss_kib(worker)}
                for process, kib in now.items():
                    peak[process] = max(peak[process], kib or 0)
                count = _taken(watch, schema)
                # The last sample at the most in flight: a take's rows reach the worker (and
                # are parsed) only after the statement that marked them taken.
                if count and count >= most:
                    most, at_most = count, now
                if time.time() - started > 120 + hold:
                    raise TimeoutError(f"memory: {size} actions not ended")
                time.sleep(SAMPLE_EVERY)
            rows = watch.execute(
                f'SELECT state, extract(epoch FROM ended_at)::float8 FROM "{schema}".agent_action'
            ).fetchall()
    if {state for state, _ in rows} != {"DONE"} or most == 0:
        raise AssertionError(f"memory: {size}: states {sorted({s for s, _ in rows})}, {most}")
    ends = sorted(end for _, end in rows)
    in_system = [end - started for end in ends]
    results = []
    for process in ("claimer", "worker"):
        rest, busy = idle[process], at_most[process]
        if rest is None or busy is None:
            raise AssertionError(f"memory: no RSS of the {process} (needs Linux /proc)")
        results.append(
            Result(
                scenario=f"memory-{process}-{size}",
                n=most,
                actions_per_s=round(in_flight / (ends[-1] - started), 1),
                p50_ms=ms(percentile(in_system, 50)),
                p99_ms=ms(percentile(in_system, 99)),
                ratio=round(busy / rest, 3),
                ratio_to=f"{process}-idle",
                extra={
                    "payload_bytes": blob,
                    "actions_per_s_is": "resume -> last DONE, the hold included",
                    "idle_mb": round(rest / 1024, 1),
                    "in_flight_mb": round(busy / 1024, 1),
                    "peak_mb": round(peak[process] / 1024, 1),
                    "kb_per_in_flight": round((busy - rest) / most, 1),
                    "in_flight_is": "actions taken by the worker and not finished, at the sample",
                    "threads": threads,
                    "hold_s": hold,
                    "latency_is": "resume -> DONE (enqueued while the kind was paused)",
                    "load_average_1m": round(os.getloadavg()[0], 2),
                },
            )
        )
    return results


def run(scale: Scale) -> list[Result]:
    results: list[Result] = []
    for size, blob in PAYLOADS.items():
        results.extend(_measure(scale, size, blob))
    return results
