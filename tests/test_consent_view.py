"""The consent page of the embedded authorization server (MCP_OAUTH=1) in a real headless Chromium,
as the operator meets it: the page names the client, where the answer goes and the profile; a wrong
secret grants nothing; the right one with a chosen profile sends the browser to the client's
redirect URI with a code that the client exchanges (PKCE) for a token of that profile; what a client
registered is shown as text, never as markup; the page loads nothing. Skipped, with the reason, where
Chromium or chromedriver is missing (as tests/test_dashboard_view.py)."""
from __future__ import annotations

import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

import oauth_client as oc
import webdriver
from test_http import free_port, http_server
from test_oauth import SECRET, oauth_env

pytestmark = pytest.mark.skipif(webdriver.missing() is not None, reason=str(webdriver.missing()))


class Callback:
    """The client's redirect URI on loopback: it keeps each query it receives."""

    def __init__(self):
        self.queries: list[dict] = []
        self.arrivals: queue.Queue[dict] = queue.Queue()  # each query as it comes: the browser's redirect ended
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if not self.path.startswith("/callback"):  # the browser asks for a favicon too
                    self.send_error(404)
                    return
                query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                received.queries.append(query)
                received.arrivals.put(query)
                body = b"<!DOCTYPE html><title>client</title><p id=done>back at the client</p>"
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/callback"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def next(self) -> dict:
        """The next query the client receives (waits for the redirect, however slow the machine)."""
        return self.arrivals.get(timeout=60)


@pytest.fixture(scope="module")
def callback():
    running = Callback()
    yield running
    running.server.shutdown()
    running.server.server_close()


@pytest.fixture(scope="module")
def base(sim, tmp_path_factory):
    port = free_port()
    with http_server(oauth_env(sim, tmp_path_factory.mktemp("consent-view"), port), port=port) as url:
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    started = webdriver.Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield started
    started.close()


def open_consent(browser: webdriver.Browser, base: str, callback: Callback, name: str) -> tuple[dict, str]:
    client = oc.register(base, client_name=name, redirect_uris=[callback.url])
    verifier, challenge = oc.pkce()
    url = oc.authorize_url(base, client["client_id"], challenge).replace(
        "http%3A%2F%2F127.0.0.1%3A9%2Fcallback", callback.url.replace(":", "%3A").replace("/", "%2F"))
    browser.open(url)
    return client, verifier


def page_text(browser: webdriver.Browser) -> str:
    return browser.run("return document.body.innerText")


def test_the_operator_grants_a_chosen_profile(browser, base, callback):
    client, verifier = open_consent(browser, base, callback, "Claude")
    text = page_text(browser)
    assert "Grant access to this Proxmox MCP server?" in text and "Claude" in text and client["client_id"] in text
    assert callback.url in text and "proxmox:read proxmox:operate proxmox:admin" in text
    assert browser.run("return [...document.querySelectorAll('input[name=profile]')].map(i => [i.value, i.checked])") \
        == [["read", True], ["operate", False], ["admin", False]]  # read unless the operator chooses more
    assert browser.run("return performance.getEntriesByType('resource').length") == 0  # it loads nothing

    browser.type_into("input[name=secret]", "not-the-operators-secret")
    browser.click("button[value=grant]", loads_a_page=True)
    assert "That is not the operator's secret. Nothing was granted." in page_text(browser)
    assert callback.queries == []

    browser.click("input[value=operate]")
    browser.type_into("input[name=secret]", SECRET)
    browser.click("button[value=grant]", loads_a_page=True)
    assert browser.command("GET", "/url").startswith(callback.url + "?")
    assert page_text(browser) == "back at the client"
    answer = callback.next()
    assert answer["state"] == "st4te" and answer["iss"] == base
    tokens = oc.token(base, {"grant_type": "authorization_code", "code": answer["code"], "redirect_uri": callback.url,
                             "client_id": client["client_id"], "code_verifier": verifier}).json()
    assert tokens["scope"] == "proxmox:operate" and oc.mcp_status(base, tokens["access_token"]) == 200


def test_the_operator_denies(browser, base, callback):
    open_consent(browser, base, callback, "Someone")
    browser.click("button[value=deny]", loads_a_page=True)
    answer = callback.next()
    assert answer["error"] == "access_denied" and "code" not in answer


def test_what_a_client_registered_is_shown_as_text(browser, base, callback):
    name = '<img src=x onerror="document.title=\'owned\'"><script>document.title="owned"</script>'
    open_consent(browser, base, callback, name)
    assert name in page_text(browser)
    assert browser.run("return document.title") == "proxmox-mcp: grant access"
    assert browser.run("return document.querySelectorAll('img, script').length") == 0
