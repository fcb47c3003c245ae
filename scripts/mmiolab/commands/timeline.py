"""Draw a run recorded in the lab VM (make -C labs/LAB timeline); print what it
shows and the lines around it."""

from __future__ import annotations

import argparse
import os
import sys
import webbrowser

from .. import explore, labspec
from ..config import Config


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lab", choices=labspec.lab_names())
    ap.add_argument("--rec", type=int, default=0, help="recording number (default: the last)")
    ap.add_argument("--no-open", dest="open", action="store_false",
                    help="do not open the picture in a browser")
    ap.add_argument("file", nargs="?", default="",
                    help="a recorded trace, or a session's channel.log")


def run(args: argparse.Namespace, cfg: Config) -> int:
    try:
        return draw(args, cfg)
    except explore.ExploreError as e:       # the student's to fix: said as it is, status 1
        print(f"mmiolab: {e}", file=sys.stderr)
        return 1


def draw(args: argparse.Namespace, cfg: Config) -> int:
    spec = labspec.load_lab(args.lab) if args.lab else None
    if spec is None and not args.file:
        raise explore.ExploreError("say which lab (--lab LAB) or which recording (FILE)")
    text, path = explore.find_recording(spec, args.rec, args.file, cfg=cfg)
    drawn = explore.draw_file(text, path, cfg=cfg)
    d = drawn.drawing
    cmd = explore.header_value(text, "command")
    print(f"mmiolab: timeline of {explore.shown_path(path)}" + (f" (record {cmd})" if cmd else ""))
    for w in d.warnings:
        print(f"mmiolab: warning: {w}")
    if d.finding is None:
        print("mmiolab: nothing to draw: no write of the card in this trace completed")
        return 1
    print(f"{'Found' if d.finding.failure else 'No stale doorbell or late interrupt; shows'}: "
          f"{d.finding.text}.")
    print(f"The whole run: {d.summary}.")
    if d.words:
        print("What the picture shows first:")
        print("\n".join(f"  {s}" for s in d.words))
    body = [ln for ln in d.excerpt.splitlines() if not ln.startswith("# ") or "TASK-PID" in ln]
    print(f"The trace around it ({explore.header_value(d.excerpt, 'excerpt')}):")
    print("\n".join(body))
    print(f"mmiolab: picture: {explore.shown_path(drawn.html)} (the SVG alone: "
          f"{os.path.basename(drawn.svg)}; the excerpt: {os.path.basename(drawn.excerpt)})")
    if args.open and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        try:
            webbrowser.open("file://" + os.path.abspath(drawn.html))
        except webbrowser.Error:
            pass
    return 0
