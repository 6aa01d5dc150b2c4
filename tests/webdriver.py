"""A headless Chromium driven over W3C WebDriver (Debian's chromium and chromium-driver) with the
standard library only: chromedriver answers JSON over HTTP on loopback, so urllib is the client.
For the view tests (tests/test_dashboard_view.py); nothing here is used by the server."""
from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable

CHROMIUM = ("chromium", "chromium-browser")  # Debian's package, and the name some others use
DRIVER = "chromedriver"  # Debian's chromium-driver package
ELEMENT_KEY = "element-6066-11e4-a52e-4f735466cecf"  # how W3C WebDriver marks an element reference
# The flags every test browser starts with: no sandbox (tests may run as root), nothing that
# reaches the network on its own, a profile of its own in the test's temporary directory.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def missing() -> str | None:
    """Why a browser cannot be started here (None: it can)."""
    if not any(shutil.which(name) for name in CHROMIUM):
        return "chromium is not installed (Debian: apt install chromium chromium-driver; .ci/run installs both)"
    if not shutil.which(DRIVER):
        return "chromedriver is not installed (Debian: apt install chromium-driver; .ci/run installs it)"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class WebDriverError(RuntimeError):
    def __init__(self, message: str, error: str | None = None):
        super().__init__(message)
        self.error = error  # W3C WebDriver's error code, e.g. "stale element reference"


def wait_until(predicate: Callable[[], Any], *, timeout: float = 60, every: float = 0.05, what: str = "") -> Any:
    """Poll `predicate` until it returns something true, and return that; fail after `timeout`
    seconds (bounded, however slow the machine: not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s: {what or predicate}")
        time.sleep(every)
    return result


class Browser:
    """One chromedriver process and one browser session; close() ends both."""

    def __init__(self, profile: Path, width: int = 1100, height: int = 900):
        self.port = _free_port()
        self.driver = subprocess.Popen([shutil.which(DRIVER), f"--port={self.port}"], stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True)
        self._wait_for_driver()
        binary = next(shutil.which(name) for name in CHROMIUM if shutil.which(name))
        options = {"binary": binary, "args": FLAGS + [f"--user-data-dir={profile}", f"--window-size={width},{height}"]}
        try:
            answer = self._send("POST", "/session", {"capabilities": {"alwaysMatch": {
                "browserName": "chrome", "goog:chromeOptions": options}}})
        except BaseException:
            self._stop_driver()
            raise
        self.session = f"/session/{answer['sessionId']}"

    def _wait_for_driver(self) -> None:
        """chromedriver says on stdout when it listens ("... started successfully on port N."); read
        up to that line, then keep its stdout drained so that it never blocks on a full pipe."""
        for line in self.driver.stdout:
            if "started successfully" in line:
                threading.Thread(target=self.driver.stdout.read, daemon=True, name="chromedriver-out").start()
                return
        self._stop_driver()
        raise WebDriverError(f"chromedriver ended before it listened on port {self.port}")

    def _send(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as exc:
            value = json.loads(exc.read() or b"{}").get("value") or {}
            raise WebDriverError(f"{method} {path}: {value.get('error')}: {value.get('message', '')[:500]}",
                                 value.get("error")) from None

    def command(self, method: str, path: str, body: dict | None = None) -> Any:
        return self._send(method, self.session + path, body)

    def open(self, url: str) -> None:
        self.command("POST", "/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """A script's return value, in the current frame."""
        return self.command("POST", "/execute/sync", {"script": script, "args": list(args)})

    def run_async(self, script: str, *args: Any, timeout_ms: int = 20000) -> Any:
        """An async script: it calls its last argument with the result; `timeout_ms` is the deadline."""
        self.command("POST", "/timeouts", {"script": timeout_ms})
        return self.command("POST", "/execute/async", {"script": script, "args": list(args)})

    def find(self, css: str) -> str:
        return self.command("POST", "/element", {"using": "css selector", "value": css})[ELEMENT_KEY]

    def click(self, css: str, *, loads_a_page: bool = False) -> None:
        """Click an element. With `loads_a_page` (a form's submit, a link) return only once the page
        the click asked for has replaced this one and is loaded: a click's answer does not wait for a
        form POST's response, so reading the page at once may read the old one."""
        before = self.find("html") if loads_a_page else None
        self.command("POST", f"/element/{self.find(css)}/click", {})
        if before is not None:
            wait_until(lambda: self._gone(before) and self.run("return document.readyState") == "complete",
                       what=f"the page loaded by clicking {css}")

    def type_into(self, css: str, text: str) -> None:
        self.command("POST", f"/element/{self.find(css)}/value", {"text": text})

    def _gone(self, element: str) -> bool:
        """Whether an element's document is no longer the one shown (W3C: a stale element reference)."""
        try:
            self.command("GET", f"/element/{element}/name")
        except WebDriverError as exc:
            if exc.error in ("stale element reference", "no such element"):
                return True
            raise
        return False

    def enter_frame(self, css: str) -> None:
        element = self.find(css)
        self.command("POST", "/frame", {"id": {ELEMENT_KEY: element}})

    def leave_frame(self) -> None:
        self.command("POST", "/frame/parent", {})

    def screenshot(self, css: str | None = None) -> bytes:
        """A PNG of the viewport, or of one element."""
        path = f"/element/{self.find(css)}/screenshot" if css else "/screenshot"
        return base64.b64decode(self.command("GET", path))

    def close(self) -> None:
        try:
            self.command("DELETE", "")
        except (OSError, WebDriverError):
            pass
        self._stop_driver()

    def _stop_driver(self) -> None:
        self.driver.terminate()
        try:
            self.driver.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            self.driver.wait()
