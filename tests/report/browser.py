"""A page as a person sees it: Debian's headless Chromium, offline, takes a
screenshot and says where each chart is and what the console said.

Chromium is installed with apt-get when missing and this runs as root on
Debian (devstack/container_engine.py's way); elsewhere a test that needs it
skips, and fails in CI (tests/tools.py).

    python -m tests.report.browser PAGE.html SHOT.png   # the docs' picture
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from devstack import debian_packages
from tests.tools import require

WIDTH = 1400
MAX_HEIGHT = 16_000
# Offline: every host resolves to nothing and a proxy that does not exist
# takes every request, so the page shows only what it carries.
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9"]
LAYOUT_SCRIPT = """<script>
window.addEventListener('load', () => {
  const charts = [...document.querySelectorAll('figure.chart')].map(f => {
    const plot = f.querySelector('svg.plot'), empty = f.querySelector('p.empty');
    const r = (plot || empty || f).getBoundingClientRect();
    return {id: f.id, plot: !!plot, empty: empty ? empty.textContent : null,
            x: r.x + scrollX, y: r.y + scrollY, w: r.width, h: r.height};
  });
  const out = document.createElement('pre');
  out.id = 'tokenmill-layout';
  out.textContent = JSON.stringify({height: document.documentElement.scrollHeight, charts});
  document.body.appendChild(out);
});
</script>"""


def install_chromium() -> str | None:
    """apt-get install chromium; None when done, else what went wrong."""
    if not debian_packages.can_install():
        return "`chromium` is not on PATH (apt-get install chromium; installed here only as " \
               "root on Debian)"
    try:
        debian_packages.install(["chromium"])
    except debian_packages.InstallError as exc:
        return str(exc)
    return None if shutil.which("chromium") else "apt-get installed no `chromium`"


def chromium() -> str:
    """Chromium's path (installed when missing), after `require`."""
    found = shutil.which("chromium")
    require("chromium (Debian's package)", None if found else install_chromium())
    return shutil.which("chromium") or "chromium"


@dataclass(frozen=True)
class Chart:
    id: str
    plot: bool  # an SVG chart (else the sentence saying why there is none)
    empty: str | None
    box: tuple[int, int, int, int]  # left, top, right, bottom in the screenshot


@dataclass(frozen=True)
class Seen:
    shot: Image.Image
    charts: list[Chart]
    console: list[str]  # every console message, errors included


def _run(args: list[str], profile: str) -> subprocess.CompletedProcess[str]:
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--hide-scrollbars", "--force-device-scale-factor=1", "--disable-extensions",
               "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}", *OFFLINE,
               *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def look(page: Path, width: int = WIDTH) -> Seen:
    """Where each chart is (a copy of the page with a script that measures
    it), then a screenshot of the page itself, as tall as the page."""
    with tempfile.TemporaryDirectory(prefix="tm-chromium-") as tmp:
        measured = Path(tmp) / "measured.html"
        measured.write_text(page.read_text().replace("</body>", LAYOUT_SCRIPT + "</body>"))
        dumped = _run([f"--window-size={width},1000", "--dump-dom", measured.as_uri()],
                      f"{tmp}/profile-a")
        found = re.search(r'<pre id="tokenmill-layout">(.*?)</pre>', dumped.stdout, re.S)
        if found is None:
            raise RuntimeError(f"chromium did not lay the page out: {dumped.stderr[-2000:]}")
        layout = json.loads(html.unescape(found.group(1)))
        height = min(int(layout["height"]), MAX_HEIGHT)
        shot_path = Path(tmp) / "shot.png"
        shot = _run([f"--window-size={width},{height}", f"--screenshot={shot_path}",
                     page.resolve().as_uri()], f"{tmp}/profile-b")
        if not shot_path.is_file():
            raise RuntimeError(f"chromium took no screenshot: {shot.stderr[-2000:]}")
        image = Image.open(shot_path).convert("RGB")
        image.load()
    charts = [Chart(c["id"], c["plot"], c["empty"],
                    (int(c["x"]), int(c["y"]), int(c["x"] + c["w"]), int(c["y"] + c["h"])))
              for c in layout["charts"]]
    return Seen(image, charts, _console(dumped.stderr) + _console(shot.stderr))


def ink(image: Image.Image, box: tuple[int, int, int, int]) -> tuple[float, float]:
    """Shares of the box's pixels that are not white, and that are coloured
    (bars and lines; axes and text are grey)."""
    region = image.crop(box)
    pixels = list(region.getdata())
    if not pixels:
        return 0.0, 0.0
    inked = sum(1 for r, g, b in pixels if min(r, g, b) < 235)
    coloured = sum(1 for r, g, b in pixels if max(r, g, b) - min(r, g, b) > 60)
    return inked / len(pixels), coloured / len(pixels)


def blank_charts(seen: Seen) -> list[str]:
    """The charts that have an SVG where little or nothing drew: no grey
    axes and text (inked) or no coloured bars and lines."""
    blank = []
    for chart in seen.charts:
        if chart.plot:
            inked, coloured = ink(seen.shot, chart.box)
            if inked < 0.01 or coloured < 0.004:
                blank.append(f"{chart.id} ({inked:.3f} inked, {coloured:.3f} coloured)")
    return blank


if __name__ == "__main__":
    seen = look(Path(sys.argv[1]))
    seen.shot.save(sys.argv[2], optimize=True)
    print(f"{sys.argv[2]}: {seen.shot.size[0]}x{seen.shot.size[1]}, "
          f"{sum(c.plot for c in seen.charts)} charts, {len(seen.console)} console messages")
