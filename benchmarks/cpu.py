"""CPU seconds a process tree used, from ``/proc`` (Linux): on a 2-core machine the broker
scenarios are CPU-bound, so CPU per action says where a ratio goes. Elsewhere it reports None."""

from __future__ import annotations

import os
import time
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


def tree_cpu_seconds(root: int) -> dict[int, float] | None:
    """CPU seconds of ``root`` and every live descendant, by pid (children that exited are not
    seen); of this process alone when ``root`` is this process (its children are measured
    apart)."""
    if root == os.getpid():
        return {root: time.process_time()}
    if not Path("/proc").is_dir():
        return None
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                stats[int(entry.name)] = stat
    if root not in stats:
        return None
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, (parent, _) in stats.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {pid: stats[pid][1] for pid in tree}


def _threads_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a live process's threads, in nanoseconds' resolution (each thread's
    ``schedstat``), or None where the kernel keeps no schedstat. A service's backend may run a
    few milliseconds in all through a quick scenario: counted in clock ticks (``stat``, 10 ms),
    that was often none, and a quick run's PostgreSQL CPU read as 0."""
    total = 0.0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
    return total


def named_cpu_seconds(command: str) -> dict[int, float] | None:
    """CPU seconds of every live process whose command name starts with ``command`` (the
    services: ``postgres``, ``redis-server``), by pid; a backend that exits in between is not
    seen. Read from each thread's schedstat where the kernel keeps one (a thread that ended is
    not counted: the services' threads live as long as they do), else in clock ticks."""
    if not Path("/proc").is_dir():
        return None
    seconds: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if not (entry / "comm").read_text().startswith(command):
                continue
        except OSError:
            continue
        pid = int(entry.name)
        precise = _threads_cpu_seconds(pid)
        if precise is not None:
            seconds[pid] = precise
        elif (stat := _stat(pid)) is not None:
            seconds[pid] = stat[1]
    return seconds


def used_between(then: dict[int, float], now: dict[int, float]) -> float:
    """CPU seconds used between two readings by pid: each process alive at the second, less
    what it had used at the first (nothing for one that started since). A process that ended
    in between is not counted: a sum of the two readings' totals would count its whole life
    against the interval, and went negative when another client's backend exited."""
    return sum(max(0.0, used - then.get(pid, 0.0)) for pid, used in now.items())


#: The services every broker scenario shares the two cores with, by command name.
SERVICES = {"postgres": "postgres", "redis": "redis-server"}
#: The same with RabbitMQ (its Erlang VM), for the scenarios whose broker it is.
RABBITMQ_SERVICES = {**SERVICES, "rabbitmq": "beam.smp"}


class CpuMeter:
    """CPU seconds of some process trees, and of the local services (``SERVICES`` unless
    ``services`` names others), between ``start()`` and ``stop()``."""

    def __init__(self, services: dict[str, str] | None = None, **roots: int) -> None:
        self.roots = roots
        self.services = SERVICES if services is None else services
        self._start: dict[str, dict[int, float] | None] = {}
        self.used: dict[str, float | None] = {}

    def _read(self) -> dict[str, dict[int, float] | None]:
        seconds = {name: tree_cpu_seconds(pid) for name, pid in self.roots.items()}
        seconds.update({name: named_cpu_seconds(cmd) for name, cmd in self.services.items()})
        return seconds

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> None:
        for name, now in self._read().items():
            then = self._start.get(name)
            self.used[name] = None if now is None or then is None else used_between(then, now)

    def per_action_ms(self, n: int) -> dict[str, float | None]:
        """Each tree's and service's CPU ms an action, and their sum (``total``; None if any
        could not be read)."""
        row = {
            f"{name}_cpu_ms_per_action": None if used is None else round(used / n * 1000, 3)
            for name, used in self.used.items()
        }
        known = [used for used in self.used.values() if used is not None]
        complete = len(known) == len(self.used)
        row["total_cpu_ms_per_action"] = round(sum(known) / n * 1000, 3) if complete else None
        return row
