"""The dashboard's view (dashboard.html) in a real headless Chromium, embedded the way an MCP Apps
host embeds it (SEP-1865): a sandboxed iframe (scripts only, an opaque origin) whose document is
the ui:// resource read over MCP with the extension's restrictive Content-Security-Policy put in
front, and a host page that answers ui/initialize, waits for ui/notifications/initialized and then
hands over the tool input and a real tools/call result of the dashboard tool against the simulator.
The tests look at what rendered. Skipped, with the reason, where Chromium or chromedriver is missing
(.ci/run installs Debian's chromium and chromium-driver).

    python tests/test_dashboard_view.py docs/     # writes docs/dashboard.png and docs/dashboard-dark.png
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import conftest  # first: it puts the project on the path (run as a script too)
from conftest import stdio_session  # noqa: E402
import simulator  # noqa: E402
import webdriver  # noqa: E402
from test_dashboard import APP_MIME, APPS, MONITOR, build_lab  # noqa: E402

pytestmark = pytest.mark.skipif(webdriver.missing() is not None, reason=str(webdriver.missing()))

# The host's policy for a view that declares no domains (SEP-1865, "Host Behavior": the restrictive
# default), plus what a sandbox proxy adds (no frames, no plugins, no base).
CSP = ("default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; media-src 'self' data:; connect-src 'none'; frame-src 'none'; object-src 'none'; "
       "base-uri 'self'")
# Put in front of the view by the host, as a sandbox proxy would: records what went wrong inside
# (script errors, refused loads), for the tests to read.
PROBE = ("<script>window.__problems=[];addEventListener('securitypolicyviolation',e=>__problems.push("
         "'csp: '+e.violatedDirective+' '+e.blockedURI));addEventListener('error',e=>__problems.push("
         "'error: '+e.message));addEventListener('unhandledrejection',e=>__problems.push('rejection: '+e.reason));"
         "</script>")

HOST_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>MCP Apps host</title>
<style>body{margin:0;background:#888}iframe{border:0;width:%(width)dpx;height:200px;display:block}</style></head>
<body><script>
const VIEW = %(view)s, RESULT = %(result)s, ARGS = %(arguments)s, THEME = %(theme)s, CSP = %(csp)s, PROBE = %(probe)s;
window.hostLog = [];
const frame = document.createElement("iframe");
frame.setAttribute("sandbox", "allow-scripts");
const policy = '<meta http-equiv="Content-Security-Policy" content="' + CSP + '">';
frame.srcdoc = VIEW.replace("<head>", "<head>" + policy + PROBE);
document.body.append(frame);
const post = (message) => frame.contentWindow.postMessage(Object.assign({jsonrpc: "2.0"}, message), "*");
window.addEventListener("message", (event) => {
  if (event.source !== frame.contentWindow) return;
  const message = event.data;
  hostLog.push(message.method || "response");
  if (message.method === "ui/initialize") {
    post({id: message.id, result: {protocolVersion: "2026-01-26", hostInfo: {name: "test-host", version: "1"},
          hostCapabilities: {}, hostContext: {theme: THEME, displayMode: "inline", platform: "web",
          containerDimensions: {width: %(width)d, maxHeight: 6000}}}});
  } else if (message.method === "ui/notifications/initialized") {
    post({method: "ui/notifications/tool-input", params: {arguments: ARGS}});
    post({method: "ui/notifications/tool-result", params: RESULT});
  } else if (message.method === "ui/notifications/size-changed") {
    frame.style.height = message.params.height + "px";
  }
});
</script></body></html>
"""

WAIT_FOR_RENDER = """
const done = arguments[arguments.length - 1];
const check = () => { if (document.documentElement.dataset.rendered) { done(true); return true; } return false; };
if (!check()) new MutationObserver(check).observe(document.documentElement, {attributes: true});
"""


def js(value: Any) -> str:
    """A value as a JavaScript literal inside a <script> element."""
    return json.dumps(value).replace("</", "<\\/")


