"""Stand-in for tenstorrent/tt-flash's command line, flashing the tests' stand-in device.

A bundle here is the stand-in's own format: a (gzipped) tar whose ``manifest.json``
names the ``bundle_version`` its chips report once flashed. Flashing writes that
version to every device of tests/kernel/ttmod (its ``tt_fw_bundle_ver`` attribute),
which tt-smi's stand-in reads back.
"""

import argparse
import glob
import json
import sys
import tarfile

DEVICES = "/sys/class/misc/tenstorrent*/tt_fw_bundle_ver"


def bundle_version(path: str) -> str:
    """The version the bundle at ``path`` installs; ValueError says why there is none."""
    try:
        with tarfile.open(path) as bundle:
            member = bundle.extractfile("manifest.json")
            manifest = json.load(member) if member else {}
    except (OSError, tarfile.TarError, KeyError, ValueError) as err:
        raise ValueError(f"{path} is not a firmware bundle: {err}") from err
    version = manifest.get("bundle_version") if isinstance(manifest, dict) else None
    if not isinstance(version, str) or not version:
        raise ValueError(f"{path}: manifest.json names no bundle_version")
    return version


def main() -> int:
    parser = argparse.ArgumentParser(prog="tt-flash")
    parser.add_argument("--no-color", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)
    flash = commands.add_parser("flash")
    flash.add_argument("--fw-tar", required=True)
    flash.add_argument("--force", action="store_true")
    args = parser.parse_args()
    try:
        version = bundle_version(args.fw_tar)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    devices = sorted(glob.glob(DEVICES))
    if not devices:
        print("error: no Tenstorrent device found", file=sys.stderr)
        return 1
    for device in devices:
        with open(device, "w") as attribute:
            attribute.write(version + "\n")
        print(f"flashed {version} to {device}{' (forced)' if args.force else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
