"""Test rigs shipped for users' own tests: an embedded PostgreSQL, an SMTP sink, and the
check that a template declaration agrees with its files (`templates`).

Nothing in the product imports this package; only the demo and test suites do.
"""
