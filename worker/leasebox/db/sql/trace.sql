-- Named queries `leasebox trace` uses to read one send's story: its message with where it is
-- (the `messages` view, found by id, delivery key, idempotency key or aggregate), the receipts
-- of the requests that mapped onto it, and its attempt history. `{schema}` is the leasebox
-- schema. None of these serve the worker's hot path; each reads a handful of rows by an index
-- in each day's partition, except `trace_by_aggregate`.

-- fragment: traced_columns
o.id, o.kind, o.aggregate_id, o.recipient, o.delivery_key, o.status, o.attempts,
o.max_attempts, o.created_at, o.sent_at, o.expires_at, o.leased_by, o.lease_token,
o.lease_expires_at, o.dead_reason, o.provider_message_id, o.replacement_key, o.superseded_by

-- name: trace_by_id
-- The message with an id (its primary key).
SELECT
-- include: traced_columns
FROM {schema}.messages AS o
WHERE o.id = %(outbox_id)s;

-- name: trace_by_ids
-- Some messages by id, in id order (the demo's duplicates).
SELECT
-- include: traced_columns
FROM {schema}.messages AS o
WHERE o.id = ANY(%(outbox_ids)s)
ORDER BY o.id;

-- name: trace_by_delivery_key
-- The message with a delivery key (its unique index).
SELECT
-- include: traced_columns
FROM {schema}.messages AS o
WHERE o.delivery_key = %(delivery_key)s;

-- name: trace_by_idempotency_key
-- The messages the receipts of a key map onto, latest receipt first (one key names a new
-- send once its receipt has expired).
SELECT
-- include: traced_columns
FROM {schema}.receipts AS r
JOIN {schema}.messages AS o ON o.id = r.outbox_id
WHERE r.scope = %(scope)s AND r.idempotency_key = %(idempotency_key)s
ORDER BY r.created_at DESC;

-- name: trace_by_aggregate
-- An aggregate's messages, newest first; aggregate_id has no index, so this scans the outbox.
SELECT
-- include: traced_columns
FROM {schema}.messages AS o
WHERE o.aggregate_id = %(aggregate_id)s AND (%(kind)s::text IS NULL OR o.kind = %(kind)s::text)
ORDER BY o.id DESC
LIMIT %(limit)s;

-- name: trace_receipts
-- The receipts of the requests that mapped onto some rows, first request first.
SELECT r.outbox_id, r.scope, r.idempotency_key, r.created_at, r.last_seen_at, r.reuse_count,
       r.expires_at
FROM {schema}.receipts AS r
WHERE r.outbox_id = ANY(%(outbox_ids)s)
ORDER BY r.outbox_id, r.created_at, r.scope, r.idempotency_key;

-- name: trace_history
-- The attempt history of some rows, in the order it was written.
SELECT h.outbox_id, h.id, h.event, h.at, h.attempt, h.lease_token, h.worker_id,
       h.lease_expires_at, h.retry_delay_seconds, h.error_class, h.error, h.dead_reason,
       h.provider_message_id, h.superseded_by
FROM {schema}.history AS h
WHERE h.outbox_id = ANY(%(outbox_ids)s)
ORDER BY h.outbox_id, h.id;

-- name: trace_history_exists
-- Whether the schema has the attempt history table (migration 0003).
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_tables
    WHERE schemaname = %(schema)s AND tablename = 'history'
);

-- name: trace_feedback
-- What the mail services reported about some rows after they accepted them, in their order.
SELECT e.outbox_id, e.provider, e.event, e.bounce_class, e.smtp_status, e.detail,
       e.occurred_at
FROM {schema}.events AS e
WHERE e.outbox_id = ANY(%(outbox_ids)s)
ORDER BY e.outbox_id, e.occurred_at, e.id;

-- name: trace_suppressions
-- The unexpired suppression-list entry of each row's mailbox in its scope, if any.
SELECT o.id AS outbox_id, s.reason, s.detail, s.created_at, s.expires_at
FROM {schema}.outbox AS o
JOIN {schema}.suppressions AS s
  ON s.scope = coalesce(o.scope, 'default') AND s.recipient_key = o.recipient_key
WHERE o.id = ANY(%(outbox_ids)s)
  AND (s.expires_at IS NULL OR s.expires_at > now())
ORDER BY o.id;
