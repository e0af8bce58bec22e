#!/usr/bin/env bash
# End-to-end benchmark: vramlens commands vs Python's pickle.load and torch's
# _memory_viz.py stats, on two shapes of large snapshot.
#
#   benches/run.sh [bench.py options, e.g. --repeat 5 --cmd 'timeline=timeline --force -o {out}.svg {file}']
#
# Files (made once under bench-data/, which git ignores; delete them to remake them):
#   gen_300m.pickle, gen_1g.pickle    scripts/bench_gen.py: a modelled training step, tiled;
#                                     176 bytes per trace entry, each entry with its own
#                                     frames list of ~30 frame references
#   tiled_300m.pickle, tiled_1g.pickle  scripts/bench_tile.py: a real recorded training step
#                                     (../shared/data/cs336-cliffkai/memory_snapshot_xl_bwd.pickle)
#                                     run 190 and 630 times (304 MB and 1 GB), each run but
#                                     the last ending with its frees and empty_cache, times
#                                     shifted, frames lists shared between tiles: 60 bytes
#                                     per entry
# The memory_viz leg runs bench-data/_memory_viz.py when present (a copy of
# torch/cuda/_memory_viz.py from the pytorch/pytorch repository; only the standard library
# is needed for `stats`), or VRAMLENS_MEMORY_VIZ, or torch's module if torch is installed.
#
# How long it takes (2-core VM, warm cargo cache, files absent): cargo build --release a
# few minutes on a cold target/; generating the four files about 3 minutes; each round
# about 2.5 minutes, mostly the Python legs (pickle.load of 1 GB takes ~30 s and 4 GB of
# memory); default 3 rounds. Needs ~5 GB free RAM and 2.8 GB disk.
#
# Environment: PYTHON (default python3), VRAMLENS (default target/release/vramlens),
#              VRAMLENS_MEMORY_VIZ (see scripts/bench.py).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VRAMLENS=${VRAMLENS:-target/release/vramlens}
REAL=../shared/data/cs336-cliffkai/memory_snapshot_xl_bwd.pickle

cargo build --release

mkdir -p bench-data
[ -f bench-data/gen_300m.pickle ] || "$PYTHON" scripts/bench_gen.py --size-mb 300 -o bench-data/gen_300m.pickle
[ -f bench-data/gen_1g.pickle ] || "$PYTHON" scripts/bench_gen.py --size-mb 1024 -o bench-data/gen_1g.pickle
files=(bench-data/gen_300m.pickle bench-data/gen_1g.pickle)
if [ -f "$REAL" ]; then
    [ -f bench-data/tiled_300m.pickle ] || "$PYTHON" scripts/bench_tile.py --tiles 190 -o bench-data/tiled_300m.pickle "$REAL"
    [ -f bench-data/tiled_1g.pickle ] || "$PYTHON" scripts/bench_tile.py --tiles 630 -o bench-data/tiled_1g.pickle "$REAL"
    files+=(bench-data/tiled_300m.pickle bench-data/tiled_1g.pickle)
else
    echo "bench: $REAL is absent: the tiled real-snapshot files are skipped" >&2
fi
if [ -z "${VRAMLENS_MEMORY_VIZ:-}" ] && [ -f bench-data/_memory_viz.py ]; then
    export VRAMLENS_MEMORY_VIZ=bench-data/_memory_viz.py
fi

exec "$PYTHON" scripts/bench.py --python "$PYTHON" --vramlens "$VRAMLENS" "$@" "${files[@]}"
