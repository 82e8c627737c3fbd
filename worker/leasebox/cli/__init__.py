"""The `leasebox` command line: the composition root, one module per command.

Only this package wires the layers together (settings from flags and environment, the
database, the runtime, the operator); nothing below it imports it.
"""
