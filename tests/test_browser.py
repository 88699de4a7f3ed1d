"""The lab in a real browser: Playwright drives Debian's Chromium against `streamlit run app.py`.

One test, one server, one browser, every page visited once: launch a real 2-rank PowerSGD run
from the form, wait for the loss chart to have points, measure how long a metric line takes from
metrics.jsonl to the chart, reload (a new session re-attaches to the run), click Stop, check that
no process of the run remains; then walk the sidebar's sections, timing each page's load, pressing
its main actions (every Classroom button, the ring's step slider and ▶ Play, presentation mode;
Start sweep and Stop sweep; every Export download, checked against the block the page shows and
the run's settings) and screenshotting it into test-artifacts/.  Any exception a page shows fails
it.  Without Chromium it skips, except under CI, where it fails.

A second test reads every page as a person at a 1400 px wide window would, over 12 real runs (a
sweep's worth, made once on warm ranks) and in Classroom's presentation mode: no figure text drawn
over other text, no table off the window or over another, the columns a page is for on screen.
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
import tomllib
import urllib.request
from pathlib import Path

import pytest
from test_app_pages import navigation  # app.py's table of sections and pages

from commlab import api
from commlab.engine import procs
from commlab.tune import export
from commlab.tune import sweep as sw

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
# From the last step seen on: a watch at step 100,000 costs the browser what it costs at step 10.
OBSERVE_CHART = """() => {
  window.__shown = {};
  let seen = -1;
  setInterval(() => {
    for (const gd of document.querySelectorAll('.js-plotly-plot')) {
      const loss = (gd._fullData || []).find(t => t.name === 'loss');
      if (!loss) continue;
      const xs = loss.x;
      if (!xs || !xs.length) continue;
      const now = Date.now(), last = Number(xs[xs.length - 1]);
      for (let s = seen + 1; s <= last; s++) window.__shown[s] = now;
      seen = Math.max(seen, last);
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
                # Its traced step (1) is profiled too: the Buckets page then offers both traces.
                page.get_by_text("torch.profiler on the traced steps", exact=True).click()
                idle(page)
                expect(page.get_by_text("Hook implementation: commlab")).to_be_visible()
                screenshot(page, "1_Launch_and_watch_form")
                log("form filled")

                page.get_by_role("button", name="Launch", exact=True).click()
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
                page.get_by_role("button", name="Stop", exact=True).click()
                expect(page.get_by_text("Status: stopped")).to_be_visible(timeout=SLOW_MS)
                idle(page)
                assert_no_exception(page, "Launch and watch, stopped")
                # A Stop the person asked for is not shown as a failure.
                assert not page.locator('[data-testid="stAlertContentError"]').count()
                screenshot(page, "1_Launch_and_watch_stopped")
                # After Stop, so that page loads do not share the two cores with the training run.
                screenshot_every_page(page, {
                    "buckets": lambda page: drive_buckets(page, run),
                    "classroom": drive_classroom,
                    "sweep": lambda page: drive_sweep(page, runs_dir),
                    "export": lambda page: drive_export(page, run)})
                log("every page captured")
            finally:
                browser.close()
        assert run.status() == "stopped"
        assert_processes_gone(run)
        print(f"\nwrite-to-screen latency over {latency['steps']} steps: median "
              f"{latency['median_s']:.3f} s, p90 {latency['p90_s']:.3f} s, max {latency['max_s']:.3f} s")
    finally:
        writes.done.set()
        for leftover in sw.list_sweeps(runs_dir):  # nor its sweep, which would start more runs
            if leftover.is_running():
                leftover.request_stop()
                wait_until(lambda s=leftover: not s.is_running(), 300, "the sweep to stop")
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


def screenshot_every_page(page, actions: dict) -> None:
    """The sidebar shows app.py's sections and pages in the table's order; each page opens, and
    ``actions[stem](page)`` presses the buttons of the pages that have some, once it has loaded."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    sections = navigation()
    nav = page.locator('[data-testid="stSidebarNav"]')
    # A header's own text, without its expand icon's name; textContent, as the CSS may change case.
    headers = nav.locator('[data-testid="stNavSectionHeader"] [data-testid="stMarkdownContainer"]')
    assert [h.strip() for h in headers.all_text_contents()] == list(sections)
    pages = [entry for entries in sections.values() for entry in entries]
    assert set(actions) <= {Path(file).stem for file, _ in pages}, "a page to press is not listed"
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
        stem = Path(file).stem
        loads[stem] = round(time.monotonic() - started, 2)
        assert_no_exception(page, file)
        log(f"{stem}: loaded in {loads[stem]:.2f} s")
        if stem in actions:
            actions[stem](page)
            assert_no_exception(page, f"{file}, after its buttons")
            log(f"{stem}: buttons pressed")
        screenshot(page, stem)
    (ARTIFACTS / "page_load_s.json").write_text(json.dumps(loads, indent=1))
    print("\npage load (s): " + ", ".join(f"{k} {v:.2f}" for k, v in loads.items()))


def assert_no_exception(page, where: str) -> None:
    """A page that shows a Python exception (Streamlit's red traceback box) fails the test."""
    shown = page.locator('[data-testid="stException"]')
    assert not shown.count(), (where, shown.all_inner_texts())


def assert_processes_gone(run) -> None:
    """No process of a stopped 2-rank run is left: its supervisor, torchrun, the ranks."""
    sup = json.loads(run.file("supervisor.json").read_text())
    pids = [sup["pid"], sup["torchrun_pid"], *sup["worker_pids"]]
    assert len(sup["worker_pids"]) >= 2, sup
    assert not [pid for pid in pids if procs.alive(pid)], f"a process of {run.id} survived Stop"


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.2)


def press(page, name: str, then: str) -> None:
    """Click the button named ``name``, wait for the text ``then`` (the result it shows) and for
    the rerun to end; an exception shown on the way fails the test."""
    page.get_by_role("button", name=name, exact=True).click()
    page.get_by_text(then).first.wait_for()
    idle(page)
    assert_no_exception(page, f"after {name}")
    assert not page.get_by_text("The processes failed").count(), name


def slide(page, label: str, key: str) -> str:
    """Move a Streamlit slider with the keyboard, as a person would; returns the value it shows."""
    thumb = page.locator(f'input[type="range"][aria-label="{label}"]')
    thumb.focus()
    thumb.press(key)
    idle(page)
    return thumb.get_attribute("aria-valuetext")


def click_missed(button) -> bool:
    """Click, allowing a second for the button to be there; always False (the caller checks
    what the click did)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        button.click(timeout=1000)
    except PlaywrightTimeout:
        pass
    return False


def tab(page, name: str) -> None:
    page.get_by_role("tab", name=re.compile(re.escape(name))).click()


# After ▶ Play, plotly fires plotly_animated once the last frame is drawn.
WATCH_ANIMATION = """() => {
  window.__played = 0;
  const animated = [...document.querySelectorAll('.js-plotly-plot')]
    .filter(gd => (gd.layout.updatemenus || []).length);
  for (const gd of animated) gd.on('plotly_animated', () => { window.__played++; });
  return animated.length;
}"""
# The step the ring diagram's own slider shows: the animation's last frame once it has played.
ANIMATION_STEP = """() => [...document.querySelectorAll('.js-plotly-plot')]
  .filter(gd => (gd.layout.updatemenus || []).length)
  .map(gd => [gd.layout.sliders[0].active, gd._transitionData._frames.length])"""


def drive_classroom(page) -> None:
    """The ring tab's and the gradient averaging tab's buttons on 2 real ranks, the ring's step
    slider and ▶ Play, and presentation mode."""
    assert slide(page, "Ranks (processes)", "ArrowLeft") == "2"  # 3 by default
    tab(page, "Ring allreduce")
    # Before tab 1 has run these inputs, so that the ring tab's own button is there.
    press(page, "Run dist.all_reduce on these inputs",
          then="The ring simulation equals dist.all_reduce on 2 real rank(s)")
    assert slide(page, "Step", "ArrowRight") == "1"
    page.locator("h3").filter(has_text="Ring — step 1/2: reduce-scatter").wait_for()
    assert page.evaluate(WATCH_ANIMATION) == 2  # the ring's and the naive scheme's diagrams
    page.locator(".updatemenu-button").filter(has_text="Play").first.click()
    page.wait_for_function("window.__played > 0")
    assert [2, 3] in page.evaluate(ANIMATION_STEP)  # played to its last step (frames 0, 1, 2)

    # The Real collectives tab's button: pressed in the browser by the 1400 px test, whose runs it needs.
    tab(page, "gradient averaging")
    assert slide(page, "Steps", "Home") == "5"  # the fewest: the button is what is tried here
    press(page, "Train on real processes", then="Largest |DDP gradient")
    assert page.get_by_text("(they must agree to 1e-6)").count()
    assert not page.locator('[data-testid="stAlertContentError"]').count()

    screenshot(page, "classroom_buttons")
    h1 = "parseFloat(getComputedStyle(document.querySelector('h1')).fontSize)"
    normal = page.evaluate(h1)
    # The switch's input is hidden under its label, which takes the click.
    page.locator("label").filter(has=page.get_by_role("switch", name="Presentation mode")).click()
    page.wait_for_function(f"{h1} > {1.15 * normal}")  # large text for a projector
    idle(page)


def drive_sweep(page, runs_dir: Path) -> None:
    """Start a small sweep (the mlp, 2 ranks, one PowerSGD rank, one seed: a baseline and one
    setting) and stop it from its live panel while its first run trains."""
    # The form sends its values on submit: Tab (not Enter, which submits) moves on.  Enough
    # steps that the run is still going when Stop is pressed (the mlp does ~25 a second here).
    for label, value in (("Steps", 2000), ("Ranks", 2), ("Matrix approximation rank (comma-separated)", 1),
                         ("Seeds per setting", 1)):
        box = page.locator(f'input[aria-label="{label}"]')
        box.fill(str(value))
        box.press("Tab")
    page.get_by_role("button", name="Start sweep", exact=True).click()
    stop = page.get_by_role("button", name="Stop sweep", exact=True)
    stop.wait_for()
    assert_no_exception(page, "sweep started")
    (sweep,) = sw.list_sweeps(runs_dir)
    spec = sweep.spec()
    assert (spec.base.steps, spec.base.world_size, spec.repeats, len(sweep.configs())) == (2000, 2, 1, 2)
    # The baseline has trained a step, and the line says so ("[1/2] allreduce: running, step
    # 12/2000"; it said "starting" until the run ended, which only a live page shows).
    progress = page.locator('[data-testid="stProgress"]').filter(
        has_text=re.compile(r"^\[1/2\] allreduce: running, step [1-9]"))
    progress.wait_for(timeout=300_000)
    log(f"sweep shows {progress.inner_text()!r}")
    # The live panel redraws every second: a click that lands on a redraw is tried again.
    wait_until(lambda: sweep.stop_requested() or click_missed(stop), 60, "Stop sweep to be taken")
    page.get_by_text("Status: stopped").first.wait_for()
    idle(page)
    assert sweep.status() == "stopped"
    (first,) = sweep.runs()
    assert first.status() == "stopped", "Stop sweep stops the current run"
    assert_processes_gone(first)
    state = sweep.state()
    wait_until(lambda: not procs.alive(state.get("pid"), state.get("create_time")), 120,
               "the sweep's process to exit")


def drive_buckets(page, run) -> None:
    """The timeline's download is the run's trace.json, and each torch.profiler download that
    rank's profile, as the run folder holds them."""
    with page.expect_download() as download:
        page.get_by_role("button", name=re.compile("^Download trace.json")).click()
    assert download.value.suggested_filename == f"{run.id}-trace.json"
    data = Path(download.value.path()).read_bytes()
    assert data == run.trace() and json.loads(data)["traceEvents"]
    idle(page)
    profiles = run.profiler_traces()
    assert [p.name for p in profiles] == ["step1.rank0.json", "step1.rank1.json"]
    for path in profiles:
        with page.expect_download() as download:
            page.get_by_role("button", name=f"Download torch.profiler trace {path.name}").click()
        assert download.value.suggested_filename == f"{run.id}-{path.name}"
        assert Path(download.value.path()).read_bytes() == path.read_bytes()
        idle(page)


def drive_export(page, run) -> None:
    """Every format's download: the file is the block the page shows, and the config files hold
    the settings of the run the page names (those the Launch form was given)."""
    caption = page.get_by_text("Settings of run").first.inner_text()
    assert run.id in caption, caption
    settings = run.config().to_dict()
    tabs = page.get_by_role("tab")
    names = tabs.all_inner_texts()
    assert len(names) == len(export.FORMATS), names
    got = {}
    for name in names:
        tabs.filter(has_text=name).first.click()
        panel = page.locator('[role="tabpanel"]:visible')
        with page.expect_download() as download:
            panel.get_by_role("button", name=re.compile("^Download ")).click()
        text = Path(download.value.path()).read_text()
        assert download.value.suggested_filename in panel.get_by_role("button").first.inner_text()
        shown = panel.locator('[data-testid="stCode"] code').first.text_content()
        assert text.strip() == shown.strip(), name
        got[name] = text
        idle(page)
    config = json.loads(got["JSON"])
    assert config == {k: settings[k] for k in config}
    assert (config["hook"], config["bucket_cap_mb"]) == ("powersgd", 0.05)  # as Launch was given
    assert tomllib.loads(got["TOML"]) == config
    for name in ("Plain DDP", "Lightning", "Accelerate", "HF Trainer"):
        compile(got[name], name, "exec")
    for name in ("torchrun", "SLURM"):
        subprocess.run(["bash", "-n"], input=got[name], text=True, check=True)


# ------------------------------------------------------------------ pages read at a glance
# Issue 41: every figure and table of every page readable in a 1400 px wide window with a
# sweep's worth of runs (12, the Compare page's own cap), and in Classroom's presentation mode.
WIDE = {"width": 1400, "height": 1400}
TWELVE_HOOKS = ("allreduce", "fp16", "bf16", "powersgd", "batched_powersgd", "topk", "randomk",
                "qsgd", "terngrad", "signsgd", "onebit", "dgc")
# The table columns a page is for, by the start of their header: on screen without scrolling.
CONTRACT = {"compare": ("setting", "bytes per step", "ratio vs", "pays here?"),
            "compression_rule": ("layer", "decision", "n·m")}

# Pairs of a figure's SVG text boxes that overlap by more than a pixel (what a person sees as one
# label drawn over another), per figure on the page, named by the figure's title.  A box is the
# text's own rectangle as drawn (turned with it: tick labels are rotated), compared by separating
# axes: the rectangles of rotated neighbours' enclosing boxes overlap where the text does not.
TEXT_OVERLAPS = """() => {
  const corners = t => {
    const b = t.getBBox(), m = t.getScreenCTM();
    return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
      .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
  };
  const apart = (P, Q) => [P, Q].some(poly => poly.some((p, i) => {
    const q = poly[(i + 1) % 4], ax = q[1] - p[1], ay = p[0] - q[0], n = Math.hypot(ax, ay) || 1;
    const a = P.map(([x, y]) => (x * ax + y * ay) / n), b = Q.map(([x, y]) => (x * ax + y * ay) / n);
    return Math.min(Math.max(...a), Math.max(...b)) - Math.max(Math.min(...a), Math.min(...b)) <= 1;
  }));
  return [...document.querySelectorAll('.js-plotly-plot')].map(gd => {
    const boxes = [...gd.querySelectorAll('svg text')]
      .filter(t => t.textContent.trim() && t.getBoundingClientRect().width > 0
              && getComputedStyle(t).visibility !== 'hidden' && getComputedStyle(t).opacity !== '0')
      .map(t => ({text: t.textContent.trim(), c: corners(t)}));
    const pairs = [];
    for (let a = 0; a < boxes.length; a++) for (let b = a + 1; b < boxes.length; b++)
      if (!apart(boxes[a].c, boxes[b].c)) pairs.push([boxes[a].text, boxes[b].text]);
    const title = gd.querySelector('.gtitle');
    return {figure: title ? title.textContent : '(untitled)', pairs};
  });
}"""
# Each table's frame, and the headers its grid draws: Glide renders in its accessibility tree
# only the columns that intersect its visible region, the last of them possibly cut.
TABLES = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')]
  .filter(d => d.getBoundingClientRect().width > 0).map(d => {
    const r = d.getBoundingClientRect(), grid = d.querySelector('table[role="grid"]');
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
            columns: grid ? +grid.getAttribute('aria-colcount') : 0,
            shown: [...d.querySelectorAll('th[role="columnheader"]')].map(h => h.textContent)};
  })"""
# A slider's value label over its own thumb (the element that holds it, where the slider draws it).
SLIDER_COLLISIONS = """() => [...document.querySelectorAll('[data-testid="stSliderThumbValue"]')]
  .filter(v => v.getBoundingClientRect().width > 0).filter(v => {
    const p = v.getBoundingClientRect(), q = v.parentElement.getBoundingClientRect();
    return Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top) > 1
      && Math.min(p.right, q.right) - Math.max(p.left, q.left) > 1;
  }).map(v => v.textContent)"""


def readability(page, name: str) -> dict:
    """What a person cannot read on the page as it is: overlapping text in each figure, tables
    that overlap or leave the window, contract columns not on screen, slider values on thumbs;
    the page's screenshot is kept as test-artifacts/``name``.png."""
    width = page.viewport_size["width"]
    tables = page.evaluate(TABLES)
    found = {"text_overlaps": [f for f in page.evaluate(TEXT_OVERLAPS) if f["pairs"]],
             "tables_off_window": [t["shown"][:2] for t in tables if t["right"] > width + 1],
             "tables_overlapping": [[a["shown"][:1], b["shown"][:1]] for i, a in enumerate(tables)
                                    for b in tables[i + 1:]
                                    if min(a["right"], b["right"]) - max(a["left"], b["left"]) > 1
                                    and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 1],
             "slider_values_on_thumbs": page.evaluate(SLIDER_COLLISIONS)}
    stem = name.removeprefix("wide_")
    if stem in CONTRACT:
        table = next((t for t in tables if t["columns"]), {"shown": [], "columns": 0})
        # A grid that draws fewer columns than it has may have cut the last one it draws.
        whole = table["shown"] if len(table["shown"]) >= table["columns"] else table["shown"][:-1]
        found["contract_columns_off_screen"] = [
            c for c in CONTRACT[stem] if not any(h.startswith(c) for h in whole)]
    screenshot(page, name)
    return {k: v for k, v in found.items() if v}


def overlap_count(found: dict) -> int:
    return sum(len(f["pairs"]) for f in found.get("text_overlaps", ()))


def open_page(page, title: str) -> None:
    """Open a page from the sidebar and wait until it has drawn its figures."""
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click()
    first_word = re.escape(title.split()[0])
    page.locator("h1").filter(has_text=re.compile(f"^{first_word}", re.I)).first.wait_for()
    idle(page, timeout_ms=300_000)
    settle(page)


def settle(page) -> None:
    """Plotly lays out text after the figure is attached: wait until every figure has drawn."""
    page.wait_for_function("""() => [...document.querySelectorAll('.js-plotly-plot')]
        .every(gd => gd._fullLayout && gd.querySelector('.main-svg'))""")
    time.sleep(1)


@pytest.fixture(scope="module")
def twelve_runs(tmp_path_factory) -> Path:
    """A sweep's worth of real runs of the mlp (12 hooks, a few steps each, on warm ranks: about
    20 s); COMMLAB_TWELVE_RUNS names a folder of them made before, to iterate on the pages."""
    if os.environ.get("COMMLAB_TWELVE_RUNS"):
        return Path(os.environ["COMMLAB_TWELVE_RUNS"])
    runs_dir = tmp_path_factory.mktemp("twelve") / "runs"
    subprocess.run([sys.executable, "-m", "commlab", "compare", "--workload", "mlp", "--hooks",
                    ",".join(TWELVE_HOOKS), "--steps", "30", "--runs-dir", str(runs_dir)],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL, timeout=900)
    return runs_dir


@pytest.mark.timeout(1800)
def test_every_page_readable_at_1400px_with_12_runs(twelve_runs):
    """Every page at 1400 px over 12 runs, and Classroom in presentation mode with its tables and
    its ring's ▶ Play: no text drawn over other text in a figure, no table leaving the window or
    overlapping another, the columns a page is for on screen; screenshots in test-artifacts/
    (``wide_<page>.png``) and what was found in ``wide_pages.json``."""
    need_browser()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    port = free_port()
    server = start_streamlit(twelve_runs, port)
    found = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport=WIDE)
                page.set_default_timeout(SLOW_MS)
                page.goto(f"http://127.0.0.1:{port}/", timeout=SLOW_MS)
                page.locator("h1").first.wait_for()
                idle(page)
                for file, title in [e for entries in navigation().values() for e in entries]:
                    stem = Path(file).stem
                    open_page(page, title)
                    assert_no_exception(page, file)
                    found[stem] = readability(page, f"wide_{stem}")
                    log(f"{stem}: {overlap_count(found[stem])} overlapping text pair(s)")
                open_page(page, "Classroom")
                page.locator("label").filter(
                    has=page.get_by_role("switch", name="Presentation mode")).click()
                idle(page)
                press(page, "Run on real processes", then="Order in which the ranks reported back")
                headings = page.locator("h3").all_inner_texts()
                for call in ("dist.all_reduce(op=SUM)", "dist.broadcast(src=2)", "dist.reduce(dst=0, op=SUM)",
                             "dist.all_gather_single", "dist.reduce_scatter_single(op=SUM)"):  # 3 ranks
                    assert call in headings, (call, headings)
                settle(page)
                found["classroom_presentation"] = readability(
                    page, "wide_classroom_presentation")
                tab(page, "Ring allreduce")
                settle(page)
                found["classroom_presentation_ring"] = readability(
                    page, "wide_classroom_presentation_ring")
            finally:
                browser.close()
    finally:
        procs.kill_tree(server.pid, grace_s=30)
        server.wait()
    (ARTIFACTS / "wide_pages.json").write_text(json.dumps(found, indent=1))
    print("\noverlapping text pairs: " + ", ".join(f"{k} {overlap_count(v)}" for k, v in found.items()))
    assert not {k: v for k, v in found.items() if v}, json.dumps(found, indent=1)
