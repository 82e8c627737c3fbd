-- 0010: `enqueue_message` reads its rows by index whatever the tables held when a connection
-- first called it.
--
-- The function runs its statements on generic plans (`plan_cache_mode = force_generic_plan`,
-- so that a call does not plan over every day's partition): a connection plans them at its
-- first call, and again only when an analysis of a table they read invalidates them. A plan
-- made while a receipt partition's statistics called it empty (analysed before its first
-- receipts, by a database-wide ANALYZE for instance) read that partition by a sequential
-- scan for every receipt lookup, until autovacuum analysed it again: a burst of sends grew
-- slower with every send (on one connection of a freshly analysed schema, a call went from
-- about 0.2 to 1.3 ms on the server as some 12,000 receipts arrived). Every statement of the
-- function reads rows by a key that an index serves (the receipt's primary key, the
-- message's, its delivery key, the queue's replacement key), so the function now plans with
-- `enable_seqscan = off`: each lookup is an index probe, the same few reads on an empty
-- partition as on a full one, whatever the statistics say.

ALTER FUNCTION {schema}.enqueue_message(
    text, text, text, text, text, text, text, jsonb, bytea, text, boolean, integer,
    timestamptz, timestamptz, text, text, double precision, text[], text, jsonb)
    SET enable_seqscan = off;
