"""The lab in a real browser: Playwright drives Debian's Chromium against `streamlit run app.py`.

One test: launch a real 2-rank PowerSGD run from the form, wait for the loss chart to have points,
measure how long a metric line takes from metrics.jsonl to the chart, walk the sidebar's sections
and screenshot every page into test-artifacts/, reload (a new session re-attaches to the run),
click Stop, check that no process of the run remains.  Without Chromium it skips, except under CI, where it fails.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from test_app_pages import navigation  # app.py's table of sections and pages

from commlab import api
from commlab.engine import procs

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Generous: on a loaded 2-core machine the first page load imports torch (minutes), and a 2-rank
# job can take minutes to reach its first step.
SLOW_MS = 900_000
MEASURE_S = 10  # how long write-to-screen latency is sampled once the chart is up (~300 steps)
GRACE_S = 8  # for a step to reach the screen: the slowest of 431 took 4.9 s on a loaded machine

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Records, for every step, when the loss chart first showed it (epoch ms, the clock Python's
# time.time() reads too).  Polling plotly's own data is what is on screen, whatever the markup.
OBSERVE_CHART = """() => {
  window.__shown = {};
  setInterval(() => {
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
      const loss = (gd._fullData || []).find(t => t.name === 'loss');
      if (!loss) continue;
      const xs = loss.x;
      if (!xs || !xs.length) continue;
      const now = Date.now(), last = Number(xs[xs.length - 1]);
      for (let s = 0; s <= last; s++) if (!(s in window.__shown)) window.__shown[s] = now;
    }
  }, 10);
}"""


T0 = time.monotonic()


def log(what: str) -> None:
    """Progress with elapsed seconds: shown when the test fails, so a slow step can be found."""
    print(f"[{time.monotonic() - T0:7.1f} s] {what}", flush=True)


def need_browser():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright package"
    else:
        missing = None if os.path.exists(CHROMIUM) else f"Chromium at {CHROMIUM}"
    if missing:
        message = f"{missing} is missing (see TESTING.md: apt-get install chromium, pip install playwright)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {message}")
        pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_streamlit(runs_dir: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "COMMLAB_RUNS_DIR": str(runs_dir)}
    log = open(runs_dir.parent / "streamlit.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.address", "127.0.0.1", "--server.port", str(port),
         "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + SLOW_MS / 1000
    while time.monotonic() < deadline:
        assert proc.poll() is None, (runs_dir.parent / "streamlit.log").read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5) as r:
                if r.read() == b"ok":
                    return proc
        except OSError:
            time.sleep(0.5)
    raise AssertionError("streamlit did not answer its health check")


class WriteTimes(threading.Thread):
    """When each step's line landed in metrics.jsonl, read by polling the file every few ms."""

    def __init__(self, runs_dir: Path):
        super().__init__(daemon=True)
        self.runs_dir, self.written, self.done = runs_dir, {}, threading.Event()
        self.lock = threading.Lock()  # the test reads ``written`` while this thread adds to it

    def snapshot(self) -> dict[int, float]:
        with self.lock:
            return dict(self.written)

    def run(self):
        path, offset = None, 0
        while not self.done.is_set():
            if path is None:
                found = list(self.runs_dir.glob("*/metrics.jsonl"))
                path = found[0] if found else None
            elif path.stat().st_size > offset:
                now = time.time()
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                complete = chunk[:chunk.rfind(b"\n") + 1]
                offset += len(complete)
                with self.lock:
                    for line in complete.splitlines():
                        self.written.setdefault(json.loads(line)["step"], now)
            time.sleep(0.005)


