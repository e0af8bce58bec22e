"""`python -m vramlens ARGS` runs the vramlens binary that came with the package, as
`vramlens ARGS` does."""

import os
import subprocess
import sys

from vramlens import find_binary


def main():
    try:
        binary = find_binary()
    except FileNotFoundError as e:
        print(f"vramlens: error: {e}", file=sys.stderr)
        return 2
    args = [binary, *sys.argv[1:]]
    if os.name == "posix":
        os.execv(binary, args)
    return subprocess.call(args)


if __name__ == "__main__":
    sys.exit(main())
