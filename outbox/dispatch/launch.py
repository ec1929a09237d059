"""``python -m outbox.dispatch.launch ARGS`` is ``dramatiq ARGS`` with the outbox's log format
(``OUTBOX_LOG_FORMAT``) in the Dramatiq master and the processes it forks: Dramatiq sets up
their logging itself, so each setup is followed by ``apply_log_format``. ``outbox worker``
runs this; a spawned worker process applies the format when it imports the worker entry.

A reload (SIGHUP to the master, or a change ``--watch`` saw) makes Dramatiq's master stop its
processes and exec its own command line again, ``sys.argv`` as it is. Started with ``-m``, that
is this module's path as a script, which is not executable: the master would die of a
PermissionError with its pool stopped. ``sys.argv`` is therefore the interpreter and ``-m`` with
this module, so that the reload starts the same pool again.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from dramatiq import cli

from outbox.logs import apply_log_format

#: Dramatiq's logging set-ups: the master's, a worker process's and a fork process's.
_SETUPS = ("setup_parent_logging", "setup_worker_logging", "setup_fork_logging")


def _then_apply_format(setup: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(setup)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        logger = setup(*args, **kwargs)
        apply_log_format()
        return logger

    return wrapped


#: The module ``-m`` runs (``__name__`` is ``__main__`` then).
MODULE = "outbox.dispatch.launch"


def main() -> int:
    args = cli.make_argument_parser().parse_args(sys.argv[1:])
    sys.argv = [sys.executable, "-m", MODULE, *sys.argv[1:]]
    for name in _SETUPS:
        setup = getattr(cli, name, None)
        if setup is None:
            # A Dramatiq without this hook: its lines stay text until the entry module runs.
            continue
        setattr(cli, name, _then_apply_format(setup))
    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
