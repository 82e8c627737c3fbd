"""The mutation gate's catalogue stays applicable: every snippet exists once, every test exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from tools.mutate import Mutation, load

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = load()


@pytest.mark.parametrize("mutation", CATALOGUE, ids=lambda m: m.id)
def test_every_mutation_applies_to_the_current_code(mutation: Mutation) -> None:
    original = (ROOT / mutation.file).read_text("utf-8")
    mutated = mutation.apply(original)
    assert mutated != original
    assert len(mutated.splitlines()) - len(original.splitlines()) in (0, -1, 1)


@pytest.mark.parametrize("mutation", CATALOGUE, ids=lambda m: m.id)
def test_every_mutation_names_tests_that_exist(mutation: Mutation) -> None:
    assert mutation.tests
    for test in mutation.tests:
        assert (ROOT / test.split("::")[0]).is_file(), test


def test_an_ambiguous_snippet_is_refused() -> None:
    twice = Mutation("x", "g", "f.py", find="a", replace="b", tests=("t",))
    with pytest.raises(LookupError, match="occurs twice"):
        twice.apply("a = 1\na = 2\n")
    assert Mutation("x", "g", "f.py", find="a", replace="b", tests=("t",), after="2").apply(
        "a = 1\n2: a\n"
    ) == ("a = 1\n2: b\n")


def test_a_missing_snippet_is_refused() -> None:
    with pytest.raises(LookupError, match="not found"):
        Mutation("x", "g", "f.py", find="zzz", replace="b", tests=("t",)).apply("a = 1\n")