def idle(page, timeout_ms: int = SLOW_MS) -> None:
    """Wait until Streamlit has finished its rerun (its status widget goes away).

    The widget shows up a moment after a click, so it is first given a second to appear; a
    rerun too quick to show it has finished by then."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    widget = page.locator('[data-testid="stStatusWidget"]')
    try:
        widget.wait_for(state="attached", timeout=1000)
    except PlaywrightTimeout:
        return
    widget.wait_for(state="detached", timeout=timeout_ms)


def screenshot(page, name: str) -> None:
    # Chrome's own capture: Playwright's page.screenshot stalls on this page with Debian's
    # Chromium under load, while the DevTools call returns in seconds.
    import base64

    cdp = page.context.new_cdp_session(page)
    shot = cdp.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    cdp.detach()
    (ARTIFACTS / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))


def choose(page, label: str, option: str, exact: bool = False) -> None:
    page.get_by_label(label, exact=True).click()
    page.get_by_role("option", name=option, exact=exact).click()
    idle(page)


def set_number(page, label: str, value) -> None:
    box = page.locator(f'input[aria-label="{label}"]')
    box.fill(str(value))
    box.press("Enter")
    idle(page)


@pytest.mark.timeout(3600)
def test_launch_watch_stop_in_a_browser(tmp_path):
    need_browser()
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    port = free_port()
    server = start_streamlit(runs_dir, port)
    log("streamlit answers")
    writes = WriteTimes(runs_dir)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1400})
                page.set_default_timeout(SLOW_MS)
                page.goto(f"http://127.0.0.1:{port}/", timeout=SLOW_MS)
                expect(page.get_by_text("No runs yet.")).to_be_visible(timeout=SLOW_MS)
                idle(page)
                log("page 1 loaded")

                choose(page, "hook", "powersgd", exact=True)
                choose(page, "built-in workload", "mlp", exact=True)
                set_number(page, "steps", 100_000)  # runs until Stop
                set_number(page, "bucket cap (MiB)", 0.05)
                set_number(page, "stall timeout (s)", 900)
                expect(page.get_by_text("Hook implementation: commlab")).to_be_visible()
                screenshot(page, "1_Launch_and_watch_form")
                log("form filled")

                page.get_by_role("button", name="Launch").click()
                page.evaluate(OBSERVE_CHART)
                writes.start()
                page.locator(".js-plotly-plot .scatterlayer .trace").first.wait_for(timeout=SLOW_MS)
                log(f"chart has points; {len(writes.written)} steps written")
                # Steady state only: the steps written while the chart was already up, each
                # given GRACE_S to reach the screen.
                since = time.time()
                time.sleep(MEASURE_S + GRACE_S)
                shown = {int(k): v / 1000 for k, v in page.evaluate("window.__shown").items()}
                latency = write_to_screen({s: t for s, t in writes.snapshot().items()
                                           if since < t < since + MEASURE_S}, shown, time.time())
                log(f"latency measured over {latency['steps']} steps")
                assert_no_exception(page, "Launch and watch, running")
                screenshot(page, "1_Launch_and_watch")

                run = api.list_runs(runs_dir)[0]
                assert run.status() == "running", run.status_record()
                assert run.meta()["hook_impl"] == "commlab"

                # A fresh session, as after a reload or a Streamlit restart, re-attaches to the run.
                page.goto(f"http://127.0.0.1:{port}/", timeout=SLOW_MS)
                expect(page.get_by_text("Status: running")).to_be_visible(timeout=SLOW_MS)
                log("re-attached after a reload")
                page.get_by_role("button", name="Stop").click()
                expect(page.get_by_text("Status: stopped")).to_be_visible(timeout=SLOW_MS)
                idle(page)
                assert_no_exception(page, "Launch and watch, stopped")
                # A Stop the person asked for is not shown as a failure.
                assert not page.locator('[data-testid="stAlertContentError"]').count()
                screenshot(page, "1_Launch_and_watch_stopped")
                # After Stop, so that page loads do not share the two cores with the training run.
                screenshot_every_page(page)
                log("every page captured")
            finally:
                browser.close()
        assert run.status() == "stopped"
        sup = json.loads(run.file("supervisor.json").read_text())
        pids = [sup["pid"], sup["torchrun_pid"], *sup["worker_pids"]]
        assert len(sup["worker_pids"]) >= 2, sup
        assert not [pid for pid in pids if procs.alive(pid)], "a process of the run survived Stop"
        print(f"\nwrite-to-screen latency over {latency['steps']} steps: median "
              f"{latency['median_s']:.3f} s, p90 {latency['p90_s']:.3f} s, max {latency['max_s']:.3f} s")
    finally:
        writes.done.set()
        for leftover in api.list_runs(runs_dir):  # a failed test must not leave its run going
            if leftover.is_running():
                leftover.stop()
        procs.kill_tree(server.pid, grace_s=60)  # TERM, then KILL what is left after 60 s
        server.wait()


def write_to_screen(written: dict[int, float], shown: dict[int, float], now: float) -> dict:
    """Seconds from each step's line being written to the loss chart showing it; a step not
    shown yet counts with the time it has waited so far (a lower bound)."""
    assert written, "no step was written while measuring"
    steps = sorted(written)
    delays = [shown.get(s, now) - written[s] for s in steps]
    result = {"steps": len(steps), "not_shown": sum(s not in shown for s in steps),
              "median_s": statistics.median(delays),
              "p90_s": statistics.quantiles(delays, n=10)[-1] if len(delays) > 1 else delays[0],
              "max_s": max(delays), "load_average": os.getloadavg(),
              "per_step_s": dict(zip(steps, delays))}
    (ARTIFACTS / "latency.json").write_text(json.dumps(result, indent=1))
    return result


def screenshot_every_page(page) -> None:
    """The sidebar shows app.py's sections and pages in the table's order; each page opens."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    sections = navigation()
    nav = page.locator('[data-testid="stSidebarNav"]')
    # A header's own text, without its expand icon's name; textContent, as the CSS may change case.
    headers = nav.locator('[data-testid="stNavSectionHeader"] [data-testid="stMarkdownContainer"]')
    assert [h.strip() for h in headers.all_text_contents()] == list(sections)
    pages = [entry for entries in sections.values() for entry in entries]
    links = nav.locator("a")
    assert links.all_inner_texts() == [title for _, title in pages]
    loads = {}
    for file, title in pages:
        started = time.monotonic()
        links.filter(has_text=title).first.click()
        # Page headings may say more than the title ("Classroom: allreduce"): match the start.
        first_word = re.escape(title.split()[0])
        page.locator("h1").filter(has_text=re.compile(f"^{first_word}", re.I)).first.wait_for(
            timeout=SLOW_MS)
        try:
            idle(page, timeout_ms=300_000)
        except PlaywrightTimeout:  # a page that keeps working still gets its picture
            pass
        loads[Path(file).stem] = round(time.monotonic() - started, 2)
        assert_no_exception(page, file)
        screenshot(page, Path(file).stem)
        log(f"captured {Path(file).stem}: loaded in {loads[Path(file).stem]:.2f} s")
    (ARTIFACTS / "page_load_s.json").write_text(json.dumps(loads, indent=1))
    print("\npage load (s): " + ", ".join(f"{k} {v:.2f}" for k, v in loads.items()))


def assert_no_exception(page, where: str) -> None:
    """A page that shows a Python exception (Streamlit's red traceback box) fails the test."""
    shown = page.locator('[data-testid="stException"]')
    assert not shown.count(), (where, shown.all_inner_texts())
