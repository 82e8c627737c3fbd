"""A value for every worker option other than its default: the table the option tests share.

`tests/worker/test_worker_options.py` checks the settings table with it, and the worker
command's test configures a worker with every variable from it, so that a new option
without a sample fails both (the samples must name every option).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from leasebox.config import KindPriority

# A value other than the default for every option, as the option's own type.
SAMPLES: dict[str, Any] = {
    "kinds": ("otp", "invite"),
    "schema": "mail",
    "provider_url": "log://",
    "provider_timeout": 2.5,
    "templates_dir": Path("/etc/leasebox/templates"),
    "concurrency": 12,
    "batch_size": 5,
    "lease_seconds": 20.0,
    "poll_interval": 0.5,
    "listen": False,
    "grace_seconds": 3.0,
    "drain": True,
    "max_attempts": 5,
    "backoff_base": 1.0,
    "backoff_max": 60.0,
    "metrics_port": 0,
    "metrics_host": "127.0.0.1",
    "log_format": "json",
    "log_level": "debug",
    "event_loop": "asyncio",
    "retention_seconds": 14 * 86400.0,
    "feedback_provider_days": 7.0,
    "priorities": (KindPriority("otp", 10, 30.0), KindPriority("invite", -1)),
    "quota_rate": 14.0,
    "quota_burst": 20,
    "quota_account": "ses-eu-west-1",
    "worker_id": "pod-a",
}
REQUIRED = {"LEASEBOX_DSN": "postgresql://app@db/app"}
