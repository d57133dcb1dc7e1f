"""``asp-report RUN_DIR``: draw a run's timeline (Gantt), queue occupancy and rewards as PNG,
and print the per-epoch predictor report (rank correlation, bubbles) when the run has one."""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    from ..metrics.report import make_report, predictor_lines

    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: asp-report RUN_DIR\n\nWrites timeline.png, queue.png and rewards.png into RUN_DIR and prints\n"
              "the per-epoch predictor report (predictor_by_epoch.json) if there is one.")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        for path in make_report(argv[0]):
            print(f"wrote {path}")
        for line in predictor_lines(argv[0]):   # per epoch: rank quality and bubbles
            print(line)
    except (FileNotFoundError, ValueError) as error:
        print(f"asp-report: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
