"""The worker process: the claim/send/settle loop, its settings, upkeep, health and metrics."""
