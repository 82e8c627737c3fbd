-- Named queries `leasebox demo` uses to watch and audit a run (`-- name: <name>` starts one).
-- `{schema}` is the leasebox schema. None of these serve the worker's hot path.

-- name: leases_by_worker
-- How many rows each worker holds right now.
SELECT leased_by, count(*) AS held
FROM {schema}.queue
WHERE status = 'processing' AND leased_by IS NOT NULL
GROUP BY leased_by;

-- name: leased_by_worker
-- The rows one worker holds.
SELECT id FROM {schema}.queue WHERE status = 'processing' AND leased_by = %(worker_id)s;

-- name: progress
-- Sent, dead and unfinished messages of the whole run (a message not in the queue is sent,
-- unless it was suppressed).
SELECT
    (SELECT count(*) FROM {schema}.outbox) - count(*)
        - (SELECT count(*) FROM {schema}.history WHERE event = 'suppressed') AS sent,
    count(*) FILTER (WHERE status = 'dead') AS dead,
    count(*) FILTER (WHERE status IN ('pending', 'processing')) AS unfinished
FROM {schema}.queue;

-- name: audit_outbox
-- Every row's outcome, for the demo's verdict.
SELECT id, status, dead_reason, recipient, delivery_key,
       extract(epoch FROM sent_at - created_at)::float8 AS latency_seconds
FROM {schema}.messages
ORDER BY id;

-- name: sent_to
-- The provider's id of the latest message sent to a recipient (the demo's bounce names it).
SELECT provider_message_id
FROM {schema}.messages
WHERE recipient = %(recipient)s AND status = 'sent'
ORDER BY id DESC
LIMIT 1;
