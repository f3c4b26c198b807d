"""The web console in a real browser: headless Chromium (Debian's chromium
and chromium-driver) driven by Selenium, against a seeded `engram serve` on
each store. Checks what a person would see: scopes and key counts, values,
versions, diff markers, tombstones, an episode appended through gRPC
appearing in the open session page without a reload, tokens and tenants,
the content security policy, and markup stored in values, episodes and
facts shown as text (on the pages and in the live tail), never run. Screenshots go to
target/console-screenshots.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.support.ui import Select, WebDriverWait

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python" / "tests"))

from engram_server import ENGRAM_BIN, STORES, database_url, start_with_tokens  # noqa: E402
from engram_server import Server as Running  # noqa: E402

SHOTS = ROOT / "target" / "console-screenshots"


@dataclass
class Server:
    running: Running
    tokens: dict[str, str]

    @property
    def ui(self) -> str:
        return f"http://{self.running.http_address}/ui"



def grpc(server: Server, token: str, *args: str) -> None:
    """Writes through the CLI, as a gRPC client."""
    subprocess.run(
        [ENGRAM_BIN, *args, "--server", f"http://{server.running.address}", "--token", token],
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="module", params=STORES)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    with tempfile.TemporaryDirectory() as directory:
        roster = [("admin", "acme", True), ("user", "acme", False), ("other", "globex", True)]
        running, tokens = start_with_tokens(
            database_url(request.param, directory),
            directory,
            roster,
            # Three episodes per session, so a live tail sees evictions.
            env={"ENGRAM_MAX_EVENTS_PER_SESSION": "3"},
        )
        served = Server(running, tokens)
        admin = tokens["admin"]
        grpc(served, admin, "memory", "set", "style", '{"tone": "dry", "emoji": false}', "--scope", "team")
        grpc(served, admin, "memory", "set", "style", '{"tone": "warm", "emoji": false}', "--scope", "team")
        grpc(served, admin, "memory", "set", "deploy/plan", '"blue green"', "--scope", "team")
        grpc(served, admin, "memory", "delete", "deploy/plan", "--scope", "team")
        grpc(served, admin, "episodes", "append", "chat-1", "hello there", "--app", "bot", "--user", "alice")
        grpc(served, admin, "episodes", "append", "chat-2", "delete me", "--app", "bot", "--user", "bob")
        grpc(served, admin, "working", "remember", "alice prefers dry humour", "--session", "chat-1")
        grpc(
            served, admin, "rules", "create", "prefs", "--filter", "type = observation", "--every-n-episodes", "5",
            "--emits", "semantic",
        )
        grpc(served, tokens["other"], "memory", "set", "secret-plan", '"globex only"', "--scope", "globex-team")
        yield served
        running.stop()


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"]:
        options.add_argument(argument)
    driver = webdriver.Chrome(
        service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options
    )
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def shot(browser: webdriver.Chrome, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / f"{name}.png"))



def wait(browser: webdriver.Chrome, seconds: float) -> WebDriverWait[webdriver.Chrome]:
    """A wait that keeps polling through a navigation: ChromeDriver answers
    a lookup made while the page is being replaced with "aborted by
    navigation", which says nothing about the element."""
    return WebDriverWait(browser, seconds, ignored_exceptions=(WebDriverException,))


def sign_in(browser: webdriver.Chrome, server: Server, token: str) -> None:
    browser.get(server.ui)
    assert "/ui/login" in browser.current_url, "an unauthenticated visitor is asked for a token"
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    wait(browser, 10).until(expected_conditions.title_contains("Scopes"))


def test_scopes_keys_history_and_diff(server: Server, browser: webdriver.Chrome, request: pytest.FixtureRequest) -> None:
    sign_in(browser, server, server.tokens["admin"])
    body = browser.find_element(By.TAG_NAME, "main").text
    assert "team" in body and "globex-team" not in body, "only the token's tenant"
    row = browser.find_element(By.XPATH, "//a[text()='team']/ancestor::tr").text
    assert row.split()[-2:] == ["1", "0"], f"one live key (the other is a tombstone): {row}"
    shot(browser, f"scopes-{request.node.callspec.id}")

    browser.find_element(By.LINK_TEXT, "team").click()
    wait(browser, 10).until(expected_conditions.title_contains("team"))
    assert "style" in browser.find_element(By.TAG_NAME, "table").text
    assert "deploy/plan" not in browser.find_element(By.TAG_NAME, "table").text

    browser.find_element(By.LINK_TEXT, "style").click()
    wait(browser, 10).until(expected_conditions.title_contains("style"))
    deleted = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "pre.diff del")]
    added = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "pre.diff ins")]
    assert any('"tone": "dry"' in line for line in deleted), deleted
    assert any('"tone": "warm"' in line for line in added), added
    versions = [row.text.split()[0] for row in browser.find_elements(By.CSS_SELECTOR, "table tbody tr")]
    assert versions == ["2", "1"]
    shot(browser, f"key-diff-{request.node.callspec.id}")

    # A tombstone is marked in the history; the URL can be shared.
    browser.get(f"{server.ui}/key?type=namespace&scope=team&key=deploy%2Fplan")
    rows = browser.find_elements(By.CSS_SELECTOR, "table tbody tr")
    assert "tombstone" in rows[0].text and "tombstone" in (rows[0].get_attribute("class") or "")
    assert '"blue green"' in rows[1].text


