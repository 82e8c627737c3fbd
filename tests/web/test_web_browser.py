"""`leasebox web` in a real headless Chromium (Debian's), driven by Playwright.

What a person on call sees: the pages render, the filters work from the keyboard alone, an
action is refused to a viewer and done (and audited) for an operator by clicking through the
preview, no page holds an OTP code, and every page passes basic accessibility checks
(a language, one h1 and no skipped heading level, a label for every control, captions and
header cells on tables, every control reachable with Tab, a visible focus). Screenshots of
the main pages are taken on every run; with `LEASEBOX_SCREENSHOTS=1` they are written to
`docs/images/` for the docs.

The browser is Debian's `chromium` (`make tools` installs it); a missing one skips these
tests with one line, except under `CI`, where it fails them.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leasebox.web.settings import WebSettings
from support.web_rig import CODE, RECIPIENT, Seeded, running_web

pytestmark = pytest.mark.db
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
VIEWER = {"X-Forwarded-User": "grace", "X-Forwarded-Groups": "readers"}
OPERATOR = {"X-Forwarded-User": "ada", "X-Forwarded-Groups": "oncall"}
# Every heading level on a page, whether each control has a label, and the tables' parts.
PAGE_FACTS = """() => {
  const controls = [...document.querySelectorAll('input, select, textarea')]
    .filter(e => e.type !== 'hidden');
  return {
    lang: document.documentElement.lang,
    h1: document.querySelectorAll('h1').length,
    levels: [...document.querySelectorAll('h1, h2, h3, h4, h5, h6')].map(h => +h.tagName[1]),
    unlabelled: controls
      .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label'))
      .map(e => e.name),
    tables: [...document.querySelectorAll('table')].map(t => ({
      caption: !!t.querySelector('caption'),
      unscoped: t.querySelectorAll('thead th:not([scope])').length,
    })),
    focusable: [...document.querySelectorAll(
      'a[href], button:not([disabled]), input:not([type=hidden]), select')].length,
  };
}"""
FOCUSED = """() => {
  const e = document.activeElement;
  const style = getComputedStyle(e);
  return {tag: e.tagName, id: e.id, text: (e.textContent || '').trim(),
          outline: style.outlineStyle, width: style.outlineWidth};
}"""


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    problem = None
    if not Path(CHROMIUM).exists():
        problem = f"{CHROMIUM} is missing: `make tools` installs Debian's chromium (as root)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = "playwright is not installed: `make install` installs the dev extra"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"the browser tests are required under CI: {problem}")
        pytest.skip(problem)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def settings(dsn: str) -> WebSettings:
    return WebSettings(
        dsn=dsn,
        auth="proxy",
        operator_groups=("oncall",),
        allow_actions=True,
        kind_sla_seconds={"otp": 10.0},
    ).check()


@pytest.fixture
def web(web_seeded: tuple[str, Seeded]) -> Iterator[tuple[str, Seeded]]:
    dsn, rows = web_seeded
    with running_web(settings(dsn)) as base:
        yield base, rows


def _page(chromium: Any, headers: dict[str, str]) -> Any:
    context = chromium.new_context(
        extra_http_headers=headers, viewport={"width": 1280, "height": 800}
    )
    return context.new_page()


def test_the_main_pages_render_and_hold_no_code(
    chromium: Any, web: tuple[str, Seeded], tmp_path: Path
) -> None:
    base, rows = web
    page = _page(chromium, VIEWER)
    shots = {
        "web-overview.png": ("/", "Overview"),
        "web-dead-letters.png": ("/dead-letters", "Dead letters"),
        "web-message.png": (f"/messages/{rows.rejected[0]}", f"Message {rows.rejected[0]}"),
        "web-audit.png": ("/audit", "Audit trail"),
    }
    for name, (path, heading) in shots.items():
        response = page.goto(base + path)
        assert response is not None, path
        assert response.status == 200, path
        assert page.inner_text("h1") == heading
        html = page.content()
        assert CODE not in html, path
        assert RECIPIENT not in html, path
        shot = tmp_path / name
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("LEASEBOX_SCREENSHOTS"):
            DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, DOCS_IMAGES / name)
    page.goto(base + "/")
    assert "LeaseboxVerificationSLABreached: otp" in page.inner_text("main")
    assert page.inner_text("table tbody tr:first-child th") == "otp"
    page.goto(base + f"/messages/{rows.rejected[0]}")
    assert "smtp_550" in page.inner_text("main")
    page.context.close()


def _tab_to(page: Any, wanted: str, *, text: bool = False) -> dict[str, Any]:
    """Press Tab until the focused element has id (or text) `wanted`; its facts."""
    for _ in range(40):
        page.keyboard.press("Tab")
        focused: dict[str, Any] = page.evaluate(FOCUSED)
        if focused["text" if text else "id"] == wanted:
            return focused
    raise AssertionError(f"Tab never reached {wanted!r}")


def _arrow_to(page: Any, select: str, value: str) -> None:
    """Press ArrowDown on the focused select until it shows `value`."""
    for _ in range(10):
        if page.eval_on_selector(f"#{select}", "e => e.value") == value:
            return
        page.keyboard.press("ArrowDown")
    raise AssertionError(f"{value!r} is not among the choices of #{select}")


def test_the_dead_letter_filters_work_from_the_keyboard(
    chromium: Any, web: tuple[str, Seeded]
) -> None:
    base, rows = web
    page = _page(chromium, VIEWER)
    page.goto(base + "/dead-letters")
    assert page.locator("tbody tr").count() == 4
    focused = _tab_to(page, "kind")
    assert focused["outline"] != "none"
    assert focused["width"] != "0px"
    _arrow_to(page, "kind", "verification")
    _tab_to(page, "error_class")
    _arrow_to(page, "error_class", "smtp_550")
    _tab_to(page, "Apply filters", text=True)
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert "kind=verification" in page.url
    assert "error_class=smtp_550" in page.url
    listed = page.locator("tbody th a").all_inner_texts()
    assert listed == [str(rows.rejected[2])]
    assert page.eval_on_selector("#kind", "e => e.value") == "verification"
    page.context.close()


def test_an_action_is_refused_without_the_role_and_audited_with_it(
    chromium: Any, db_dsn: str
) -> None:
    from support.web_rig import seeded_outbox

    seeded_outbox(db_dsn)
    with running_web(settings(db_dsn)) as base:
        reader = _page(chromium, VIEWER)
        reader.goto(base + "/dead-letters?kind=otp")
        assert "Your role (viewer) may look but not act." in reader.inner_text("main")
        with reader.expect_navigation():
            reader.click("text=Requeue…")
        assert reader.inner_text("h1") == "Refused"
        assert "grace has the viewer role" in reader.inner_text("main")

        operator = _page(chromium, OPERATOR)
        operator.goto(base + "/dead-letters?kind=otp")
        with operator.expect_navigation():
            operator.click("text=Requeue…")
        assert operator.inner_text("h1") == "Requeue?"
        assert "Requeue 2 dead letters" in operator.inner_text("main")
        with operator.expect_navigation():
            operator.click("button:has-text('Requeue 2')")
        assert operator.inner_text("[role=status]") == "requeued 2 by ada"
        assert operator.locator("tbody tr").count() == 0
        operator.goto(base + "/audit")
        audit = operator.locator("tbody tr").all_inner_texts()
        reader.context.close()
        operator.context.close()
    assert len(audit) == 2
    assert "ada\trequeue\tdone\tkind=otp\t2" in audit[0]
    assert "grace\trequeue\trefused\tkind=otp\t0" in audit[1]


def test_every_page_passes_basic_accessibility_checks(
    chromium: Any, web: tuple[str, Seeded]
) -> None:
    base, rows = web
    page = _page(chromium, OPERATOR)
    for path in ("/", "/dead-letters", f"/messages/{rows.rejected[0]}", "/audit"):
        page.goto(base + path)
        facts = page.evaluate(PAGE_FACTS)
        assert facts["lang"] == "en", path
        assert facts["h1"] == 1, path
        levels = facts["levels"]
        assert levels[0] == 1
        assert all(b - a <= 1 for a, b in itertools.pairwise(levels))
        assert facts["unlabelled"] == [], path
        assert all(t["caption"] and t["unscoped"] == 0 for t in facts["tables"]), path
        reached = set()
        for _ in range(facts["focusable"] + 2):  # the skip link comes first
            page.keyboard.press("Tab")
            focused = page.evaluate(FOCUSED)
            reached.add((focused["tag"], focused["id"], focused["text"]))
        assert len(reached) >= facts["focusable"], path
    page.goto(base + "/")
    page.keyboard.press("Tab")
    assert page.evaluate(FOCUSED)["text"] == "Skip to content"
    page.context.close()
