"""The version, in one place, read by the build and by `leasebox --version`."""

__version__ = "0.1.0"
