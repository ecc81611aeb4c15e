"""The inspector in a real browser: Debian's chromium, driven by Selenium through Debian's chromedriver (both
installed by scripts/ensure-chromium, which `make test` runs; the same package version, so they always match,
and nothing is downloaded). Without them this test skips, or fails under KEEL_REQUIRE_SERVICES=1.

It does what a person would: opens the finance sample, searches "visa", opens debt:visa, moves known_at from
2026-10-02 to 2026-10-05 on debt:libranza and sees the corrected balance appear, follows a relation, and checks
that each bitemporal picture has one rectangle per version `history` lists. Screenshots are saved under
.artifacts/inspector/ (or $KEEL_TEST_ARTIFACTS/inspector/), which git ignores.
"""
from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_inspector import FINANCE, ROOT, TENANT, finance_copy, inspector_server, version_counts

import keel

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 30          # the longest a page may take to appear (a bound, not a speed goal)


@pytest.fixture(scope="module")
def artifacts() -> Path:
    folder = Path(os.environ.get("KEEL_TEST_ARTIFACTS") or ROOT / ".artifacts") / "inspector"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        reason = (f"{' and '.join(missing)} missing: Debian's chromium and chromium-driver (scripts/ensure-chromium, "
                  f"or apt-get install chromium chromium-driver)")
        if os.environ.get("KEEL_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason} but KEEL_REQUIRE_SERVICES=1")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-default-apps", "--lang=en-US"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def shoot(driver: Any, path: Path) -> None:
    """A screenshot of the whole page (the window stretched to its height), then the window as it was."""
    height, chrome = driver.execute_script("return [document.documentElement.scrollHeight, "
                                           "window.outerHeight - window.innerHeight]")
    driver.set_window_size(1280, max(int(height) + int(chrome), 600))
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 1000)


def test_a_person_reads_the_libranza_correction(tmp_path: Path, browser: Any, artifacts: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    events = finance_copy(tmp_path)
    wait = WebDriverWait(browser, WAIT_S)

    def loaded(path_part: str) -> None:
        wait.until(lambda d: path_part in d.current_url and d.execute_script("return document.readyState") == "complete")

    def fact(predicate: str) -> str:
        return str(browser.find_element(By.CSS_SELECTOR, f'tr[data-predicate="{predicate}"] td.value').text)

    with inspector_server(tmp_path, str(FINANCE), "--events", str(events)) as server, \
            keel.open(FINANCE, events=events) as graph:
        tools = graph.tools(tenant=TENANT)
        browser.get(server.base + "/")
        browser.find_element(By.LINK_TEXT, TENANT).click()
        loaded(f"/t/{TENANT}")

        # search "visa", the same hits as the search tool, and open debt:visa
        box = browser.find_element(By.ID, "q")
        box.send_keys("visa")
        box.submit()
        loaded("q=visa")
        hits = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "a.entity")]
        assert hits == [hit["entity"] for hit in tools.search("visa", limit=25)["results"]]
        shoot(browser, artifacts / "search-visa.png")
        browser.find_element(By.LINK_TEXT, "debt:visa").click()
        loaded("/e/debt:visa")
        assert browser.find_element(By.ID, "entity").text == "debt:visa"
        assert fact("balance_cop") == "3870000"
        rule = browser.find_element(By.CSS_SELECTOR, 'li[data-rule="debt_expensive"]').text
        assert "holds" in rule and "because snap-visa-2026-10" in rule
        shoot(browser, artifacts / "entity-debt-visa.png")

        # debt:libranza on 2 October as known on 2 October: the balance the agent was told, then the correction
        browser.get(server.base + f"/c/finance/t/{TENANT}/e/debt:libranza")
        for name, value in (("at", "2026-10-02"), ("known_at", "2026-10-02")):
            field = browser.find_element(By.ID, name)
            field.clear()
            field.send_keys(value)
        browser.find_element(By.ID, "show").click()
        loaded("known_at=2026-10-02")
        assert fact("balance_cop") == "12180000"
        assert "snap-libranza-2026-10" in browser.find_element(By.CSS_SELECTOR, 'tr[data-predicate="balance_cop"]').text
        check_rectangles(browser, tools.history("debt:libranza", known_at="2026-10-02"))
        shoot(browser, artifacts / "libranza-known-2026-10-02.png")

        field = browser.find_element(By.ID, "known_at")
        field.clear()
        field.send_keys("2026-10-05")
        browser.find_element(By.ID, "show").click()
        loaded("known_at=2026-10-05")
        assert "at=2026-10-02" in browser.current_url
        assert fact("balance_cop") == "12150000"
        row = browser.find_element(By.CSS_SELECTOR, 'tr[data-predicate="balance_cop"]').text
        assert "snap-libranza-2026-10-fix" in row and "corrected by human:ana" in row
        history = tools.history("debt:libranza", known_at="2026-10-05")
        check_rectangles(browser, history)
        replaced = browser.find_element(By.CSS_SELECTOR, 'svg[data-timeline="balance_cop"] rect.superseded')
        title = replaced.find_element(By.XPATH, "preceding-sibling::*[local-name()='title']")
        assert "superseded_by: snap-libranza-2026-10-fix" in title.get_attribute("textContent")
        shoot(browser, artifacts / "entity-view.png")      # docs/images/inspector-entity.png is made from this one

        # follow a relation: the household, at the same at / known_at
        browser.find_element(By.CSS_SELECTOR, 'a.related[href*="household:hogar-demo"]').click()
        loaded("/e/household:hogar-demo")
        assert browser.find_element(By.ID, "entity").text == "household:hogar-demo"
        assert "at=2026-10-02" in browser.current_url and "known_at=2026-10-05" in browser.current_url
        check_rectangles(browser, tools.history("household:hogar-demo", known_at="2026-10-05"))
        shoot(browser, artifacts / "related-household.png")
    assert all((artifacts / name).stat().st_size > 10_000 for name in
               ("search-visa.png", "entity-debt-visa.png", "entity-view.png", "related-household.png"))


def check_rectangles(browser: Any, history: dict[str, Any]) -> None:
    """Each picture has one rectangle per version of its timeline, and there is a picture per timeline."""
    from selenium.webdriver.common.by import By
    drawn: Counter[str] = Counter()
    for svg in browser.find_elements(By.CSS_SELECTOR, "svg.bitemporal"):
        drawn[svg.get_attribute("data-timeline")] = len(svg.find_elements(By.CSS_SELECTOR, "rect.version"))
    assert drawn and drawn == version_counts(history)
    rows = browser.find_elements(By.CSS_SELECTOR, "table#history tbody tr")
    assert len(rows) == sum(drawn.values())          # and one row of the history list per rectangle


def test_artifacts_are_ignored_by_git() -> None:
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert ".artifacts/" in ignored
