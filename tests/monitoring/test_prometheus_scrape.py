"""The series check the monitoring tests rely on: it must catch what it exists to catch.

`tests/cluster/test_monitoring_queries.py` judges every shipped query by whether its
selectors return series from real scrapes. Here a real Prometheus with no targets shows
that a misspelled metric returns no series (while the query itself succeeds) and that a
broken expression is an error.
"""

from __future__ import annotations

from pathlib import Path

from support.prometheus import Prometheus
from support.waiting import wait_for


def test_a_misspelled_metric_is_caught_by_the_series_check(tmp_path: Path) -> None:
    prometheus = Prometheus(tmp_path, {})
    server = prometheus.start()
    try:
        wait_for(
            lambda: prometheus.query("vector(1)").get("status") == "success",
            what="prometheus up",
            timeout=30,
        )
        assert prometheus.query("leasebox_sent_totl").get("status") == "success"
        assert not prometheus.has_series("leasebox_sent_totl")
        assert prometheus.query("rate(leasebox_sent_total[1m]").get("status") == "error"
    finally:
        server.terminate()
        server.wait(timeout=30)
