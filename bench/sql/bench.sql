-- Named statements of the benchmarks (`-- name: <name>` starts one), in the format of
-- leasebox's own queries.sql. `{schema}` is the leasebox schema, quoted as an identifier.

-- name: seed_ready
-- Ready OTP rows shaped like what `leasebox.enqueue` writes (`secrets` comes sealed from the
-- producer's cipher), numbered from `first` so that batches never clash.
INSERT INTO {schema}.outbox (kind, aggregate_id, recipient, template, data, secrets, delivery_key)
SELECT 'otp', 'user-' || g, 'user' || g || '@example.com', 'otp',
       jsonb_build_object('i', g, 'name', 'User ' || g, 'minutes_valid', 10),
       %(secrets)s::bytea, 'otp:bench:' || g
FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(count)s::bigint - 1) AS g;

-- name: plain_insert
-- The enqueue benchmark's yardstick: the same row as `insert_outbox`, with nothing around it.
INSERT INTO {schema}.outbox
    (kind, aggregate_id, recipient, template, data, delivery_key, max_attempts)
VALUES
    (%(kind)s, %(aggregate_id)s, %(recipient)s, %(template)s, %(data)s, %(delivery_key)s,
     %(max_attempts)s);

-- name: baseline_claim
-- The plain baseline's claim: 100 ready rows in one statement, leased the way leasebox leases.
WITH candidates AS (
    SELECT id
    FROM {schema}.outbox
    WHERE kind = 'otp' AND status = 'pending' AND available_at <= now()
    ORDER BY available_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox AS o
SET status = 'processing',
    lease_token = gen_random_uuid(),
    lease_expires_at = now() + interval '45 seconds',
    attempts = o.attempts + 1,
    updated_at = now()
FROM candidates
WHERE o.id = candidates.id
RETURNING o.id, o.lease_token, o.data;

-- name: baseline_mark_sent
-- The plain baseline's completion: every claimed row in one statement, guarded by its lease.
UPDATE {schema}.outbox AS o
SET status = 'sent',
    sent_at = now(),
    lease_token = NULL,
    lease_expires_at = NULL,
    updated_at = now()
FROM unnest(%(ids)s::bigint[], %(tokens)s::uuid[]) AS d(id, token)
WHERE o.id = d.id AND o.lease_token = d.token AND o.status = 'processing';

-- name: outbox_accounting
-- Exactly-once evidence from the table: attempts are counted at claim, so a row sent once
-- and claimed once has attempts = 1.
SELECT count(*) AS total,
       count(*) FILTER (WHERE status = 'sent') AS sent,
       count(*) FILTER (WHERE status = 'sent' AND attempts = 1) AS sent_claimed_once,
       count(*) FILTER (WHERE attempts > 1) AS claimed_more_than_once,
       count(*) FILTER (WHERE status IN ('pending', 'processing')) AS unfinished,
       count(*) FILTER (WHERE status = 'dead') AS dead
FROM {schema}.outbox;

-- name: latency_stats
-- Enqueue-to-sent latency of the rows created at or after `since`, in milliseconds.
SELECT count(*) FILTER (WHERE status = 'sent') AS sent,
       count(*) AS total,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM sent_at - created_at) * 1000) AS p50_ms,
       percentile_cont(0.99) WITHIN GROUP (
           ORDER BY extract(epoch FROM sent_at - created_at) * 1000) AS p99_ms,
       max(extract(epoch FROM sent_at - created_at) * 1000) AS max_ms
FROM {schema}.outbox
WHERE created_at >= %(since)s;

-- name: unfinished_since
-- Rows created since a time that are not settled yet.
SELECT count(*) FROM {schema}.outbox
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
-- `outbox_accounting` over the rows with ids from `first_id` on (a batch seeded beside
-- retained history).
SELECT count(*) AS total,
       count(*) FILTER (WHERE status = 'sent') AS sent,
       count(*) FILTER (WHERE status = 'sent' AND attempts = 1) AS sent_claimed_once,
       count(*) FILTER (WHERE attempts > 1) AS claimed_more_than_once,
       count(*) FILTER (WHERE status IN ('pending', 'processing')) AS unfinished,
       count(*) FILTER (WHERE status = 'dead') AS dead
FROM {schema}.outbox
WHERE id >= %(first_id)s;

-- name: next_outbox_id
-- The id the next seeded row will get at the earliest.
SELECT coalesce(max(id), 0) + 1 FROM {schema}.outbox;

-- name: seed_history
-- Sent history in one set-based statement: rows `first` .. `first + count - 1` of `total`,
-- sent at a steady rate over the last `days` days (row 0 the oldest), each sent a second
-- after it was created, with the two history rows a send leaves (its claim and its `sent`).
-- This writes sent rows where the schema keeps them; a schema that moves history elsewhere
-- changes this statement, not the benchmark.
WITH sent AS (
    INSERT INTO {schema}.outbox
        (kind, aggregate_id, recipient, template, data, delivery_key, status, attempts,
         created_at, updated_at, sent_at, provider_message_id)
    SELECT 'otp', 'user-' || g, 'user' || g || '@example.com', 'otp',
           jsonb_build_object('i', g, 'name', 'User ' || g),
           'otp:history:' || g, 'sent', 1,
           t.at - interval '1 second', t.at, t.at, 'null-' || g
    FROM generate_series(%(first)s::bigint, %(first)s::bigint + %(count)s::bigint - 1) AS g
    CROSS JOIN LATERAL (
        SELECT now() - make_interval(days => %(days)s::int)
               + make_interval(secs => %(days)s::float8 * 86400.0 * (g + 0.5)
                                       / greatest(%(total)s::bigint, 1)) AS at
    ) AS t
    RETURNING id, sent_at, provider_message_id
)
INSERT INTO {schema}.history
    (outbox_id, event, at, attempt, lease_token, worker_id, lease_expires_at,
     provider_message_id)
SELECT s.id, e.event, s.sent_at - e.before, 1, md5(s.id::text)::uuid, 'bench-history',
       s.sent_at + interval '44 seconds',
       CASE e.event WHEN 'sent' THEN s.provider_message_id END
FROM sent AS s
CROSS JOIN (VALUES ('claimed', interval '0.5 second'), ('sent', interval '0 seconds'))
    AS e(event, before);

-- name: history_oldest_day
-- How many sent rows are older than the retention (what one day's pruning must remove).
SELECT count(*) FROM {schema}.outbox
WHERE status = 'sent' AND sent_at < now() - make_interval(secs => %(retention_seconds)s);

-- name: plain_insert_many
-- The batch yardstick: the same rows as `plain_insert`, many in one multi-row statement.
INSERT INTO {schema}.outbox
    (kind, aggregate_id, recipient, template, data, delivery_key, max_attempts)
SELECT r.kind, r.aggregate_id, r.recipient, r.template, r.data, r.delivery_key, r.max_attempts
FROM unnest(%(kind)s::text[], %(aggregate_id)s::text[], %(recipient)s::text[],
            %(template)s::text[], %(data)s::jsonb[], %(delivery_key)s::text[],
            %(max_attempts)s::int[])
     AS r(kind, aggregate_id, recipient, template, data, delivery_key, max_attempts);

-- name: count_outbox
-- Every row of the outbox (what an enqueue case wrote).
SELECT count(*) FROM {schema}.outbox;
