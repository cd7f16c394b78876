"""``python -m torch_smddp.trace``: smddp's offline diagnostics.

``analyze DIR``: reads the flight-recorder dumps a failed job left in
``SMDDP_DEBUG_DIR`` and prints, per group, the desync report (which rank is
behind, on which call) and each rank's last calls.
"""

from __future__ import annotations

import argparse
import sys


def cmd_analyze(args) -> int:
    from .flight import analyze

    print(analyze(args.dir, last=args.last))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_smddp.trace", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="desync report and last calls from a dump directory")
    a.add_argument("dir", help="SMDDP_DEBUG_DIR of the failed job")
    a.add_argument("--last", type=int, default=5, help="calls to show per rank (default 5)")
    a.set_defaults(func=cmd_analyze)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
