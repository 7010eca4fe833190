"""Open a ``groupwise report`` page in headless Chromium and check it really works.

    python scripts/check_report_browser.py runs/demo/report.html [--chromium chromium]

Exit 0 when the page rendered (the report title is in the DOM), every <img> decoded, and the
page wrote nothing to the console (no uncaught errors); otherwise exit 1 listing the problems.
"""

from __future__ import annotations

import argparse
import sys

from groupwise.report import check_in_browser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="the HTML file to check")
    parser.add_argument("--chromium", default="chromium", help="the browser executable")
    args = parser.parse_args(argv)
    problems = check_in_browser(args.report, chromium=args.chromium)
    if problems:
        print(f"FAIL: {args.report}: {len(problems)} problem(s)", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print(f"OK: {args.report} rendered in Chromium, all images loaded, no console messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