def host_page(tmp: Path, view: str, result: dict, *, theme: str = "light", arguments: dict | None = None,
              width: int = 1000) -> str:
    page = tmp / f"host-{theme}.html"
    page.write_text(HOST_PAGE % {"view": js(view), "result": js(result), "arguments": js(arguments or {}),
                                 "theme": js(theme), "csp": js(CSP), "probe": js(PROBE), "width": width})
    return page.as_uri()


def show(browser: webdriver.Browser, url: str) -> None:
    """Open the host page and enter the view once it has drawn the result."""
    browser.open(url)
    browser.enter_frame("iframe")
    browser.run_async(WAIT_FOR_RENDER)


def real_result(sim: simulator.Simulator, arguments: dict | None = None) -> tuple[str, dict, dict]:
    """The view's HTML (resources/read) and a dashboard tools/call result, over MCP from a client that
    declares MCP Apps; the result as the host hands it on (the wire's camelCase) and its answer."""
    from mcp.client.extension import advertise
    # the reader token with the README's optional backup grant, as in test_dashboard.py
    with stdio_session(sim.env(pve_token="mcp@pve!backups") | MONITOR, log_name="dashboard-view",
                       extensions=[advertise(APPS, {"mimeTypes": [APP_MIME]})]) as client:
        resource = client.portal.call(client.client.read_resource, "ui://proxmox/dashboard.html").contents[0]
        assert resource.mime_type == APP_MIME
        result = client.call("dashboard", arguments or {})
    wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    return resource.text, wire, json.loads(result.content[0].text)


@pytest.fixture(scope="module")
def sim():
    with simulator.Simulator(build_lab()) as running:
        yield running
        assert running.lab.schema_rejections == []


@pytest.fixture(scope="module")
def drawn(sim):
    return real_result(sim)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    started = webdriver.Browser(tmp_path_factory.mktemp("chromium-profile"))
    yield started
    started.close()


def rows(part: dict) -> list[dict]:
    return [dict(zip(part["columns"], row, strict=True)) for row in part["rows"]]


def test_the_host_and_the_view_speak_the_protocol(browser, drawn, tmp_path):
    view, result, _ = drawn
    show(browser, host_page(tmp_path, view, result))
    assert browser.run("return window.__problems") == []
    assert browser.run("return performance.getEntriesByType('resource').map(e => e.name)") == []  # nothing fetched
    browser.leave_frame()
    log = browser.run("return window.hostLog")
    assert log[:2] == ["ui/initialize", "ui/notifications/initialized"] and "ui/notifications/size-changed" in log
    assert browser.run("return document.querySelector('iframe').getBoundingClientRect().height") > 400


def test_nodes_with_cpu_memory_and_storage_bars(browser, drawn, tmp_path):
    view, result, answer = drawn
    show(browser, host_page(tmp_path, view, result))
    cards = browser.run("""return [...document.querySelectorAll('.node[data-node]')].map(card => ({
        node: card.dataset.node,
        meters: [...card.querySelectorAll('[data-meter]')].map(m => [m.dataset.meter,
                 Number(m.querySelector('rect.fill').getAttribute('width'))])}))""")
    nodes = rows(answer["nodes"])
    assert [c["node"] for c in cards] == [n["node"] for n in nodes] == ["pve1", "pve2", "pve3"]
    for card, node in zip(cards, nodes, strict=True):
        meters = dict(card["meters"])
        assert meters["CPU"] == node["cpu_pct"] and meters["Memory"] == node["mem_pct"]
        assert {"local", "local-lvm"} <= set(meters)  # each node's own storages under it
    shared = browser.run("return [...document.querySelectorAll('.node-shared [data-meter]')].map(m => m.dataset.meter)")
    assert sorted(shared) == ["pbs"]
    level = browser.run("return document.querySelector('.node-shared [data-meter=\"pbs\"] rect.fill')"
                        ".getAttribute('class')")
    assert "lvl-crit" in level  # 95 % full


CHARTS = """return [...document.querySelectorAll('.guest[data-vmid]')].map(g => ({
    vmid: Number(g.dataset.vmid),
    charts: Object.fromEntries([...g.querySelectorAll('svg.chart')].map(c => [c.dataset.chart,
        [...c.querySelectorAll('path.line')].map(p => p.getAttribute('d').split('L').length)]))}))"""


