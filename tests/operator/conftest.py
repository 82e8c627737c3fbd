"""Fixtures of the operator tests: the emulated Kubernetes API server."""

from __future__ import annotations

from kube_emulator import kube_emulator

__all__ = ["kube_emulator"]
