"""softcapgrad page: the committed page is what the committed results build; one cell per verdict row; in a real
browser (headless Chromium driven by Selenium) it loads from file:// without a console error, a click shows a cell's
cause and a filter hides rows.

The browser test needs Debian's chromium and chromium-driver and the 'browser' extra; without them it is skipped and
says which is missing. SOFTCAPGRAD_PAGE_SCREENSHOT=PATH also keeps its screenshot there (make page-screenshot).
"""

from __future__ import annotations

import json
import os
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
COMMITTED = RESULTS / "page"
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def rows(name: str) -> list[dict]:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))["rows"]


class Cells(HTMLParser):
    """The cell buttons of a page: (id, verdict, the matrix's model type)."""

    def __init__(self):
        super().__init__()
        self.found, self.model = [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and "data-model" in a:
            self.model = a["data-model"]
        if tag == "button" and "data-cell" in a:
            self.found.append((a["data-cell"], a["data-verdict"], self.model))


@pytest.fixture(scope="module")
def built(tmp_path_factory, cli):
    out = tmp_path_factory.mktemp("page")
    code, report, _, err = cli("page", "--out", str(out), "--json")
    assert code == 0, err
    return out, report


def test_the_committed_page_is_what_the_committed_results_build(built):
    out, report = built
    assert sorted(p.name for p in out.iterdir()) == sorted(report["params"]["files"])
    for path in out.iterdir():
        assert path.read_bytes() == (COMMITTED / path.name).read_bytes(), f"run make page: {path.name} changed"


def test_one_cell_per_verdict_row_with_its_verdict(built):
    out, report = built
    parser = Cells()
    parser.feed((out / "index.html").read_text(encoding="utf-8"))
    expected = {f"p{i}": (r["verdict"], r["model"]) for i, r in enumerate(rows("parity.json"))}
    expected.update({f"t{i}": (r["verdict"], r["model"]) for i, r in enumerate(rows("train-parity.json"))})
    assert {cell: (verdict, model) for cell, verdict, model in parser.found} == expected
    assert len(parser.found) == len(expected)  # no cell twice
    assert sum(r["cells"] for r in report["rows"]) == len(expected)
    assert report["answer"][0].startswith("Of ")


def test_the_page_reads_incidents_where_they_exist(tmp_path, cli):
    for name in ("parity.json", "train-parity.json", "default-attention.json"):
        (tmp_path / name).symlink_to(RESULTS / name)
    code, _, _, err = cli("page", "--results", str(tmp_path), "--out", str(tmp_path / "bare"), "--json")
    assert code == 0, err
    assert 'id="incidents"' not in (tmp_path / "bare" / "index.html").read_text(encoding="utf-8")
    planted = {"answer": ["Of 1 incidents, the tool caught 1."],
               "incidents": [{"id": "x-1", "library": "ct2", "thread": "an incident <b>", "outcome": "caught",
                              "before": {"release": "ct2 1.0", "verdict": "ignored"}, "after": None, "why": ""}]}
    (tmp_path / "incidents.json").write_text(json.dumps(planted))
    code, _, _, err = cli("page", "--results", str(tmp_path), "--out", str(tmp_path / "page"), "--json")
    assert code == 0, err
    page = (tmp_path / "page" / "index.html").read_text(encoding="utf-8")
    assert 'id="incidents"' in page and "an incident &lt;b&gt;" in page and "<p>Of 1 incidents" in page
    assert "<td>ct2 1.0: ignored</td><td>—</td><td>caught</td>" in page


def test_the_committed_page_has_a_row_per_committed_incident():
    page = (COMMITTED / "index.html").read_text(encoding="utf-8")
    listed = json.loads((RESULTS / "incidents.json").read_text(encoding="utf-8"))["incidents"]
    body = page.split('<table class="incidents">')[1].split("</table>")[0]
    assert body.count("<tr><td>") == len(listed) >= 8
    for incident in listed:
        assert f"<tr><td>{incident['id']}</td>" in body


@pytest.mark.parametrize("content", [None, "{", "[]"])
def test_results_it_cannot_read_are_one_line_and_exit_2(tmp_path, cli, content):
    if content is not None:
        for name in ("parity.json", "train-parity.json", "default-attention.json"):
            (tmp_path / name).write_text(content)
    code, _, out, err = cli("page", "--results", str(tmp_path), "--out", str(tmp_path / "page"))
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("softcapgrad: error: ")
    assert not (tmp_path / "page").exists()


def _browser_missing() -> str:
    if CHROMIUM is None or DRIVER is None:
        return "no chromium or chromedriver on PATH (Debian: apt-get install -y chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[browser]')"
    return ""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = _browser_missing()
    if missing:
        pytest.skip(f"the page's browser test: {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    yield driver
    driver.quit()


@pytest.mark.slow
def test_the_page_in_a_browser(browser, built, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    out, _ = built
    browser.get((out / "index.html").as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    buttons = browser.find_elements(By.CSS_SELECTOR, "button[data-cell]")
    assert len(buttons) == len(rows("parity.json")) + len(rows("train-parity.json"))

    # a click opens the cell: its cause, as the results word it
    index = next(i for i, r in enumerate(rows("parity.json")) if r["verdict"] == "ignored" and r["engine"] == "ct2")
    cell = browser.find_element(By.CSS_SELECTOR, f'button[data-cell="p{index}"]')
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", cell)
    cell.click()
    dialog = browser.find_element(By.ID, "detail")
    assert dialog.is_displayed()
    text = dialog.text
    from softcapgrad.page.cells import MEANINGS

    row = rows("parity.json")[index]
    assert (row["hint"] or MEANINGS[row["verdict"]]) in text
    assert "ct2" in text and "reproduce" in text and "softcapgrad parity --model-type" in text
    dialog.find_element(By.ID, "detail-close").click()
    assert not dialog.is_displayed()

    # the keyboard opens one as well: Enter on a focused cell, Escape closes it
    cell.send_keys(Keys.ENTER)
    assert dialog.is_displayed()
    dialog.send_keys(Keys.ESCAPE)
    assert not dialog.is_displayed()

    # a filter hides rows: one engine leaves only its rows, one model type only its matrix
    rows_shown = lambda: [r for r in browser.find_elements(By.CSS_SELECTOR, "section.matrix tbody tr")
                          if r.is_displayed()]
    before = len(rows_shown())
    Select(browser.find_element(By.ID, "filter-engine")).select_by_value("ct2")
    after = rows_shown()
    assert 0 < len(after) < before and {r.get_attribute("data-engine") for r in after} == {"ct2"}
    Select(browser.find_element(By.ID, "filter-model")).select_by_value("gemma2")
    assert len(rows_shown()) == 2  # ct2's two routes on gemma2
    Select(browser.find_element(By.ID, "filter-verdict")).select_by_value("ignored")
    assert all("ignored" in r.get_attribute("data-verdicts").split("|") for r in rows_shown())
    browser.find_element(By.ID, "filter-reset").click()
    browser.execute_script("window.scrollTo(0, 0)")
    assert len(rows_shown()) == before

    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
    # the screenshot: gemma2's matrix with the ct2 cell opened over it
    browser.execute_script("document.getElementById('model-gemma2').scrollIntoView()")
    browser.execute_script("arguments[0].click()", cell)  # a click that scrolls nothing
    keep = os.environ.get("SOFTCAPGRAD_PAGE_SCREENSHOT")
    shot = Path(keep) if keep else tmp_path / "page.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
