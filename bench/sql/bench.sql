-- Named statements of the benchmarks (`-- name: <name>` starts one), in the format of
-- leasebox's own queries.sql. `{schema}` is the leasebox schema, quoted as an identifier.

-- name: seed_ready
-- Ready OTPs shaped like what `leasebox.enqueue` writes (the message and its queue row;
-- `secrets` comes sealed from the producer's cipher), numbered from `first` so that batches
-- never clash.
WITH m AS (
    INSERT INTO {schema}.outbox
        (bucket, kind, aggregate_id, recipient, recipient_key, scope, message_hash, template,
         data, secrets, delivery_key)
    SELECT (now() AT TIME ZONE 'UTC')::date, 'otp', 'user-' || g, 'user' || g || '@example.com',
           'user' || g || '@example.com', 'bench', md5(g::text), 'otp',
           jsonb_build_object('i', g, 'name', 'User ' || g, 'minutes_valid', 10),
           %(secrets)s::bytea, 'otp:bench:' || g
    FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(count)s::bigint - 1) AS g
    RETURNING id, bucket, kind, aggregate_id, delivery_key, created_at
)
INSERT INTO {schema}.queue (id, bucket, kind, aggregate_id, delivery_key, created_at)
SELECT id, bucket, kind, aggregate_id, delivery_key, created_at FROM m;

-- name: plain_insert
-- The enqueue benchmark's yardstick: the message's row in leasebox's outbox, with nothing
-- around it (no queue row, no receipt, no lock).
INSERT INTO {schema}.outbox
    (bucket, kind, aggregate_id, recipient, template, data, delivery_key, max_attempts)
VALUES
    ((now() AT TIME ZONE 'UTC')::date, %(kind)s, %(aggregate_id)s, %(recipient)s, %(template)s,
     %(data)s, %(delivery_key)s, %(max_attempts)s);

-- name: baseline_claim
-- The plain baseline's claim: 100 ready rows in one statement, leased the way leasebox leases,
-- with each message's data (as the minimal loop reads its payload).
WITH candidates AS (
    SELECT id
    FROM {schema}.queue
    WHERE kind = 'otp' AND status = 'pending' AND available_at <= now()
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE {schema}.queue AS q
    SET status = 'processing',
        lease_token = gen_random_uuid(),
        lease_expires_at = now() + interval '45 seconds',
        attempts = q.attempts + 1,
        updated_at = now()
    WHERE q.id = ANY(ARRAY(SELECT id FROM candidates))
    RETURNING q.id, q.bucket, q.lease_token
)
SELECT c.id, c.lease_token, o.data
FROM claimed AS c JOIN {schema}.outbox AS o ON o.id = c.id AND o.bucket = c.bucket;

-- name: baseline_mark_sent
-- The plain baseline's completion: every claimed row out of the queue in one statement,
-- guarded by its lease.
DELETE FROM {schema}.queue AS q
USING unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS d(id, token)
WHERE q.id = ANY(%(ids)s::bigint[]) AND q.id = d.id AND q.lease_token = d.token
  AND q.status = 'processing'
RETURNING q.id;

-- fragment: accounting
-- Exactly-once evidence from the tables, over the messages with ids from `first_id` on: a
-- message is sent once it has left the queue, and attempts are counted at claim, so a message
-- sent at its first claim has a `sent` history row of attempt 1 and no claim of attempt 2.
SELECT (SELECT count(*) FROM {schema}.outbox WHERE id >= %(first_id)s) AS total,
       (SELECT count(*) FROM {schema}.outbox WHERE id >= %(first_id)s)
         - (SELECT count(*) FROM {schema}.queue WHERE id >= %(first_id)s) AS sent,
       (SELECT count(*) FROM {schema}.history
         WHERE event = 'sent' AND attempt = 1 AND outbox_id >= %(first_id)s)
         AS sent_claimed_once,
       (SELECT count(DISTINCT outbox_id) FROM {schema}.history
         WHERE event = 'claimed' AND attempt > 1 AND outbox_id >= %(first_id)s)
         AS claimed_more_than_once,
       (SELECT count(*) FROM {schema}.queue
         WHERE status IN ('pending', 'processing') AND id >= %(first_id)s) AS unfinished,
       (SELECT count(*) FROM {schema}.queue
         WHERE status = 'dead' AND id >= %(first_id)s) AS dead

-- name: outbox_accounting
-- Exactly-once evidence over every message.
-- include: accounting

