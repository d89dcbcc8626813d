"""report.html in a real headless Chromium: verdict and key numbers in the rendered DOM, every
plot decoded, no console errors, no network request; a screenshot is saved.

Needs a system Chromium and the ``playwright`` Python package (dev extra). Playwright's own
browser download is never used: we launch the system Chromium, found as ``$DPAUDIT_CHROMIUM``
(only it, when set; set but empty: search nothing), else ``/usr/bin/chromium`` (Debian's
package ``chromium``, which ``.ci/run`` installs), else ``chromium`` or ``chromium-browser`` on
PATH. Without one, the browser tests are SKIPPED with a line saying how to enable them, so that
``make test`` passes on a fresh machine without root; with ``DPAUDIT_REQUIRE_BROWSER=1`` (which
``.ci/run`` exports) a missing browser or playwright FAILS them instead
(tests/report/test_html_browser_optional.py runs this file both ways). Set DPAUDIT_ARTIFACTS to
also copy the screenshot to ``test-artifacts/report.png`` under the repository.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from conftest import make_report

from dpaudit_torch.report import HTML_NAME, AuditReport, format_number

REPO = Path(__file__).resolve().parents[2]
# The binaries searched when $DPAUDIT_CHROMIUM is unset: these paths, then these names on PATH.
SYSTEM_CHROMIUM = ("/usr/bin/chromium",)
PATH_NAMES = ("chromium", "chromium-browser")
HOW_TO_ENABLE = "apt-get install chromium (root), or set DPAUDIT_CHROMIUM=/path/to/chromium"
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


def find_chromium() -> tuple[str | None, str]:
    """The system Chromium and, when there is none, one line saying why and how to get one:
    $DPAUDIT_CHROMIUM if set (nothing else is searched; set but empty: no browser), else
    SYSTEM_CHROMIUM, else PATH_NAMES on PATH."""
    env = os.environ.get("DPAUDIT_CHROMIUM")
    if env is not None:
        if not env:
            return None, f"Chromium search disabled (DPAUDIT_CHROMIUM is empty): {HOW_TO_ENABLE}"
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env, ""
        return None, (f"Chromium not found: DPAUDIT_CHROMIUM={env} is not an executable file; "
                      "point it at a Chromium binary, or unset it to search /usr/bin/chromium "
                      "and PATH")
    for path in SYSTEM_CHROMIUM:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path, ""
    for name in PATH_NAMES:
        found = shutil.which(name)
        if found:
            return found, ""
    return None, f"Chromium not found: {HOW_TO_ENABLE}"


def browser_required() -> bool:
    """DPAUDIT_REQUIRE_BROWSER set to anything but "" or "0" (``.ci/run`` sets 1): a missing
    browser or playwright fails the browser tests instead of skipping them."""
    return os.environ.get("DPAUDIT_REQUIRE_BROWSER", "") not in ("", "0")


def _unavailable(why: str) -> NoReturn:
    if browser_required():
        pytest.fail(f"{why} [DPAUDIT_REQUIRE_BROWSER is set: the browser test is required]",
                    pytrace=False)
    pytest.skip(why)


def chromium_or_skip() -> str:
    exe, why = find_chromium()
    if exe is None:
        _unavailable(why)
    return exe


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = chromium_or_skip()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _unavailable(f"the playwright package is missing ({exc}): pip install -e '.[dev]'")
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


def _fake_chromium(folder: Path, name: str = "chromium", executable: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755 if executable else 0o644)
    return exe


def test_find_chromium_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = _fake_chromium(tmp_path / "usr-bin")
    on_path = _fake_chromium(tmp_path / "path", "chromium-browser")
    explicit = _fake_chromium(tmp_path / "explicit", "my-chromium")
    monkeypatch.setitem(globals(), "SYSTEM_CHROMIUM", (str(system),))
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.delenv("DPAUDIT_CHROMIUM", raising=False)
    assert find_chromium() == (str(system), "")
    monkeypatch.setitem(globals(), "SYSTEM_CHROMIUM", (str(tmp_path / "absent"),))
    assert find_chromium() == (str(on_path), "")
    monkeypatch.setenv("PATH", str(tmp_path / "absent"))
    assert find_chromium() == (None, f"Chromium not found: {HOW_TO_ENABLE}")
    monkeypatch.setenv("DPAUDIT_CHROMIUM", str(explicit))
    assert find_chromium() == (str(explicit), "")


def test_find_chromium_explicit_choice_is_final(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A set DPAUDIT_CHROMIUM is the only candidate: not executable, or empty, means no browser
    even though one is installed (this is how a test hides the system Chromium)."""
    monkeypatch.setitem(globals(), "SYSTEM_CHROMIUM", (str(_fake_chromium(tmp_path / "sys")),))
    monkeypatch.setenv("PATH", str(_fake_chromium(tmp_path / "path").parent))
    not_exe = _fake_chromium(tmp_path / "explicit", executable=False)
    monkeypatch.setenv("DPAUDIT_CHROMIUM", str(not_exe))
    exe, why = find_chromium()
    assert exe is None and f"DPAUDIT_CHROMIUM={not_exe} is not an executable file" in why
    monkeypatch.setenv("DPAUDIT_CHROMIUM", str(tmp_path))  # a folder is not a browser
    assert find_chromium()[0] is None
    monkeypatch.setenv("DPAUDIT_CHROMIUM", "")
    exe, why = find_chromium()
    assert exe is None and HOW_TO_ENABLE in why and "\n" not in why


def test_browser_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPAUDIT_REQUIRE_BROWSER", raising=False)
    assert not browser_required()
    for value, required in (("", False), ("0", False), ("1", True), ("true", True)):
        monkeypatch.setenv("DPAUDIT_REQUIRE_BROWSER", value)
        assert browser_required() is required


def test_chromium_is_found() -> None:
    """Skipped without a browser (make test on a fresh machine), failed under
    DPAUDIT_REQUIRE_BROWSER=1 (CI)."""
    assert os.access(chromium_or_skip(), os.X_OK)


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
