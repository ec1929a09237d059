"""The chaos soak: real claimers, Dramatiq workers, an SMTP sink and HTTP providers (a webhook
receiver, an issue tracker, a chat API), random SIGKILLs and injected faults, and checks of the
outbox's delivery guarantees at the end.

``python -m benchmarks.chaos --short`` (about two and a half minutes), or with ``--actions``,
``--duration``, ``--kill-interval`` and ``--seed`` for a long run. Modules:

- ``tables``: the schemas the soak owns besides the outbox's (the world and the watch);
- ``sink``: the SMTP relay process, recording every Message-ID it accepts;
- ``receivers``: the HTTP providers process (webhooks, issue comments, chat replies), with faults;
- ``recording``: per-attempt intervals and fence times, written in their own transactions;
- ``app``: the application the claimer and worker processes load;
- ``workload``: the mix of actions, decided up front from the seed;
- ``fleet``: starts, SIGKILLs and replaces claimer and worker processes, recording each kill;
- ``checks``: the guarantees, read back from PostgreSQL; ``soak``: runs it all.
"""
