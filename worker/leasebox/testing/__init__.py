"""Test rigs shipped for users' own tests: an embedded PostgreSQL and an SMTP sink.

Nothing in the product imports this package; only the demo and test suites do.
"""
