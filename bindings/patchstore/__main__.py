"""``python -m patchstore ARGS...`` runs the ``patchstore`` command-line program."""

import os
import sys

from . import cli_path


def main() -> None:
    exe = cli_path()
    if exe is None:
        sys.exit("patchstore: the command-line program was not found (install the package with pip, "
                 "or set PATCHSTORE_CLI)")
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
