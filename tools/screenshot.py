"""A page's screenshot in headless Chromium (Debian's, through playwright; what tests/browser.py drives):
    python tools/screenshot.py PAGE.html OUT.png [--width 1280] [--height 0]
--height 0 (the default) takes the whole page; N takes its first N pixels. Used for docs/report-cpu.png."""

import argparse
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("page", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=0)
    args = p.parse_args()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"], timeout=30_000)
        page = browser.new_page(viewport={"width": args.width, "height": args.height or 900})
        page.goto(args.page.resolve().as_uri(), wait_until="load", timeout=30_000)
        page.screenshot(path=str(args.out), full_page=not args.height)
        browser.close()
    print(f"screenshot: {args.out}")


if __name__ == "__main__":
    main()
