#!/usr/bin/env bash
# Every command's output on every real file and fixture, written under OUTDIR, so that a
# change meant to keep behaviour can be checked byte for byte:
#
#   scripts/all_outputs.sh OLD_BINARY /tmp/before
#   scripts/all_outputs.sh target/release/vramlens /tmp/after
#   diff -r /tmp/before /tmp/after
#
# ONLY=WORD runs just the runs whose name holds WORD (ONLY=report: the reports); compare
# those with `for f in /tmp/after/*; do cmp "$f" "/tmp/before/${f##*/}"; done`.
#
# Real files are read from ../shared/data when it is there. Exit statuses are recorded
# beside the outputs (bad input must keep its status too).
set -u
bin=$(realpath "$1")
out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
cd "$root"

inputs=(testdata/*.pickle testdata/*.pickle.gz testdata/categories/*.pickle testdata/budget/*.pickle testdata/gpu/*/*.pickle)
if [ -d ../shared/data ]; then
    while IFS= read -r f; do inputs+=("$f"); done < <(find ../shared/data \( -name '*.pickle' -o -name '*.pkl' -o -name '*.json' -o -name '*.json.gz' -o -name '*.raw.gz' \) | sort)
fi

run() { # NAME ARGS...: stdout, stderr and status of one run
    local name=$1; shift
    [[ -n ${ONLY:-} && $name != *"$ONLY"* ]] && return
    "$bin" "$@" >"$out/$name.out" 2>"$out/$name.err"
    echo $? >"$out/$name.rc"
}

for f in "${inputs[@]}"; do
    [ -f "$f" ] || continue
    k=$(echo "$f" | sed 's#^\.\./shared/data/#real/#; s#[/ ]#_#g')
    run "$k.summary" summary "$f"
    run "$k.summary.json" summary --json "$f"
    run "$k.timeline.peaks" timeline "$f"
    run "$k.timeline.json" timeline --json "$f"
    run "$k.timeline.at_peak" timeline --at peak "$f"
    run "$k.timeline.svg" timeline "$f" -o "$out/$k.timeline.svg"
    run "$k.timeline_cat.svg" timeline "$f" --by category --x time -o "$out/$k.timeline_cat.svg"
    run "$k.segments" segments "$f"
    run "$k.segments.json" segments --json --at peak "$f"
    run "$k.segments.svg" segments "$f" -o "$out/$k.segments.svg"
    run "$k.oom" oom "$f"
    run "$k.oom.json" oom --json "$f"
    run "$k.top" top "$f"
    run "$k.top.json" top --json --by category --leaks "$f"
    run "$k.top.stack" top --by stack --at end "$f"
    run "$k.flame.folded" flamegraph --folded "$f"
    run "$k.flame.svg" flamegraph "$f" -o "$out/$k.flame.svg"
    run "$k.diff" diff "$f" "$f"
    run "$k.diff.json" diff --json --by file "$f" "$f"
    run "$k.budget" budget "$f"
    run "$k.budget.json" budget --json --gpu h100 "$f"
    run "$k.check" check --max-peak 1GiB "$f"
    run "$k.check.json" check --json --baseline "$f" "$f"
    run "$k.redact" redact "$f" -o "$out/$k.redacted"
    run "$k.report" report "$f" -o "$out/$k.report.html"
    run "$k.export" export --format jsonl --events "$f" -o "$out/$k.export"
    run "$k.reconcile" reconcile "$f" --nvml testdata/gpu/ok/nvml.jsonl --allow-no-overlap
    run "$k.simulate" simulate "$f"
    run "$k.simulate.json" simulate --json --gpu h100 --alloc-conf expandable_segments:True "$f"
done

# Inputs of several files, and side inputs.
two=(testdata/sample.pickle testdata/multi_device.pickle)
run several.top top "${two[@]}"
run several.report report "${two[@]}" -o "$out/several.report.html"
run several.export export "${two[@]}" -o "$out/several.export"
run several.diff diff "${two[@]}"
run budget.series budget --json testdata/budget
if [ -d ../shared/data ]; then
    d=../shared/data
    run real.ranks top "$d/ccl-bench-torchtitan-fsdp-oom"
    run real.ranks.report report "$d/ccl-bench-torchtitan-fsdp-oom" -o "$out/real.ranks.report.html"
    run real.series budget --json "$d/cs336-bolongcheng"
    run real.diff diff "$d/cs336-cliffkai/memory_snapshot_medium_bwd.pickle" "$d/cs336-cliffkai/memory_snapshot_large_bwd.pickle"
    run real.check check --baseline "$d/cs336-cliffkai/memory_snapshot_medium_bwd.pickle" "$d/cs336-cliffkai/memory_snapshot_large_bwd.pickle"
fi
for g in ok oom oom_cap; do
    d=testdata/gpu/$g
    s=$d/snapshot.pickle
    [ -f "$d/oom_snapshot.pickle" ] && s=$d/oom_snapshot.pickle
    run "gpu.$g.reconcile" reconcile "$s" --nvml "$d/nvml.jsonl"
    run "gpu.$g.reconcile.json" reconcile --json "$s" --nvml "$d/nvml.jsonl"
    run "gpu.$g.timeline.svg" timeline "$s" --nvml "$d/nvml.jsonl" --x time -o "$out/gpu.$g.timeline.svg"
    run "gpu.$g.report" report "$s" --nvml "$d/nvml.jsonl" -o "$out/gpu.$g.report.html"
    run "gpu.$g.budget" budget --json "$s" --nvml "$d/nvml.jsonl"
    if [ -f "$d/oom.log" ]; then
        run "gpu.$g.oom" oom "$s" --log "$d/oom.log"
        run "gpu.$g.oom.json" oom --json "$s" --log "$d/oom.log"
        run "gpu.$g.report_log" report "$s" --log "$d/oom.log" --nvml "$d/nvml.jsonl" -o "$out/gpu.$g.report_log.html"
    fi
done
for c in testdata/gpu/nvsmi_apps.csv testdata/gpu/nvsmi_gpu.csv; do
    k=$(basename "$c")
    run "side.$k.reconcile" reconcile testdata/gpu/ok/snapshot.pickle --nvml "$c" --allow-no-overlap
done
run side.train_oom oom testdata/sample.pickle --log testdata/logs/train_oom.log
run side.train_oom.json oom --json --device-total 80GiB testdata/sample.pickle --log testdata/logs/train_oom.log
for p in testdata/profile/*; do
    k=$(basename "$p")
    run "profile.$k.summary" summary "$p"
    run "profile.$k.timeline.svg" timeline "$p" -o "$out/profile.$k.timeline.svg"
    run "profile.$k.top" top "$p"
done

# The folder given is named in some outputs: say OUT instead, so two runs compare.
for f in "$out"/*.out "$out"/*.err; do
    grep -q -F "$out" "$f" && sed -i "s#$out#OUT#g" "$f"
done
exit 0