def test_a_session_tails_live_and_shows_working_memory(
    server: Server, browser: webdriver.Chrome, request: pytest.FixtureRequest
) -> None:
    sign_in(browser, server, server.tokens["admin"])
    browser.get(f"{server.ui}/session?id=chat-1")
    assert "hello there" in browser.find_element(By.ID, "episodes").text
    assert browser.find_element(By.ID, "episode-count").text == "1"
    assert "MEMORY" in browser.find_element(By.CSS_SELECTOR, "pre.block").text.upper()
    wait(browser, 10).until(
        lambda b: b.find_element(By.ID, "live").text.startswith("Live")
    )
    grpc(server, server.tokens["admin"], "episodes", "append", "chat-1", "appended while watching")
    wait(browser, 20).until(
        lambda b: "appended while watching" in b.find_element(By.ID, "episodes").text
    )
    seqs = [row.text.split()[0] for row in browser.find_elements(By.CSS_SELECTOR, "#episodes tr")]
    assert seqs == sorted(seqs, key=int) and len(set(seqs)) == len(seqs), seqs
    # The count follows the server's: one more, then held at the session
    # limit (3) with the evictions beside it.
    wait(browser, 20).until(lambda b: b.find_element(By.ID, "episode-count").text == "2")
    assert browser.find_element(By.ID, "episodes-evicted").text == ""
    for text in ["third", "fourth"]:
        grpc(server, server.tokens["admin"], "episodes", "append", "chat-1", text)
    wait(browser, 20).until(lambda b: b.find_element(By.ID, "episodes-evicted").text == "(1 evicted)")
    assert browser.find_element(By.ID, "episode-count").text == "3"
    assert "fourth" in browser.find_element(By.ID, "episodes").text
    shot(browser, f"session-tail-{request.node.callspec.id}")


def test_rules_facts_and_search(server: Server, browser: webdriver.Chrome) -> None:
    sign_in(browser, server, server.tokens["admin"])
    browser.find_element(By.LINK_TEXT, "Rules").click()
    wait(browser, 10).until(expected_conditions.title_contains("Rules"))
    rule = browser.find_element(By.XPATH, "//td[text()='prefs']/ancestor::tr").text
    assert "type = observation" in rule and "every 5 episodes" in rule, rule

    browser.get(f"{server.ui}/facts?app=bot&user=alice")
    facts = browser.find_element(By.TAG_NAME, "table")
    assert "alice prefers dry humour" in facts.text or "dry humour" in facts.text, facts.text
    facts.find_element(By.CSS_SELECTOR, "tbody a").click()
    wait(browser, 10).until(expected_conditions.title_contains("01"))
    versions = browser.find_element(By.TAG_NAME, "table").text
    assert "remember" in versions, versions

    # The search box, as a person would use it.
    box = browser.find_element(By.ID, "q")
    box.send_keys("warm")
    box.submit()
    wait(browser, 10).until(expected_conditions.title_contains("Search"))
    hit = browser.find_element(By.CSS_SELECTOR, "ol.hits li")
    assert "team / style" in hit.text
    assert hit.find_element(By.TAG_NAME, "mark").text.lower() == "warm"
    hit.find_element(By.LINK_TEXT, "team / style").click()
    wait(browser, 10).until(expected_conditions.title_contains("style"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "style"

    # The results page's own form keeps the words and narrows them to a
    # source: the memory entry is not among the episodes.
    browser.get(f"{server.ui}/search?q=warm")
    assert browser.find_element(By.ID, "search-q").get_attribute("value") == "warm"
    Select(browser.find_element(By.ID, "search-source")).select_by_value("episodes")
    browser.find_element(By.ID, "search-q").submit()
    wait(browser, 10).until(lambda b: "source=episodes" in b.current_url)
    assert "team / style" not in browser.find_element(By.TAG_NAME, "main").text
    assert Select(browser.find_element(By.ID, "search-source")).first_selected_option.text == "episodes"


def test_a_scope_and_a_session_export_as_json_lines(server: Server, browser: webdriver.Chrome) -> None:
    sign_in(browser, server, server.tokens["admin"])
    browser.get(f"{server.ui}/scope?type=namespace&scope=team")
    href = browser.find_element(By.LINK_TEXT, "Export (JSON Lines)").get_attribute("href") or ""
    path = href.split("/ui", 1)[1]
    records = [json.loads(line) for line in get(server, path, server.tokens["admin"]).splitlines()]
    assert records[0]["kind"] == "header" and records[0]["selection"] == "scope namespace/team"
    assert {r["key"] for r in records[1:] if r["kind"] == "memory_version"} >= {"style"}
    # The download is whole: it ends with the end line, counting the lines
    # before it, which an import checks.
    assert records[-1] == {"kind": "end", "lines": len(records) - 1}
    session = [json.loads(line) for line in get(server, "/export?session=chat-1", server.tokens["admin"]).splitlines()]
    assert [r["kind"] for r in session[:3]] == ["header", "session", "episode"]
    assert session[-1] == {"kind": "end", "lines": len(session) - 1}


def test_tenants_tokens_and_headers(server: Server, browser: webdriver.Chrome) -> None:
    # A wrong token is refused with a message; no cookie is set.
    browser.get(f"{server.ui}/login")
    browser.find_element(By.ID, "token").send_keys("eg_not-a-token")
    browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    # The refusal is a new page: wait for it, not for the click to return.
    alert = wait(browser, 10).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "[role=alert]"))
    )
    assert "not valid" in alert.text
    assert browser.get_cookie("engram_token") is None

    # Another tenant sees its own scopes only.
    browser.delete_all_cookies()
    sign_in(browser, server, server.tokens["other"])
    body = browser.find_element(By.TAG_NAME, "main").text
    assert "globex-team" in body and "team\n" not in body
    cookie = browser.get_cookie("engram_token")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    # Every page says what it may load.
    with urllib.request.urlopen(f"{server.ui}/login") as response:
        policy = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy


