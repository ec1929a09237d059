"""The benchmarks' CPU meter: a process that ends between its two readings is left out, never
counted against the others (a meter of a pool's tree, or of every PostgreSQL backend, saw
negative CPU when a backend of another client exited)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.cpu import CpuMeter, used_between

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")


def _burner(seconds: float) -> str:
    """A child that uses ``seconds`` of CPU, says so, and ends when told to."""
    return f"""
import sys, time
from pathlib import Path
start = time.process_time()
while time.process_time() - start < {seconds}:
    pass
Path(sys.argv[1], "ready").write_text("")
while not Path(sys.argv[1], "go").exists():
    time.sleep(0.01)
"""


CHILD = _burner(0.3)
#: A parent that starts the child, waits for it, then idles until it is killed.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
child.wait()
time.sleep(60)
"""


def test_a_child_that_ends_between_the_readings_takes_nothing_from_its_tree(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(tmp_path)])
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        meter = CpuMeter(tree=parent.pid)
        meter.start()
        (tmp_path / "go").write_text("")
        while len(_tree(parent.pid)) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        meter.stop()
    finally:
        parent.kill()
        parent.wait()
    used = meter.used["tree"]
    assert used is not None
    assert 0 <= used < 0.3


def _tree(root: int) -> set[int]:
    from benchmarks.cpu import tree_cpu_seconds

    return set(tree_cpu_seconds(root) or {})


@given(
    st.dictionaries(st.integers(1, 50), st.floats(0, 1e4)),
    st.dictionaries(st.integers(1, 50), st.floats(0, 1e4)),
)
def test_cpu_used_between_two_readings_is_never_negative(then, grown):
    # A process alive at both readings used at least as much at the second.
    now = {pid: then.get(pid, 0.0) + more for pid, more in grown.items()}
    used = used_between(then, now)
    assert used >= 0
    assert used == pytest.approx(sum(grown.values()))


#: A child that uses about 3 ms of CPU.
BRIEF = _burner(0.003)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads each thread's schedstat")
def test_a_services_cpu_is_read_finer_than_a_clock_tick(tmp_path):
    """A service's backend may use a few milliseconds in a whole quick scenario: read in clock
    ticks (10 ms) that was often nothing at all."""
    from benchmarks.cpu import named_cpu_seconds

    child = subprocess.Popen([sys.executable, "-c", BRIEF, str(tmp_path)])
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        command = Path(f"/proc/{child.pid}/comm").read_text().strip()
        seconds = (named_cpu_seconds(command) or {}).get(child.pid)
    finally:
        (tmp_path / "go").write_text("")
        child.wait()
    assert seconds is not None and seconds > 0.003
    ticks = seconds * os.sysconf("SC_CLK_TCK")
    assert abs(ticks - round(ticks)) > 1e-6, seconds
