"""Lay out a page in headless Chromium and measure its SVG pictures' text,
for tests/test_race_picture.py (and by hand: /usr/bin/python3
tests/svgcheck.py PAGE.html|PICTURE.svg ... prints the figures).

Every box comes from the browser (getBoundingClientRect of each <text>, after
the fonts are loaded and the page is laid out at the viewport's width), never
from an estimate: the drawing code estimates text widths to place its labels,
and this is what checks those estimates.
"""

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chromium import Chromium  # noqa: E402

# For each <svg> shown on the page (not inside a closed <details>, not
# display:none; with open_all, every <details> opened first): its box, and the box of each of its <text> elements with
# text in it. Overlap: two boxes sharing more than 1 px in both directions
# (glyph boxes touch at their edges where two lines of text are set solid).
MEASURE_JS = r"""
(async (openAll) => {
  if (openAll) document.querySelectorAll('details').forEach(d => { d.open = true; });
  await document.fonts.ready;
  const out = [];
  const svgs = Array.from(document.querySelectorAll('svg')).filter(
      s => !s.parentElement || !s.parentElement.closest('svg'));
  for (const s of svgs) {
    const r = s.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || !s.checkVisibility()) continue;
    const texts = [];
    for (const t of s.querySelectorAll('text')) {
      if (!t.textContent.trim() || !t.checkVisibility()) continue;
      const b = t.getBoundingClientRect();
      if (b.width === 0 && b.height === 0) continue;
      texts.push({text: t.textContent, x0: b.left, y0: b.top, x1: b.right, y1: b.bottom});
    }
    out.push({id: s.id || s.getAttribute('class') || '', box: {x0: r.left, y0: r.top,
              x1: r.right, y1: r.bottom}, texts: texts});
  }
  return {svgs: out, scrollWidth: document.documentElement.scrollWidth,
          innerWidth: window.innerWidth};
})(%s)
"""

SLACK = 1.0     # px: boxes may share this much and still count as apart


def overlaps(texts):
    """The pairs of text boxes that share more than SLACK px each way."""
    pairs = []
    srt = sorted(texts, key=lambda t: t["x0"])
    for i, a in enumerate(srt):
        for b in srt[i + 1:]:
            if b["x0"] >= a["x1"] - SLACK:
                break
            if (min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > SLACK
                    and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > SLACK):
                pairs.append((a["text"], b["text"]))
    return pairs


def outside(texts, box):
    """The texts whose box is not wholly inside the picture's."""
    return [t["text"] for t in texts
            if t["x0"] < box["x0"] - SLACK or t["y0"] < box["y0"] - SLACK
            or t["x1"] > box["x1"] + SLACK or t["y1"] > box["y1"] + SLACK]


class Browser:
    """One headless Chromium, one tab, pages opened from files."""

    def __init__(self, binary=None):
        binary = binary or shutil.which("chromium") or shutil.which("chromium-browser")
        if not binary:
            raise FileNotFoundError("chromium is not installed: install Debian's 'chromium' "
                                    "package (`make deps` does)")
        self.profile = tempfile.mkdtemp(prefix="chromium-svgcheck-")
        self.browser = Chromium(binary, self.profile, os.path.join(self.profile, "log"))
        target = self.browser.call("Target.createTarget", {"url": "about:blank"})
        self.session = self.browser.call("Target.attachToTarget",
                                         {"targetId": target["targetId"],
                                          "flatten": True})["sessionId"]
        self.browser.call("Page.enable", session=self.session)

    def close(self):
        self.browser.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def open(self, path, width, height=900):
        self.browser.call("Emulation.setDeviceMetricsOverride",
                          {"width": width, "height": height, "deviceScaleFactor": 1,
                           "mobile": width < 600}, session=self.session)
        self.browser.call("Page.navigate", {"url": "file://" + os.path.abspath(path)},
                          session=self.session)
        # Wait for the load: the document is complete.
        for _ in range(200):
            if self.eval("document.readyState") == "complete":
                return
            import time
            time.sleep(0.05)

    def eval(self, expression):
        r = self.browser.call("Runtime.evaluate", {"expression": expression,
                                                   "returnByValue": True,
                                                   "awaitPromise": True},
                              session=self.session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:60]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def measure(self, path, width, open_all=False):
        """{svgs: [{id, box, texts, overlaps, outside}], scrollWidth, innerWidth}."""
        self.open(path, width)
        m = self.eval(MEASURE_JS % ("true" if open_all else "false"))
        for s in m["svgs"]:
            s["overlaps"] = overlaps(s["texts"])
            s["outside"] = outside(s["texts"], s["box"])
        return m

    def screenshot(self, path, width, out, height=900):
        import base64
        self.open(path, width, height)
        self.eval("document.fonts.ready.then(() => 1)")
        data = self.browser.call("Page.captureScreenshot", {"format": "png"},
                                 session=self.session)["data"]
        with open(out, "wb") as f:
            f.write(base64.b64decode(data))


def main(argv):
    widths = [390, 1280]
    if argv and argv[0].startswith("--widths="):
        widths = [int(w) for w in argv.pop(0).split("=", 1)[1].split(",")]
    b = Browser()
    try:
        for path in argv:
            for w, open_all in [(w, o) for w in widths for o in (False, True)]:
                m = b.measure(path, w, open_all)
                labels = sum(len(s["texts"]) for s in m["svgs"])
                ov = sum(len(s["overlaps"]) for s in m["svgs"])
                out = sum(len(s["outside"]) for s in m["svgs"])
                print(json.dumps({"page": path, "width": w, "opened": open_all, "svgs": len(m["svgs"]),
                                  "labels": labels, "overlapping_pairs": ov,
                                  "outside": out, "page_scroll_width": m["scrollWidth"]}))
    finally:
        b.close()


if __name__ == "__main__":
    main(sys.argv[1:])
