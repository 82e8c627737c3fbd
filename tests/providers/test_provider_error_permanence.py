"""`ProviderError.permanence` decides between a retry and a dead letter; `error_class`, its
old name, still works for one release and says it is deprecated.

Custom providers raise these errors, so the old spelling must keep its meaning: the keyword,
a subclass's `error_class` attribute and the property all map onto `permanence`.
"""

from __future__ import annotations

import pytest

from leasebox.delivery.retrying import classify
from leasebox.errors import (
    PERMANENT,
    TRANSIENT,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)


def test_the_class_gives_the_permanence_unless_the_error_names_its_own() -> None:
    assert TransientProviderError("smtp_451", "busy").permanence == TRANSIENT
    assert PermanentProviderError("smtp_550", "no such user").permanence == PERMANENT
    assert ProviderError("odd", "x").permanence == TRANSIENT
    assert ProviderError("odd", "x", permanence=PERMANENT).permanence == PERMANENT


def test_the_old_error_class_keyword_still_decides_and_warns() -> None:
    with pytest.warns(DeprecationWarning, match="permanence"):
        error = ProviderError("api_gone", "the account is closed", error_class=PERMANENT)
    assert error.permanence == PERMANENT
    assert not error.transient
    assert classify(error).permanence == PERMANENT


def test_the_old_error_class_property_reads_the_permanence_and_warns() -> None:
    error = PermanentProviderError("smtp_550", "no such user")
    with pytest.warns(DeprecationWarning, match="permanence"):
        assert error.error_class == PERMANENT


def test_the_error_class_property_cannot_be_set() -> None:
    error = TransientProviderError("smtp_451", "busy")
    with pytest.raises(AttributeError):
        error.error_class = PERMANENT  # type: ignore[misc]


def test_a_subclass_declaring_the_old_attribute_gets_that_permanence_and_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="permanence"):

        class LegacyRefusal(ProviderError):
            error_class = PERMANENT

    error = LegacyRefusal("legacy_550", "refused")
    assert error.permanence == PERMANENT
    assert classify(error).permanence == PERMANENT
