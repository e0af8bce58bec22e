#!/usr/bin/env bash
# End-to-end benchmark: vramlens vs Python pickle.load (vs torch's _memory_viz stats).
#
#   benches/run.sh [extra bench.py options, e.g. --json --repeat 3]
#
# How long it takes (2-core VM, warm cargo cache, files absent):
#   cargo build --release              up to a few minutes on a cold target/, ~1 s warm
#   generate snap_300m.pickle           ~7 s   (23 MB RSS; skipped when present)
#   generate snap_1g.pickle             ~22 s  (23 MB RSS; skipped when present)
#   bench 300 MB: pickle.load ~6 s (~1.2 GB RSS) + vramlens
#   bench 1 GB:   pickle.load ~28 s (~4.0 GB RSS) + vramlens
#   => about 1.5 minutes plus the cargo build; needs ~5 GB free RAM and 1.4 GB disk.
#   With torch importable (or VRAMLENS_MEMORY_VIZ=/path/to/_memory_viz.py) the
#   memory_viz leg adds roughly one more pickle.load per file (plus `import torch`).
#
# Environment: PYTHON (default python3), VRAMLENS (default target/release/vramlens),
#              VRAMLENS_MEMORY_VIZ (see scripts/bench.py).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VRAMLENS=${VRAMLENS:-target/release/vramlens}

cargo build --release

mkdir -p bench-data
if [ ! -f bench-data/snap_300m.pickle ]; then
    "$PYTHON" scripts/bench_gen.py --size-mb 300 -o bench-data/snap_300m.pickle
fi
if [ ! -f bench-data/snap_1g.pickle ]; then
    "$PYTHON" scripts/bench_gen.py --size-mb 1024 -o bench-data/snap_1g.pickle
fi

exec "$PYTHON" scripts/bench.py --python "$PYTHON" --vramlens "$VRAMLENS" "$@" \
    bench-data/snap_300m.pickle bench-data/snap_1g.pickle
