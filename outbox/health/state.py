"""A process's health as its loops report it, and the verdict a probe draws from it.

A claimer or worker process keeps one ``ProcessHealth``. Each of its loops (a *part*: the
claimer's round loop, one consumer thread per queue in a worker process) pokes it as it goes:

- ``ok(part)``: the loop went round and did its job (a claim round committed and its pushes
  went; a consumer fetched from the broker, a message or an idle poll);
- ``trouble(part, reason)``: the loop went round but could not do its job (PostgreSQL or the
  broker does not answer);
- ``beat(part)``: the loop went round, its readiness unchanged.

From these, at any instant:

- **live**: every part went round within ``stale`` seconds (the loops are not wedged: a
  process that is stopped, deadlocked or stuck in a call without a timeout is not live);
- **ready**: live, and every part did its job within ``stale`` seconds with no trouble since.

A process still starting (waiting for PostgreSQL or the broker, each wait bounded and logged)
is live and not ready. The state can be written to a file (``HealthFile``) that a probe in
another process reads, and served over HTTP (``outbox.health.server``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.config import Settings

#: At most this often (seconds) a poke rewrites the health file, unless readiness changed.
WRITE_EVERY = 1.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a probe answers: live, ready, and why not in one line each."""

    live: bool
    ready: bool
    reasons: tuple[str, ...] = ()

    def line(self) -> str:
        state = "ready" if self.ready else "live, not ready" if self.live else "not live"
        return state + (f": {'; '.join(self.reasons)}" if self.reasons else "")


@dataclass
class Part:
    """One loop's last round (``beat_at``), last success (``ok_at``) and trouble, if any."""

    beat_at: float
    ok_at: float | None = None
    problem: str | None = None


def judge(snapshot: dict[str, Any], now: float | None = None) -> Verdict:
    """The verdict on a ``ProcessHealth.snapshot()`` (or the JSON of one) at ``now`` (epoch s)."""
    now = time.time() if now is None else now
    stale = float(snapshot["stale"])
    parts: dict[str, dict[str, Any]] = snapshot["parts"]
    if not parts:
        return Verdict(True, False, ("starting",))
    live, ready, reasons = True, True, []
    for name, part in sorted(parts.items()):
        quiet = now - float(part["beat_at"])
        if quiet > stale:
            live = ready = False
            reasons.append(f"{name}: no progress for {quiet:.0f}s (limit {stale:g}s)")
            continue
        if part.get("problem"):
            ready = False
            reasons.append(f"{name}: {part['problem']}")
        elif part.get("ok_at") is None:
            ready = False
            reasons.append(f"{name}: not done its job yet")
        elif now - float(part["ok_at"]) > stale:
            ready = False
            reasons.append(f"{name}: no success for {now - float(part['ok_at']):.0f}s")
    return Verdict(live, ready, tuple(reasons))


@dataclass
class ProcessHealth:
    """The health of one process (``role``: claimer or worker), poked by its loops from any
    thread; ``file`` (if any) is rewritten at most every ``WRITE_EVERY`` seconds."""

    role: str
    stale: float = 60.0
    file: HealthFile | None = None
    parts: dict[str, Part] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _written_at: float = 0.0
    _written_ready: bool | None = None

    def beat(self, part: str) -> None:
        self._poke(part, None, ok=False)

    def ok(self, part: str) -> None:
        self._poke(part, None, ok=True)

    def trouble(self, part: str, reason: str) -> None:
        self._poke(part, reason, ok=False)

    def _poke(self, name: str, problem: str | None, *, ok: bool) -> None:
        now = time.time()
        with self._lock:
            part = self.parts.get(name)
            if part is None:
                part = self.parts[name] = Part(beat_at=now)
            part.beat_at = now
            if ok:
                part.ok_at, part.problem = now, None
            elif problem is not None:
                part.problem = problem
            if self.file is None:
                return
            ready = judge(self._snapshot(), now).ready
            if now - self._written_at < WRITE_EVERY and ready == self._written_ready:
                return
            self._written_at, self._written_ready = now, ready
            # Written under the lock: two threads writing at once shared the temporary file, and
            # the second one's replace found it gone (which crashed a Dramatiq consumer thread).
            self.file.write(self._snapshot())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "pid": os.getpid(),
            "stale": self.stale,
            "started_at": self.started_at,
            "parts": {
                name: {"beat_at": p.beat_at, "ok_at": p.ok_at, "problem": p.problem}
                for name, p in self.parts.items()
            },
        }

    def verdict(self) -> Verdict:
        return judge(self.snapshot())

    def publish(self) -> None:
        """Writes the file now (at start, so a probe sees a starting process)."""
        if self.file is not None:
            with self._lock:
                self.file.write(self._snapshot())

    def close(self) -> None:
        """At a clean stop: the file goes (a probe then finds no process of the role)."""
        if self.file is not None:
            self.file.remove()


@dataclass(frozen=True)
class HealthFile:
    """``<directory>/<role>-<pid>.json``, replaced atomically on each write, so a probe never
    reads half a file; its mtime is the last write, which only a live loop makes."""

    directory: Path
    role: str
    pid: int = field(default_factory=os.getpid)

    @property
    def path(self) -> Path:
        return self.directory / f"{self.role}-{self.pid}.json"

    def write(self, snapshot: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(snapshot))
        os.replace(partial, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def process_health(role: str, settings: Settings) -> ProcessHealth:
    """This process's health for ``role``, with a file when ``health_dir`` is set."""
    directory = settings.health_dir
    file = HealthFile(Path(directory), role) if directory else None
    return ProcessHealth(role, settings.health_stale.total_seconds(), file)
