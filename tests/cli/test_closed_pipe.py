"""A command whose reader has gone (`leasebox trace ... | head`) stops quietly, as Unix tools do.

Each test gives the command a real pipe whose read end is already closed, so that its first
write to stdout fails with EPIPE whatever the timing (with `| head` the write may or may not
come after head has left).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from leasebox.cli.main import EXIT_CLOSED_PIPE

LEASEBOX = [sys.executable, "-m", "leasebox"]


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[bytes]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has left before the command writes anything
    try:
        return subprocess.run(
            [*LEASEBOX, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
            cwd=Path(__file__).parent,
        )
    finally:
        os.close(write_end)


def test_a_command_writing_to_a_closed_pipe_exits_quietly_with_the_sigpipe_status() -> None:
    result = run_into_closed_pipe("crd")
    assert result.stderr == b""
    assert result.returncode == EXIT_CLOSED_PIPE == 141


def enqueue_one(dsn: str) -> str:
    """Enqueue a message with the command; its outbox id."""
    enqueued = subprocess.run(
        [
            *LEASEBOX,
            *("enqueue", "--dsn", dsn, "--kind", "verification", "--recipient"),
            *("ada@example.com", "--data", '{"link": "https://example.com/v/1"}'),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert enqueued.returncode == 0, enqueued.stderr
    return str(json.loads(enqueued.stdout)["outbox_id"])


def test_trace_into_a_closed_pipe_exits_quietly(db_dsn: str) -> None:
    result = run_into_closed_pipe("trace", "--dsn", db_dsn, "--id", enqueue_one(db_dsn))
    assert result.stderr == b""
    assert result.returncode == EXIT_CLOSED_PIPE


def test_trace_into_head_prints_the_first_line_and_no_traceback(db_dsn: str) -> None:
    outbox_id = enqueue_one(db_dsn)
    command = shlex.join([*LEASEBOX, "trace", "--dsn", db_dsn, "--id", outbox_id])
    result = subprocess.run(
        ["sh", "-c", f"{command} | head -n 1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert len(result.stdout.splitlines()) == 1
    assert result.stderr == ""