def test_the_busiest_guests_with_their_charts(browser, drawn, tmp_path):
    view, result, answer = drawn
    show(browser, host_page(tmp_path, view, result))
    cards = browser.run(CHARTS)
    assert [c["vmid"] for c in cards] == [g["vmid"] for g in rows(answer["guests"])] and len(cards) == 4
    points = {c["vmid"]: c["series"] for c in result["structuredContent"]["charts"]}
    for card in cards:
        # a line through every point of the hour: CPU, memory, and the network in and out
        assert card["charts"] == {"cpu": [len(points[card["vmid"]]["cpu"])], "mem": [60], "net": [60, 60]}, card
    heading = browser.run("return document.querySelector('#guests h2').textContent")
    assert "busiest by CPU now" in heading and "4 of 6 running" in heading


def test_the_backup_matrix_cells(browser, drawn, tmp_path):
    view, result, answer = drawn
    show(browser, host_page(tmp_path, view, result))
    matrix = browser.run("""return [...document.querySelectorAll('table.matrix tbody tr')].map(tr => ({
        vmid: Number(tr.dataset.vmid), state: tr.querySelector('td.cell').dataset.state,
        marks: Object.fromEntries([...tr.querySelectorAll('td.mark')].map(td => [td.dataset.job, td.dataset.mark])),
        drawn: tr.querySelectorAll('td.mark svg circle').length}))""")
    expected = rows(answer["backups"])
    assert [(m["vmid"], m["state"]) for m in matrix] == [(r["vmid"], r["state"]) for r in expected]
    assert [m["marks"] for m in matrix] == [{"backup-nightly": r["backup-nightly"] or "none"} for r in expected]
    assert all(m["drawn"] == 1 for m in matrix)  # a mark for covers and for excludes
    assert [m["state"] for m in matrix][:3] == ["missing", "missing", "stale"]
    headers = browser.run("return [...document.querySelectorAll('table.matrix th.job')].map(th => th.textContent)")
    assert headers == ["backup-nightly"]


def test_the_health_findings(browser, drawn, tmp_path):
    view, result, answer = drawn
    show(browser, host_page(tmp_path, view, result))
    findings = browser.run("""return [...document.querySelectorAll('.finding')].map(f =>
        [...f.children].map(c => c.textContent))""")
    assert findings == answer["health"]["rows"] and findings
    chips = browser.run("return document.querySelector('.chips').textContent")
    assert f"{answer['health']['summary']['critical']} critical" in chips and "3/3 nodes online" in chips


def luminance(css_color: str) -> float:
    """Relative luminance (WCAG) of an rgb()/rgba() colour."""
    channels = [float(c) / 255 for c in css_color[css_color.index("(") + 1:css_color.index(")")].split(",")[:3]]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_readable_in_light_and_dark(browser, drawn, tmp_path, theme):
    view, result, _ = drawn
    show(browser, host_page(tmp_path, view, result, theme=theme))
    colours = browser.run("""const style = (selector) => getComputedStyle(document.querySelector(selector));
        return {bg: style('body').backgroundColor, fg: style('body').color, muted: style('h2').color,
                card: style('.card').backgroundColor, cardFg: style('.card h3').color,
                states: [...document.querySelectorAll('.state')].map(e => [getComputedStyle(e).color,
                                                                            getComputedStyle(e).backgroundColor]),
                severities: [...document.querySelectorAll('.sev')].map(e => getComputedStyle(e).color)}""")
    assert (luminance(colours["bg"]) > 0.8) == (theme == "light"), colours
    assert contrast(colours["fg"], colours["bg"]) >= 7 and contrast(colours["cardFg"], colours["card"]) >= 7, colours
    # WCAG AA (4.5:1) for the secondary text, the state labels and the severities
    assert contrast(colours["muted"], colours["bg"]) >= 4.5, colours
    assert colours["states"] and all(contrast(fg, bg) >= 4.5 for fg, bg in colours["states"]), colours
    assert colours["severities"] and all(contrast(fg, colours["bg"]) >= 4.5 for fg in colours["severities"]), colours


