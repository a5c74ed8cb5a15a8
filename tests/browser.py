"""A report page as headless Chromium lays it out: its width against the window's, its headings,
its text and a screenshot. Shared by the report tests (evaluation, calibration, and any later
HTML report).

Driven through selenium with Debian's chromedriver (``scripts/setup-browser.sh`` installs it with
Chromium): the driver is built from the same Chromium release as the browser, so the two always
speak the same protocol, and selenium's dependencies install beside the project's pins. Playwright
drives its own pinned Chromium builds, which it downloads at install time, and a system Chromium
only on a best-effort basis. Selenium is told where the driver is, so it never looks for or
fetches one itself.

A missing Chromium, driver or selenium fails the test that asked for a page: these tests check
what a reader sees, and skipping them would pass a report no one has looked at.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# a browser that starts nothing it does not need and reaches nothing outside the page
ARGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        "--hide-scrollbars")


@dataclass(frozen=True)
class Page:
    """What a file looks like at one window width."""
    scroll_width: int          # document.documentElement.scrollWidth
    inner_width: int           # window.innerWidth
    headings: dict[str, list[str]]   # tag (h1, h2, h3, th, summary) -> the rendered texts, in order
    text: str                  # document.body.innerText: what a reader sees, folded parts included
    screenshot: Path
    # tables and images wider than the box they sit in (a table in a scrolling box would hide a
    # document-wide overflow), as "tag#id" or "tag[n]"
    overflowing: list[str]
    # the texts of the headings, paragraphs, list items, summaries and table rows a reader sees in
    # the first window, before opening anything folded
    first_screen: list[str] = field(default_factory=list)
    # header cells (th) with a word drawn on more than one line ("languag/e"); a <wbr> marks
    # where a name may break, so it ends a word here
    broken_headers: list[str] = field(default_factory=list)

    @property
    def scrolls_sideways(self) -> bool:
        return self.scroll_width > self.inner_width


_READ = """
const firstScreen = [...document.querySelectorAll("h1, h2, h3, p, li, summary, tr")]
  .filter(x => x.checkVisibility() && x.getBoundingClientRect().top < window.innerHeight)
  .map(x => x.innerText.trim()).filter(t => t);
document.querySelectorAll("details").forEach(d => d.open = true);
const broken = [];
for (const th of document.querySelectorAll("th")) {
  const walk = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    for (const m of n.data.matchAll(/\\S+/g)) {
      const r = document.createRange();
      r.setStart(n, m.index);
      r.setEnd(n, m.index + m[0].length);
      if (new Set([...r.getClientRects()].map(x => Math.round(x.top))).size > 1) broken.push(th.textContent.trim());
    }
  }
}
const tags = ["h1", "h2", "h3", "th", "summary"];
const headings = {};
for (const t of tags) headings[t] = [...document.querySelectorAll(t)].map(x => x.textContent.trim());
const overflowing = [...document.querySelectorAll("table, img, pre")]
  .map((x, i) => [x, i])
  .filter(([x]) => x.getBoundingClientRect().width > x.parentElement.clientWidth + 1)
  .map(([x, i]) => x.tagName.toLowerCase() + (x.id ? "#" + x.id : "[" + i + "]"));
return {scroll: document.documentElement.scrollWidth, inner: window.innerWidth,
        headings: headings, text: document.body.innerText, overflowing: overflowing,
        first: firstScreen, broken: broken};
"""


def open_page(path: Path, width: int = 1280, height: int = 900, screenshot: Path | None = None) -> Page:
    """Load ``path`` in headless Chromium with a ``width``-pixel-wide window and read it back, every
    ``<details>`` opened (folded tables must fit too); the screenshot is of that page's window."""
    for need in (CHROMIUM, CHROMEDRIVER):
        if not need.exists():
            raise RuntimeError(f"{need} is missing: run scripts/setup-browser.sh")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ARGS:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.set_window_size(width, height)
        # the window's outer size includes no browser chrome when headless; set the layout
        # viewport exactly so innerWidth is the width asked for
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        driver.get(Path(path).resolve().as_uri())
        read = driver.execute_script(_READ)
        shot = screenshot or Path(path).with_suffix(f".{width}px.png")
        driver.save_screenshot(str(shot))
    finally:
        driver.quit()
    return Page(read["scroll"], read["inner"], read["headings"], read["text"], shot, read["overflowing"],
                read["first"], read["broken"])


# a word of ASCII letters, with the characters names and symbols carry (kl_mean, numbers-en,
# NO-GO, business:support, 4-bit)
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+\-]*[A-Za-z0-9]|[A-Za-z]")


def untranslated(texts, allowed) -> list[str]:
    """The words of ``texts`` written in ASCII letters that are not part of a name in ``allowed``
    (measure names, slice names, levels, variant labels: names that stay as they are in every
    language). Numbers and words without a letter are not words here."""
    names = sorted(allowed, key=len, reverse=True)   # "NO-GO" before "GO", "4-bit only" whole
    pattern = re.compile("|".join(rf"(?<![\w-]){re.escape(n)}(?![\w-])" for n in names)) if names else None
    words = []
    for text in texts:
        rest = pattern.sub(" ", text) if pattern else text
        words += [w for w in _WORD.findall(rest) if re.search(r"[A-Za-z]", w)]
    return words
