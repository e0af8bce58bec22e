#!/usr/bin/env python3
"""The capture helper from a checkout, for those without the Python package installed.

    python3 scripts/vramlens_capture.py --out vramlens-out -- train.py --epochs 1

is `python -m vramlens.capture` run from this repository's python/ folder, and
`from vramlens_capture import capture` (with scripts/ on the import path) imports it.
The helper itself is python/vramlens/capture.py.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))

from vramlens.capture import *  # noqa: E402,F401,F403
from vramlens.capture import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
