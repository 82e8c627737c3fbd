"""The operator-cost benchmark's harness, at a tiny size on the session's control plane.

`make bench` measures the operator's CPU and API requests per pool-poll at 10, 100 and 500
pools; this checks that the harness measures something coherent (the operator polled every
pool, made requests, used CPU), never how fast: speed belongs in `make bench`.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from bench.operator_cost import measure, seed_backlog

from support.cluster.controlplane import ControlPlane


def test_the_operator_cost_harness_counts_polls_requests_and_cpu_of_every_pool(
    control_plane: ControlPlane, db_dsn: str, tmp_path: Path
) -> None:
    seed_backlog(db_dsn, 20)
    cost = measure(
        control_plane,
        db_dsn,
        pools=3,
        window=2.0,
        namespace=f"bench-{uuid.uuid4().hex[:8]}",
        folder=tmp_path,
        poll_interval=1,
        warmup=1.0,
        tidy=True,
        # An idle pool writes its status once per heartbeat: one a second, so the window
        # holds requests to count.
        environ={"LEASEBOX_OPERATOR_STATUS_HEARTBEAT": "1"},
        settle_limit=0,
    )
    assert cost.all_polled
    assert cost.polled_pools == 3
    assert cost.polls > 0
    assert cost.api_requests > 0
    assert cost.cpu_seconds > 0
    assert cost.cpu_ms_per_pool_poll == pytest.approx(
        1000 * cost.cpu_seconds / cost.polls, abs=0.01
    )
    assert cost.api_requests_per_pool_poll == round(cost.api_requests / cost.polls, 3)
    assert cost.rss_mib > 0
