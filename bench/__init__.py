"""Benchmarks of leasebox side by side with other PostgreSQL queues, run with `make bench`.

Absolute figures on a small shared machine move from run to run, so every benchmark runs
its peers in the same run on the same PostgreSQL server and reports ratios. The entry point
is `python -m bench.run`; `bench/README.md` explains the method and holds the latest figures.
"""
