"""The SQL the docs tell an operator to run during an incident runs on the current schema.

A runbook query written for a table that has since changed fails when it is needed most; each
`sql` block of the docs is planned (EXPLAIN, nothing runs) against a freshly migrated schema.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SQL_BLOCK = re.compile(r"^[ \t]*```sql\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)


def _statements() -> list[tuple[str, str]]:
    """Every statement of every `sql` block, named by its document and the line it starts on."""
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for block in SQL_BLOCK.finditer(text):
            line = text.count("\n", 0, block.start(1)) + 1
            for statement in block.group(1).split(";"):
                if statement.strip():
                    start = line + statement[: len(statement) - len(statement.lstrip())].count("\n")
                    found.append((f"{document.name}:{start}", statement))
                line += statement.count("\n")
    return found


STATEMENTS = _statements()


def test_the_docs_hold_the_runbook_queries_this_test_checks() -> None:
    assert len(STATEMENTS) >= 8
    assert all(name.startswith(("runbooks.md", "README.md")) for name, _ in STATEMENTS)


@pytest.mark.parametrize("statement", [s for _, s in STATEMENTS], ids=[n for n, _ in STATEMENTS])
def test_a_documented_query_plans_against_the_schema(
    db_conn: psycopg.Connection, statement: str
) -> None:
    plan = db_conn.execute(f"EXPLAIN {statement}".encode()).fetchall()
    assert any("Scan" in line for (line,) in plan)
