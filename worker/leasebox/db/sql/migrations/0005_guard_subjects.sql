-- 0005: the abuse guard holds at every isolation level, and retention keeps rows once.
--
-- The guard counts a subject's rows after serialising its callers; under REPEATABLE READ or
-- SERIALIZABLE the count reads the snapshot the caller's transaction took at its first
-- statement, which cannot see what a concurrent request committed after it. So each counted
-- send rewrites its subject's row here first: a caller whose snapshot predates another
-- request's send finds that row rewritten by a transaction it cannot see, and PostgreSQL
-- fails it with a serialization failure (40001) instead of letting it count too few. Under
-- READ COMMITTED the row's lock serialises the callers and each count sees the others.
-- Subjects are hashes (of the recipient's normalised form, of the scope): no address here.
CREATE TABLE {schema}.guard_subjects (
    subject bigint PRIMARY KEY,
    touched_at timestamptz NOT NULL
) WITH (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_cost_delay = 0
);

-- What retention keeps of the days it drops (messages not sent yet, dead letters, messages a
-- live receipt names) moves to a partition of its own, which retention never drops, instead
-- of today's: it is moved once, not again a retention later, and it leaves once nothing
-- wants it any more. Its rows have the bucket 9999-12-31, after every real day.
CREATE TABLE {schema}.outbox_kept PARTITION OF {schema}.outbox
    FOR VALUES FROM ('9999-12-31') TO (MAXVALUE);
CREATE TABLE {schema}.history_kept PARTITION OF {schema}.history
    FOR VALUES FROM ('9999-12-31') TO (MAXVALUE);
