"""The adapters' tests need their frameworks. Where a framework is not
installed they skip, unless ``CTXBROKER_ADAPTER_TESTS=required`` is set (as
``.ci/clients.sh`` sets it in the adapters' own environment): then a missing
framework fails the run instead of skipping it silently."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def framework(module: str) -> ModuleType:
    """Imports a framework module, or skips (fails when required)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if os.environ.get("CTXBROKER_ADAPTER_TESTS") == "required":
            pytest.fail(f"{module} is required for the adapter tests: {err}")
        pytest.skip(f"{module} is not installed")