-- name: latency_stats
-- Enqueue-to-sent latency of the messages created at or after `since`, in milliseconds.
SELECT count(s.at) AS sent,
       count(*) AS total,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM s.at - o.created_at) * 1000) AS p50_ms,
       percentile_cont(0.99) WITHIN GROUP (
           ORDER BY extract(epoch FROM s.at - o.created_at) * 1000) AS p99_ms,
       max(extract(epoch FROM s.at - o.created_at) * 1000) AS max_ms
FROM {schema}.outbox AS o
LEFT JOIN {schema}.history AS s
    ON s.outbox_id = o.id AND s.bucket = o.bucket AND s.event = 'sent'
WHERE o.created_at >= %(since)s;

-- name: unfinished_since
-- Messages created since a time that are not settled yet.
SELECT count(*) FROM {schema}.queue
WHERE created_at >= %(since)s AND status IN ('pending', 'processing');

-- name: pgqueuer_left
-- PgQueuer deletes a job from its queue table once it is done.
SELECT count(*) AS left_over FROM pgqueuer;

-- name: procrastinate_accounting
-- Procrastinate's jobs by outcome.
SELECT count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE attempts > 1) AS retried,
       count(*) AS total
FROM procrastinate_jobs;

-- name: pgboss_accounting
-- pg-boss's jobs by outcome.
SELECT count(*) FILTER (WHERE state = 'completed') AS completed,
       count(*) FILTER (WHERE retry_count > 0) AS retried,
       count(*) AS total
FROM pgboss.job WHERE name = 'otp';

-- name: graphile_left
-- graphile-worker deletes a job once it succeeds.
SELECT count(*) AS left_over FROM graphile_worker._private_jobs;

-- name: minimal_schema
-- The workload's limit: the least an outbox needs (a key, a state, a lease, the payload) and
-- one partial index for the claim. `{schema}` is the benchmark's own schema, not leasebox's.
CREATE SCHEMA {schema};
CREATE TABLE {schema}.outbox (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status smallint NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    lease_token uuid,
    payload jsonb NOT NULL
);
CREATE INDEX outbox_ready_idx ON {schema}.outbox (id) WHERE status = 0;

-- name: minimal_seed
-- Ready jobs on the minimal table, with the payload every peer carries.
INSERT INTO {schema}.outbox (payload)
SELECT jsonb_build_object('i', g, 'recipient', 'user' || g || '@example.com',
                          'template', 'otp', 'data', jsonb_build_object('name', 'User ' || g))
FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(count)s::bigint - 1) AS g;

-- name: minimal_claim
-- The plain loop's claim on the minimal table: 100 ready rows, leased in one statement.
WITH candidates AS (
    SELECT id FROM {schema}.outbox
    WHERE status = 0
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox AS o
SET status = 1, lease_token = gen_random_uuid(), attempts = o.attempts + 1
FROM candidates
WHERE o.id = candidates.id
RETURNING o.id, o.lease_token, o.payload;

-- name: minimal_mark_sent
-- The plain loop's completion on the minimal table, guarded by the lease token.
UPDATE {schema}.outbox AS o
SET status = 2, lease_token = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS d(id, token)
WHERE o.id = d.id AND o.lease_token = d.token AND o.status = 1;

-- name: minimal_accounting
-- Exactly-once evidence from the minimal table, in the columns of `outbox_accounting`.
SELECT count(*) AS total,
       count(*) FILTER (WHERE status = 2) AS sent,
       count(*) FILTER (WHERE status = 2 AND attempts = 1) AS sent_claimed_once,
       count(*) FILTER (WHERE attempts > 1) AS claimed_more_than_once,
       count(*) FILTER (WHERE status IN (0, 1)) AS unfinished,
       0 AS dead
FROM {schema}.outbox;

-- name: outbox_accounting_from
-- `outbox_accounting` over the messages with ids from `first_id` on (a batch seeded beside
-- retained history).
-- include: accounting

-- name: next_outbox_id
-- The id the next seeded row will get at the earliest.
SELECT coalesce(max(id), 0) + 1 FROM {schema}.outbox;

-- name: seed_history
-- Sent history in one set-based statement: messages `first` .. `first + count - 1` of
-- `total`, created at a steady rate over the `days` whole days before today (message 0 the
-- oldest), each sent a second after it was created, with what a send leaves: its receipt
-- (valid for a day), its claim and its `sent` in the history. The day partitions exist
-- before (`ensure_partitions`), as they do in production.
WITH sent AS (
    INSERT INTO {schema}.outbox
        (bucket, kind, aggregate_id, recipient, recipient_key, scope, template, data,
         delivery_key, created_at)
    SELECT (t.at AT TIME ZONE 'UTC')::date, 'otp', 'user-' || g, 'user' || g || '@example.com',
           'user' || g || '@example.com', 'bench', 'otp',
           jsonb_build_object('i', g, 'name', 'User ' || g), 'otp:history:' || g, t.at
    FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(count)s::bigint - 1) AS g
    CROSS JOIN LATERAL (
        SELECT (((now() AT TIME ZONE 'UTC')::date - %(days)s::int)::timestamp
                + make_interval(secs => %(days)s::float8 * 86400.0 * (g + 0.5)
                                        / greatest(%(total)s::bigint, 1)))
               AT TIME ZONE 'UTC' AS at
    ) AS t
    RETURNING id, bucket, kind, created_at
),
receipts AS (
    INSERT INTO {schema}.receipts
        (scope, idempotency_key, bucket, request_hash, outbox_id, outbox_bucket, created_at,
         expires_at, last_seen_at)
    SELECT 'bench', 'history-' || s.id,
           ((s.created_at + interval '1 day') AT TIME ZONE 'UTC')::date, md5(s.id::text),
           s.id, s.bucket, s.created_at, s.created_at + interval '1 day', s.created_at
    FROM sent AS s
)
INSERT INTO {schema}.history
    (outbox_id, bucket, kind, event, at, attempt, lease_token, worker_id, lease_expires_at,
     provider_message_id)
