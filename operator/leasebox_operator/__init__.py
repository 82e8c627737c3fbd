"""The leasebox operator: reconciles OutboxWorkerPool resources with kopf."""
