-- 0009: one index of pending rows per kind, so that the claim's plan does not depend on the
-- queue's statistics.
--
-- Before it, two partial indexes of pending rows began with the kind: `queue_ready_idx`
-- (kind, available_at, id), in the claim's order, and `queue_pending_created_idx`
-- (kind, created_at), for the backlog's oldest pending row. On a queue that has not been
-- analysed since a burst arrived (autovacuum analyses a table only after enough of it changed,
-- and then at its next naptime) the planner thinks a kind has a row or two pending, and
-- either index reads them as cheaply: it may pick the second, read every pending row of the
-- kind and sort them all for a batch of 100, about 20 times slower than reading the batch in
-- order. Now the ready index carries `created_at` (the backlog counts a kind's pending rows
-- in it and takes their oldest in the same pass), the other index is gone, and the claim has
-- one index to read, in its own order, whatever the statistics say. A queue holds only the
-- messages not sent yet: rebuilding its index is quick.

DROP INDEX {schema}.queue_pending_created_idx;
DROP INDEX {schema}.queue_ready_idx;
CREATE INDEX queue_ready_idx ON {schema}.queue (kind, available_at, id) INCLUDE (created_at)
    WHERE status = 'pending';