def get(server: Server, path: str, token: str) -> str:
    request = urllib.request.Request(f"{server.ui}{path}", headers={"Cookie": f"engram_token={token}"})
    with urllib.request.urlopen(request) as response:
        return str(response.read().decode())


def post(server: Server, path: str, token: str, form: dict[str, str], origin: str | None = None) -> int:
    """A form post as another site would send it, with the visitor's cookie."""
    request = urllib.request.Request(
        f"{server.ui}{path}",
        data=urllib.parse.urlencode(form).encode(),
        headers={"Cookie": f"engram_token={token}", **({"Origin": origin} if origin else {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_admin_actions_are_for_admins_and_refuse_forgeries(
    server: Server, browser: webdriver.Chrome, request: pytest.FixtureRequest
) -> None:
    # Not an admin: no actions shown.
    sign_in(browser, server, server.tokens["user"])
    browser.get(f"{server.ui}/scope?type=namespace&scope=team")
    assert not browser.find_elements(By.CSS_SELECTOR, "form.admin")
    browser.get(f"{server.ui}/session?id=chat-2")
    assert not browser.find_elements(By.CSS_SELECTOR, "form.admin")

    # An admin: a purge is previewed first, then confirmed.
    browser.delete_all_cookies()
    sign_in(browser, server, server.tokens["admin"])
    browser.get(f"{server.ui}/scope?type=namespace&scope=team")
    browser.find_element(By.CSS_SELECTOR, "form.admin button[type=submit]").click()
    wait(browser, 10).until(expected_conditions.title_contains("Purge preview"))
    preview = browser.find_element(By.CSS_SELECTOR, "[role=status]").text
    assert "would delete 1 version of 1 key" in preview, preview
    shot(browser, f"purge-preview-{request.node.callspec.id}")
    history = get(server, "/key?type=namespace&scope=team&key=style", server.tokens["admin"])
    assert history.count('<td class="num">') >= 2, "a preview deletes nothing"
    browser.find_element(By.CSS_SELECTOR, "button.danger").click()
    wait(browser, 10).until(expected_conditions.title_contains("Purged"))
    assert "Deleted 1 version of 1 key" in browser.find_element(By.CSS_SELECTOR, "[role=status]").text
    browser.get(f"{server.ui}/key?type=namespace&scope=team&key=style")
    assert [r.text.split()[0] for r in browser.find_elements(By.CSS_SELECTOR, "table tbody tr")] == ["2"]
    browser.get(f"{server.ui}/log?type=namespace&scope=team")
    assert "purge" in browser.find_element(By.TAG_NAME, "table").text

    # Forgeries: the admin's cookie without the form's token, or from
    # another origin, is refused and deletes nothing.
    browser.get(f"{server.ui}/session?id=chat-2")
    csrf = browser.find_element(By.CSS_SELECTOR, "form.admin input[name=csrf]").get_attribute("value") or ""
    admin = server.tokens["admin"]
    assert post(server, "/session/delete", admin, {"id": "chat-2", "csrf": "forged"}) == 403
    assert post(server, "/session/delete", admin, {"id": "chat-2", "csrf": csrf}, origin="http://evil.example") == 403
    assert "delete me" in get(server, "/session?id=chat-2", admin)

    # The real button deletes it.
    browser.find_element(By.CSS_SELECTOR, "form.admin button.danger").click()
    wait(browser, 10).until(expected_conditions.title_contains("Sessions"))
    assert "chat-2" not in browser.find_element(By.TAG_NAME, "main").text


def test_a_fact_leads_to_the_episodes_it_came_from(server: Server, browser: webdriver.Chrome) -> None:
    admin = server.tokens["admin"]
    said = '{"subject": "carol", "predicate": "prefers", "object": "green tea"}'
    grpc(server, admin, "episodes", "append", "chat-3", "I like green tea", "--app", "bot", "--user", "carol",
         "--id", "ep-tea", "--metadata", said)
    grpc(server, admin, "rules", "create", "subjects", "--filter", "type = observation AND metadata.subject:*",
         "--every-n-episodes", "100", "--emits", "semantic")
    grpc(server, admin, "rules", "run", "subjects")

    sign_in(browser, server, admin)
    browser.get(f"{server.ui}/facts?app=bot&user=carol")
    browser.find_element(By.CSS_SELECTOR, "tbody a").click()
    wait(browser, 10).until(expected_conditions.presence_of_element_located((By.LINK_TEXT, "ep-tea")))
    assert "green tea" in browser.find_element(By.TAG_NAME, "table").text
    browser.find_element(By.LINK_TEXT, "ep-tea").click()
    wait(browser, 10).until(expected_conditions.title_contains("ep-tea"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "Episode ep-tea"
    assert "I like green tea" in browser.find_element(By.CSS_SELECTOR, "pre.block").text
    browser.find_element(By.LINK_TEXT, "chat-3 #1").click()
    wait(browser, 10).until(expected_conditions.title_contains("chat-3"))
    assert "I like green tea" in browser.find_element(By.ID, "episode-ep-tea").text

    browser.get(f"{server.ui}/episode?id=no-such-episode")
    assert "EPISODE_NOT_FOUND" in browser.page_source or "does not exist" in browser.page_source


# Markup an agent or a user stored: shown as text on every page, never run.
HOSTILE = "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"


def shown_as_text(browser: webdriver.Chrome, page: str, literal: bool = True) -> None:
    text = browser.find_element(By.TAG_NAME, "main").text
    if literal:
        assert "<img src=x onerror=" in text and "<script>" in text, f"{page}: {text}"
    made = browser.execute_script(
        "return document.querySelectorAll(\"img[src='x']\").length"
        " + [...document.scripts].filter(s => s.text.includes('pwned')).length"
    )
    assert made == 0, f"{page}: the stored markup became elements"
    assert "pwned" not in browser.title, page


def test_stored_markup_is_shown_as_text(server: Server, browser: webdriver.Chrome) -> None:
    admin = server.tokens["admin"]
    grpc(server, admin, "memory", "set", "note", json.dumps(f"zebra {HOSTILE}"), "--scope", "xss")
    grpc(server, admin, "episodes", "append", "chat-x", f"zebra {HOSTILE}", "--app", "bot", "--user", "mallory")
    grpc(server, admin, "working", "remember", f"mallory wrote {HOSTILE}", "--session", "chat-x")

    sign_in(browser, server, admin)
    for path in ["/key?type=namespace&scope=xss&key=note", "/session?id=chat-x", "/facts?app=bot&user=mallory"]:
        browser.get(f"{server.ui}{path}")
        shown_as_text(browser, path)
    # Snippets are made from the words search reads, markup left out.
    browser.get(f"{server.ui}/search?q=zebra")
    hits = [hit.text for hit in browser.find_elements(By.CSS_SELECTOR, "ol.hits li")]
    # The value and the episode (and a fact, once the module's rule has
    # promoted the episode).
    assert all("zebra" in hit for hit in hits), hits
    for source in ["memory xss / note", "episode chat-x"]:
        assert any(hit.startswith(source) for hit in hits), (source, hits)
    shown_as_text(browser, "search", literal=False)

    # The live tail puts rows the server rendered into the open page.
    browser.get(f"{server.ui}/session?id=chat-x")
    wait(browser, 10).until(lambda b: b.find_element(By.ID, "live").text.startswith("Live"))
    grpc(server, admin, "episodes", "append", "chat-x", f"tailed {HOSTILE}")
    wait(browser, 20).until(lambda b: "tailed" in b.find_element(By.ID, "episodes").text)
    shown_as_text(browser, "the live tail")
