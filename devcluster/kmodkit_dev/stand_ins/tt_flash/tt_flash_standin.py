"""Stand-in for tenstorrent/tt-flash's command line: flashes nothing."""

import argparse
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(prog="tt-flash")
    parser.add_argument("--no-color", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)
    flash = commands.add_parser("flash")
    flash.add_argument("--fw-tar", required=True)
    flash.add_argument("--force", action="store_true")
    args = parser.parse_args()
    if not os.path.isfile(args.fw_tar):
        print(f"error: {args.fw_tar} does not exist", file=sys.stderr)
        return 1
    print(f"tt-flash stand-in: would flash {args.fw_tar}{' (forced)' if args.force else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
