-- Named queries `leasebox demo` uses to watch and audit a run (`-- name: <name>` starts one).
-- `{schema}` is the leasebox schema. None of these serve the worker's hot path.

-- name: leases_by_worker
-- How many rows each worker holds right now.
SELECT leased_by, count(*) AS held
FROM {schema}.outbox
WHERE status = 'processing' AND leased_by IS NOT NULL
GROUP BY leased_by;

-- name: leased_by_worker
-- The rows one worker holds.
SELECT id FROM {schema}.outbox WHERE status = 'processing' AND leased_by = %(worker_id)s;

-- name: progress
-- Sent, dead and unfinished rows of the whole run.
SELECT
    count(*) FILTER (WHERE status = 'sent') AS sent,
    count(*) FILTER (WHERE status = 'dead') AS dead,
    count(*) FILTER (WHERE status IN ('pending', 'processing')) AS unfinished
FROM {schema}.outbox;

-- name: audit_outbox
-- Every row's outcome, for the demo's verdict.
SELECT id, status, dead_reason, recipient, delivery_key,
       extract(epoch FROM sent_at - created_at)::float8 AS latency_seconds
FROM {schema}.outbox
ORDER BY id;
