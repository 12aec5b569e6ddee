"""The page that the web UI's render benchmarks (webui.py: the flame graph, timeline_render.py: the GPU timeline) load
in Chromium, with fleetprof's view and a peer library side by side and each timed alike; the local server that serves
it; one measurement on it; and the peer's packages, fetched with `npm pack`."""

from __future__ import annotations

import shutil
import subprocess
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"]

# timed(name, draw): the text of data/<name>, then on the clock JSON.parse, draw(data) and two animation frames
# (painted); draw returns a function that says what was drawn, called once painted
_PAGE = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">
%(head)s
</head><body><div id="wrap"><canvas id="%(canvas)s"></canvas><pre id="tip" hidden></pre></div>
<div id="peer" style="width: %(width)dpx"></div>
<script type="module">
const painted = () => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
async function timed(name, draw) {
  const text = await (await fetch(`data/${name}`)).text();
  const started = performance.now();
  const data = JSON.parse(text);
  const parsed = performance.now();
  const drawn = draw(data);
  await painted();
  return { ms: performance.now() - started, parseMs: parsed - started, ...drawn() };
}
%(script)s
window.benchReady = true;
</script></body></html>
"""


def page_html(width: int, head: str, canvas: str, script: str) -> str:
    """index.html: `head` (the peer's scripts, the styles), fleetprof's canvas (id `canvas`) with its tooltip (#tip),
    the peer's element (#peer), both `width` px wide, and `script`, which sets window.bench to an async method per
    contender (fleetprof, peer) that takes a data file's name and returns timed(name, draw) ({ms, parseMs, drawn…})."""
    return _PAGE % {"width": width, "head": head, "canvas": canvas, "script": script}


def serve(directory: Path) -> tuple[ThreadingHTTPServer, str]:
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def measure(page: object, url: str, who: str, name: str) -> dict:
    """One run of window.bench[who] on data/<name> in a fresh load of the page."""
    page.goto(f"{url}/index.html")
    page.wait_for_function("window.benchReady === true")
    return page.evaluate(f"window.bench['{who}']('{name}')")


def npm_pack(packages: list[str], into: Path, bench: str) -> list[Path]:
    """The packages' tarballs from the npm registry, under into/packs/; `bench` names the benchmark for the message."""
    if shutil.which("npm") is None:
        raise SystemExit(f"{bench} needs npm to fetch the peer ({packages[0].rsplit('@', 1)[0]}): apt-get install npm")
    packs = into / "packs"
    packs.mkdir()
    subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(packs), *packages], check=True,
                   capture_output=True, timeout=300)
    return sorted(packs.glob("*.tgz"))
