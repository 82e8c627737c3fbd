"""What an application imports to write to the outbox in its own transaction.

`enqueue` and `enqueue_async`, the abuse guard and the payload cipher. This package depends
on psycopg, cryptography and pydantic only, so that `pip install leasebox` stays light.
"""
