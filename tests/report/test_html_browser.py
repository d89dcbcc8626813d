"""report.html in a real headless Chromium: verdict and key numbers in the rendered DOM, every
plot decoded, no console errors, no network request; a screenshot is saved.

Needs the Debian package ``chromium`` (CI: ``apt-get update && apt-get install -y chromium``)
and the ``playwright`` Python package (dev extra). Playwright's own browser download is never
used: we launch the system Chromium. A missing browser FAILS this test (it must run in CI).
Set DPAUDIT_CHROMIUM to use another binary; set DPAUDIT_ARTIFACTS to also copy the screenshot
to ``test-artifacts/report.png`` under the repository.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_report

from dpaudit_torch.report import HTML_NAME, AuditReport, format_number

REPO = Path(__file__).resolve().parents[2]
APT_HINT = "apt-get update && apt-get install -y chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # small /dev/shm in CI containers
]

pytestmark = pytest.mark.timeout(300)


def find_chromium() -> str | None:
    """The system Chromium: $DPAUDIT_CHROMIUM, /usr/bin/chromium, or chromium on PATH."""
    env = os.environ.get("DPAUDIT_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = find_chromium()
    if exe is None:
        pytest.fail(f"Chromium not found (install it with: {APT_HINT})", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # a missing dev dependency is a failure, not a skip
        pytest.fail(f"the playwright package is missing ({exc}); pip install -e '.[dev]'",
                    pytrace=False)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _open(browser: Any, html_path: Path) -> tuple[Any, Any, list[str], list[str]]:
    """Open a page; record console errors / page errors and any non-file request."""
    context = browser.new_context(viewport={"width": 1200, "height": 900}, offline=True)
    page = context.new_page()
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url[:80]}"))

    def route(r: Any) -> None:
        url = r.request.url
        if url.startswith("file://") or url.startswith("data:"):
            r.continue_()
        else:
            requests.append(url)
            r.abort()

    page.route("**/*", route)
    page.goto(html_path.as_uri(), wait_until="load")
    return context, page, errors, requests


def _field(d: dict[str, Any], path: str) -> Any:
    value: Any = d
    for part in path.split("."):
        value = value[part]
    return value


def _check_page(page: Any, report: AuditReport) -> list[str]:
    d = report.to_dict()
    verdict = page.locator("#verdict-text")
    assert verdict.is_visible()
    assert verdict.inner_text() == report.verdict
    # the verdict is the first thing on the page after the title
    top = page.evaluate("document.querySelector('#verdict').getBoundingClientRect().top")
    assert 0 < top < 200
    # every tagged number: visible, written as the report writes it, equal to the field
    tagged = page.eval_on_selector_all(
        "[data-field]",
        "els => els.map(e => ({field: e.dataset.field, value: e.dataset.value ?? null, "
        "text: e.innerText, visible: !!(e.offsetWidth || e.offsetHeight)}))",
    )
    assert tagged
    fields = []
    for t in tagged:
        assert t["visible"], t
        if t["field"] == "verdict":
            continue
        expected = _field(d, t["field"])
        if t["field"] == "schema_version":
            assert t["text"] == expected
        else:
            assert t["text"] == format_number(expected), t
            raw = json.loads(t["value"])
            assert raw == expected or (raw == "Infinity" and expected == math.inf), t
        fields.append(t["field"])
    # the key numbers are in the visible text of the page
    body = page.inner_text("body")
    assert report.verdict in body
    assert format_number(report.claimed_epsilon) in body
    for bound in report.epsilon_lower_bounds.values():
        assert format_number(bound) in body
    # every plot decoded by the browser, or a visible sentence saying why there is nothing
    imgs = page.eval_on_selector_all(
        "img", "els => els.map(e => [e.complete, e.naturalWidth, e.naturalHeight])"
    )
    assert all(c and w > 100 and h > 100 for c, w, h in imgs), imgs
    nodata = page.locator(".nodata").count()
    assert len(imgs) + nodata == 3
    return fields


def _screenshot(page: Any, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_chromium_is_found() -> None:
    exe = find_chromium()
    assert exe is not None, f"Chromium not found (install it with: {APT_HINT})"


def test_report_renders_in_chromium(browser: Any, tmp_path: Path) -> None:
    report = make_report("violation")
    out = report.save(tmp_path / "violation")
    context, page, errors, requests = _open(browser, out / HTML_NAME)
    try:
        fields = _check_page(page, report)
        assert {"claimed_epsilon", "violation_step", "epsilon_lower_bounds.steinke",
                "epsilon_lower_bounds.fdp", "epsilon_lower_bounds.sequential",
                "lower_bound_details.steinke.ceiling"} <= set(fields)
        assert page.locator("img").count() == 3
        # the whole-run bounds in one table, the per-step bound in another
        assert page.locator("#bounds-table tbody tr").count() == 2
        assert page.locator("#per-step-bound-table tbody tr").count() == 1
        shot = tmp_path / "report.png"
        _screenshot(page, shot)
        if os.environ.get("DPAUDIT_ARTIFACTS"):
            art = REPO / "test-artifacts"
            art.mkdir(exist_ok=True)
            shutil.copyfile(shot, art / "report.png")
    finally:
        context.close()
    assert errors == [], errors
    assert requests == [], requests


@pytest.mark.parametrize("kind", ["refuted", "nothing", "empty"])
def test_other_verdicts_render_in_chromium(browser: Any, tmp_path: Path, kind: str) -> None:
    report = AuditReport() if kind == "empty" else make_report(kind)
    out = report.save(tmp_path / kind)
    context, page, errors, requests = _open(browser, out / HTML_NAME)
    try:
        _check_page(page, report)
        if kind == "empty":
            assert page.locator(".nodata").count() == 3
            assert "Nothing to plot" in page.inner_text("#plots")
        if kind in ("nothing", "empty"):
            assert "is not a proof of privacy" in page.inner_text("#verdict")
        _screenshot(page, tmp_path / f"{kind}.png")
    finally:
        context.close()
    assert errors == [], errors
    assert requests == [], requests
