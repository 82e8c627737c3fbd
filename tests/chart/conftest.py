"""The chart tests' shared fixture: the chart rendered with each of its value sets."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from support.chart import VALUE_SETS, render


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The chart's objects rendered with one value set."""
    return render(copy.deepcopy(VALUE_SETS[request.param]))
