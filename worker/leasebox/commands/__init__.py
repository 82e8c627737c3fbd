"""Subcommands of `leasebox`; each module exposes `register(subparsers)`."""
