"""Benchmarks of the outbox: throughput, latency and claim cost, each reported as a ratio to a
ceiling measured in the same run (absolute numbers drift on a shared machine; ratios much less).

    python -m benchmarks [--quick] [--only claim-cost enqueue ...]

prints one JSON object per scenario on stdout and a table on stderr. Each scenario works in a
PostgreSQL schema of its own (``bench_<scenario>``), dropped afterwards.
"""
