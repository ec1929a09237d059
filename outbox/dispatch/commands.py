"""The ``outbox claimer`` and ``outbox worker`` subcommands (registered in ``outbox.cli``)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from outbox.cli_args import positive_int
from outbox.dispatch.actors import install
from outbox.dispatch.broker import broker_from_url
from outbox.dispatch.claimer import run_claimer
from outbox.dispatch.entry import APP_ENV
from outbox.dispatch.fabric import FABRICS, Fabric
from outbox.errors import ConfigurationError
from outbox.loader import load_app
from outbox.metrics import prepare_multiprocess_env
from outbox.outbox import Outbox

#: The module ``dramatiq`` imports in each worker process.
WORKER_MODULE = "outbox.dispatch.worker"
#: The module ``celery -A`` loads (its ``app``).
CELERY_WORKER_MODULE = "outbox.dispatch.celery_worker"
#: Runs ``dramatiq`` with the outbox's log format in every process it starts.
LAUNCHER_MODULE = "outbox.dispatch.launch"


def _add_app(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "app", metavar="APP", help="module:object of the application's Outbox (kinds, adapters)"
    )
    parser.add_argument("--database-url", help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL)")
    parser.add_argument("--schema", help="PostgreSQL schema (default: $OUTBOX_SCHEMA or outbox)")
    parser.add_argument("--broker-url", help="redis://... or amqp://... ($OUTBOX_BROKER_URL)")
    parser.add_argument(
        "--health-port",
        type=int,
        help="serve /livez and /readyz on this port ($OUTBOX_HEALTH_PORT; default: none)",
    )
    parser.add_argument(
        "--fabric", choices=FABRICS, help="dramatiq or celery (default: $OUTBOX_FABRIC or dramatiq)"
    )
    parser.add_argument(
        "--celery-app",
        metavar="MODULE:APP",
        help="an existing Celery app to publish through ($OUTBOX_CELERY_APP; --fabric celery)",
    )


def _overrides(args: argparse.Namespace) -> dict[str, str]:
    """Command-line settings as the OUTBOX_* variables the application's Outbox reads."""
    env = {
        "OUTBOX_DATABASE_URL": args.database_url,
        "OUTBOX_SCHEMA": args.schema,
        "OUTBOX_BROKER_URL": args.broker_url,
        "OUTBOX_HEALTH_PORT": str(args.health_port) if args.health_port is not None else None,
        "OUTBOX_FABRIC": args.fabric,
        "OUTBOX_CELERY_APP": args.celery_app,
    }
    return {name: value for name, value in env.items() if value}


def _cmd_claimer(args: argparse.Namespace) -> int:
    os.environ.update(_overrides(args))
    app = load_app(args.app)
    app.settings = app.settings.with_overrides(
        database_url=args.database_url,
        schema=args.schema,
        broker_url=args.broker_url,
        health_port=args.health_port,
        fabric=args.fabric,
        celery_app=args.celery_app,
    )
    run_claimer(install_fabric(app), kinds=args.kinds)
    return 0


def install_fabric(app: Outbox) -> Fabric:
    """The application's kinds installed on the fabric its settings name."""
    if app.settings.fabric == "celery":
        try:
            from outbox.dispatch.celery_fabric import install as install_celery
        except ImportError as error:
            raise ConfigurationError(
                f"the Celery fabric needs Celery: pip install 'outbox[celery]' ({error})"
            ) from None
        return install_celery(app)
    return install(app)


def setup_claimer(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "claimer",
        help="claim due actions and push them onto their kinds' Dramatiq queues (any replicas)",
    )
    _add_app(p)
    p.add_argument("--kinds", nargs="+", help="claim only these kinds (default: every adapter's)")
    p.set_defaults(func=_cmd_claimer)


def celery_worker_argv(args: argparse.Namespace, queues: list[str]) -> list[str]:
    """The ``celery worker`` command line for ``--fabric celery``: a thread pool of
    ``--threads`` when there is one process, else a prefork pool of ``--processes`` (a Celery
    worker runs one pool kind; each message's actions run concurrently on the process's event
    loop either way); ``queues`` every kind's unless ``--queues`` names some."""
    pool, concurrency = (
        ("threads", args.threads) if args.processes == 1 else ("prefork", args.processes)
    )
    argv = [sys.executable, "-m", "celery", "-A", CELERY_WORKER_MODULE, "worker"]
    argv += ["--queues", ",".join(args.queues or queues), "--pool", pool]
    argv += ["--concurrency", str(concurrency), "--loglevel", "INFO"]
    # Neither gossip nor mingle serves outbox tasks; both slow a worker's start.
    argv += ["--without-gossip", "--without-mingle"]
    return argv + list(args.dramatiq_args or [])


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The ``dramatiq`` command line the wrapper runs (``dramatiq_args``: what followed ``--``)."""
    argv = [sys.executable, "-m", LAUNCHER_MODULE, WORKER_MODULE]
    argv += ["--processes", str(args.processes), "--threads", str(args.threads)]
    if args.queues:
        argv += ["--queues", *args.queues]
    return argv + list(args.dramatiq_args or [])


def _cmd_worker(args: argparse.Namespace) -> int:
    os.environ.update(_overrides(args))
    os.environ[APP_ENV] = args.app
    # Fail here, with one line, rather than in every worker process: the app, its settings (the
    # database and broker URLs parsed) and the broker built from them, before Dramatiq starts.
    app = load_app(args.app)
    app.settings.require_database_url()
    if app.settings.broker_url:
        broker_from_url(app.settings.broker_url)
    if app.settings.fabric == "celery":
        dispatch = install_fabric(app)
        if app.settings.metrics_port:
            # Prefork children write their samples where the worker's main process reads them.
            prepare_multiprocess_env(os.environ)
        argv = celery_worker_argv(args, dispatch.queues)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(argv[0], argv)
    if app.settings.metrics_port:
        # Worker processes write their samples where the metrics fork (and Dramatiq's own
        # Prometheus middleware) read them.
        prepare_multiprocess_env(os.environ)
    if app.settings.health_port and not app.settings.health_dir:
        # The pool's endpoint reads each worker process's health file: they need a directory.
        os.environ["OUTBOX_HEALTH_DIR"] = tempfile.mkdtemp(prefix="outbox-health-")
    argv = worker_argv(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    return 0  # pragma: no cover - execv does not return


def setup_worker(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="run a worker pool for the application's kinds (wraps `dramatiq`, or `celery "
        "worker` with --fabric celery)",
    )
    _add_app(p)
    p.add_argument(
        "--processes", "-p", type=positive_int, default=1, help="worker processes (default 1)"
    )
    p.add_argument(
        "--threads", "-t", type=positive_int, default=8, help="threads per process (default 8)"
    )
    p.add_argument(
        "--queues", "-Q", nargs="+", help="only these queues (default: every kind's queue)"
    )
    # Everything after `--` goes to dramatiq (or celery worker) as it is: ``outbox.cli.main``
    # splits it off before parsing, so options before and after APP stay the outbox's own.
    p.usage = "%(prog)s [options] APP [options] [-- DRAMATIQ_OR_CELERY_OPTION ...]"
    p.set_defaults(func=_cmd_worker, dramatiq_args=[], passthrough=True)
