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
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

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
    pass


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
            raise WebDriverError(f"{method} {path}: {value.get('error')}: {value.get('message', '')[:500]}") from None

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
