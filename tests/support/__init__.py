"""Rigs the test suites share: fakes, real servers on loopback, emulators, catalog readers.

Fixtures stay in each directory's `conftest.py`; what they are built from lives here, as
typed, importable modules (`from support.worker_doubles import FakeProvider`).
"""
