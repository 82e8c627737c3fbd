"""Fixtures of the operator tests: the emulated API server comes from `support.kube`."""
