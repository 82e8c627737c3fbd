"""Explaining what happened to a send, from what the database recorded about it.

`trace` folds a send's outbox row, receipts and attempt history into a story (how many
logical sends and requests, each attempt and how it ended, who owned it, how many copies the
provider accepted); `narrative` tells that story in plain words and as JSON. Both are pure:
the reading is `leasebox.store.history`, the command is `leasebox trace`.
"""