SELECT s.id, s.bucket, s.kind, e.event, s.created_at + e.after, 1, md5(s.id::text)::uuid,
       'bench-history', s.created_at + interval '45 seconds',
       CASE e.event WHEN 'sent' THEN 'null-' || s.id END
FROM sent AS s
CROSS JOIN (VALUES ('claimed', interval '0.5 second'), ('sent', interval '1 second'))
    AS e(event, after);

-- name: history_oldest_day
-- How many messages of the days before the retention are sent (what retention must drop).
SELECT count(*) FROM {schema}.outbox AS o
WHERE o.bucket < ((now() - make_interval(secs => %(retention_seconds)s)) AT TIME ZONE 'UTC')::date
  AND NOT EXISTS (SELECT FROM {schema}.queue AS q WHERE q.id = o.id);

-- name: plain_insert_many
-- The batch yardstick: the same rows as `plain_insert`, many in one multi-row statement. Its
-- arrays go in binary, as `enqueue_many`'s do, so that the ratio compares the statements and
-- not how the arrays travel.
INSERT INTO {schema}.outbox
    (bucket, kind, aggregate_id, recipient, template, data, delivery_key, max_attempts)
SELECT (now() AT TIME ZONE 'UTC')::date, r.kind, r.aggregate_id, r.recipient, r.template,
       r.data, r.delivery_key, r.max_attempts
FROM unnest(%(kind)b::text[], %(aggregate_id)b::text[], %(recipient)b::text[],
            %(template)b::text[], %(data)b::jsonb[], %(delivery_key)b::text[],
            %(max_attempts)b::int[])
     AS r(kind, aggregate_id, recipient, template, data, delivery_key, max_attempts);

-- name: count_outbox
-- Every row of the outbox (what an enqueue case wrote).
SELECT count(*) FROM {schema}.outbox;

-- name: burst_window
-- The first seconds of a drain, from its history: how long the drain took from its first
-- claim to its last send, and how many messages it sent within `window_seconds` of that
-- claim (the history's times are the database's, so the worker's start-up is left out).
WITH span AS (
    SELECT min(at) FILTER (WHERE event = 'claimed') AS first_claim,
           max(at) FILTER (WHERE event = 'sent') AS last_sent
    FROM {schema}.history
)
SELECT extract(epoch FROM s.last_sent - s.first_claim)::float8 AS drain_seconds,
       (SELECT count(*) FROM {schema}.history AS h
         WHERE h.event = 'sent'
           AND h.at <= s.first_claim + make_interval(secs => %(window_seconds)s)) AS sent
FROM span AS s;

-- name: queue_statistics
-- Whether the queue had been analysed (by hand or by autovacuum), and how many rows the
-- planner believed it held.
SELECT c.reltuples::float8, s.last_analyze IS NOT NULL OR s.last_autoanalyze IS NOT NULL
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = to_regclass(%(queue)s);
