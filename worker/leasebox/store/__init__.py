"""The outbox repository: claim, lease, settle, sweep, backlog and dead letters, as SQL.

Every function takes the caller's connection, so that the caller decides the transaction;
every statement is a named query from `leasebox.db`.
"""