def test_a_text_only_result_is_drawn_the_same(browser, drawn, tmp_path):
    """A host that passes on only the text (no structuredContent) still gets the picture."""
    view, result, answer = drawn
    text_only = {k: v for k, v in result.items() if k != "structuredContent"}
    show(browser, host_page(tmp_path, view, text_only))
    assert browser.run("return [...document.querySelectorAll('.node[data-node]')].map(c => c.dataset.node)") == \
        [n["node"] for n in rows(answer["nodes"])]
    # no points: CPU and memory drawn from the answer's sparklines, a point per character
    sparks = [{name: [len(line[name].split(" ")[-1])] for name in ("cpu", "mem")} for line in
              answer["guests"]["last_hour"]]
    assert [c["charts"] for c in browser.run(CHARTS)] == sparks and sparks[0]["cpu"][0] > 10


def test_a_failed_call_is_shown_as_the_error(browser, drawn, tmp_path):
    view, _, _ = drawn
    failed = {"content": [{"type": "text", "text": "No guest with vmid 990 on host 'lab'."}], "isError": True}
    show(browser, host_page(tmp_path, view, failed))
    assert browser.run("return document.getElementById('error').textContent") == "No guest with vmid 990 on host 'lab'."


def test_what_was_not_read_and_what_is_down_are_shown(browser, drawn, tmp_path):
    view, result, _ = drawn
    changed = json.loads(json.dumps(result))
    data = changed["structuredContent"]
    data["nodes"]["rows"][2][1] = "offline"  # pve3
    data["backups"]["unavailable"] = ["pbs:backup", "+3 more"]
    data["backups"]["more"] = 7
    show(browser, host_page(tmp_path, view, changed))
    assert browser.run("return document.querySelector('[data-node=\"pve3\"] .status circle').getAttribute('class')") \
        == "dot-crit"
    notes = browser.run("return [...document.querySelectorAll('#backups .note')].map(n => n.textContent)")
    assert "Not read: pbs:backup, +3 more" in notes and "+7 more guests (backup_coverage pages through them)" in notes


def test_text_from_proxmox_is_never_markup(browser, drawn, tmp_path):
    """A guest name or finding that looks like HTML is shown as text: nothing it holds runs."""
    view, result, _ = drawn
    hostile = json.loads(json.dumps(result))
    hostile["structuredContent"]["health"]["rows"][0][2] = '<img src=x onerror="window.__owned=1">evil'
    show(browser, host_page(tmp_path, view, hostile))
    assert browser.run("return [window.__owned || 0, document.querySelectorAll('#health img').length]") == [0, 0]
    assert '<img src=x onerror="window.__owned=1">evil' in browser.run(
        "return document.querySelector('.finding span:last-child').textContent")


# ---------------------------------------------------------------- the README's screenshots

def screenshots(folder: Path) -> list[Path]:
    """docs/dashboard.png and docs/dashboard-dark.png: the view of the simulated homelab."""
    written = []
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        sim = stack.enter_context(simulator.Simulator(build_lab()))
        view, result, _ = real_result(sim)
        browser = webdriver.Browser(tmp / "profile", width=1000, height=2400)
        stack.callback(browser.close)
        for theme, name in (("light", "dashboard.png"), ("dark", "dashboard-dark.png")):
            show(browser, host_page(tmp, view, result, theme=theme, width=980))
            browser.leave_frame()
            (folder / name).write_bytes(browser.screenshot("iframe"))
            written.append(folder / name)
    return written


def test_the_readmes_screenshot_command_remakes_both_screenshots(tmp_path):
    """`python tests/test_dashboard_view.py docs/` (README, Test) runs outside pytest."""
    done = subprocess.run([sys.executable, str(Path(__file__)), str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=conftest.server_env({}))
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["dashboard-dark.png", "dashboard.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in tmp_path.glob("*.png"))


if __name__ == "__main__":
    if webdriver.missing():
        sys.exit(webdriver.missing())
    with conftest.as_a_script():  # run as a script: state and the servers' logs in a throwaway folder
        for path in screenshots(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")):
            print(f"wrote {path}")
