#!/usr/bin/env bash
# The one script to run on the GPU machine: from the repository root,
#
#     OUT=/some/dir bash tests/gpu/run_all.sh          # OUT defaults to ./gpu_run_out
#
# 1. tests      - the GPU tests (TEST_PATHS, default tests/gpu and the CuPy compile check; "tests" = everything)
#                 (less the per-specialization NVRTC compile check and the PTX check of the plan-free kernels'
#                 dependency instructions, which the CPU CI runs, about 65 s here: on this machine the kernels
#                 are compiled by CuPy itself, and the option-model test checks CuPy's options)
# 2. memcheck   - the GPU tests again under compute-sanitizer --tool memcheck, with KVCANARY_GPU_SMALL=1
#                 (the GPU tests shrink their sizes: tests/support/gpu_util.size) and PyTorch's caching allocator
#                 off, so every tensor is its own cudaMalloc and an out-of-bounds access is not hidden inside a
#                 pooled block; then the tests marked torch_graph_pool (they capture torch's own allocating ops,
#                 which need the caching allocator's graph pool) under memcheck with the allocator on
# 3. racecheck  - the GPU tests of the kernel families whose sources use __shared__ (found by grepping
#                 kernels_cu/: today plan, write, verify_table, write_table; GPU test names carry the family
#                 name), under compute-sanitizer --tool racecheck
# 4. bench      - bench/bench_cuda.py (writes $OUT/bench.md)
# 5. host       - bench/bench_host.py: host time of a KVCanary step (call by call: --profile, --breakdown,
#                 --attribute) and of one SGLang-named op call, then with --layers 32
#                 (writes $OUT/bench_host.md)
# 6. hf         - bench/bench_transformers.py: generation throughput with and without the canary on HF
#                 transformers' continuous batching (writes $OUT/bench_transformers.md)
# 7. ncu        - Nsight Compute counters of the plan-free verify (B; A with the L2 warm, on the 64-bit and on the
#                 32-bit modules; on the 32-bit ones also its L2 hit rate and DRAM bytes) and of the decode writes
#                 (A; the plan-free one at B too), instructions executed included (bench/profile_verify_table.py)
# 8. timeline   - bench/timeline_verify_table.py: when each block and warp of the plan-free verify at A starts and
#                 ends, per generation of an SM's blocks (writes $OUT/timeline.md; TIMELINE_ARGS, e.g. "--variant
#                 2x4x1x1", T_TIMELINE)
# 9. tune       - (only when named in RUN_PARTS) bench/tune_geometry.py: the plan-free kernels' launch-geometry
#                 sweep (writes $OUT/tune_<kernel>.md; TUNE_ARGS, T_TUNE)
#
# transformers 5.24.0 (the version the integration is pinned to) is installed from .whl/ when a wheel is there
# (`make gpu-wheels` downloads it; carry .whl with the call): pip install --no-deps --target /tmp/site, then
# PYTHONPATH; its GPU tests are part of "tests" and are skipped without it.
#
# Logs in $OUT, one or two per part: tests.log, memcheck.log (and memcheck_pool.log), racecheck.log, bench.log and
# bench.md, bench_host.log and bench_host.md, bench_transformers.log and bench_transformers.md, ncu.log,
# timeline.md, tune.log (and tune_<kernel>.md), and summary.md. The summary
# table (part, result, seconds, sanitizer errors) is printed last. Exit status 0 only when every part
# passed and the sanitizers reported zero errors.
#
# Knobs (environment): RUN_PARTS (default "tests memcheck racecheck bench host hf ncu timeline"); the parts'
# timeouts in seconds T_TESTS / T_MEMCHECK / T_RACECHECK / T_BENCH / T_HOST / T_HF / T_NCU / T_TIMELINE / T_TUNE
# (default 300 / 200 / 150 / 150 / 60 / 180 / 60 / 90 / 240; a run takes far less),
# SANITIZER_K (a pytest -k expression narrowing the memcheck pass), SANITIZER_SMALL (default 1: the value of
# KVCANARY_GPU_SMALL under the sanitizers; 0 = full sizes), BENCH_ARGS (extra bench arguments).
# Seen on one H200 (2026-12-02, before the plan-free kernels): the four parts took about 40 + 10 + 10 + 11 s.
set -u -o pipefail
cd "$(dirname "$0")/../.."

OUT="${OUT:-$PWD/gpu_run_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PY:-python3}"
RUN_PARTS="${RUN_PARTS:-tests memcheck racecheck bench host hf ncu timeline}"
# Each part's timeout in seconds (the header's order).
T_TESTS="${T_TESTS:-300}"
T_MEMCHECK="${T_MEMCHECK:-200}"
T_RACECHECK="${T_RACECHECK:-150}"
T_BENCH="${T_BENCH:-150}"
T_HOST="${T_HOST:-60}"
T_HF="${T_HF:-180}"  # about 100-110 s on the H200 hosts seen; over 130 s on a slower one (docs/GPU_SUITE.md)
T_NCU="${T_NCU:-60}"
T_TIMELINE="${T_TIMELINE:-90}"
T_TUNE="${T_TUNE:-240}"
# What the tests part runs: the GPU tests and the CuPy-side compile check by default (the CPU suite is CI's);
# TEST_PATHS=tests runs everything.
TEST_PATHS="${TEST_PATHS:-tests/gpu tests/ops/test_nvrtc_compile.py}"
if ls .whl/transformers-*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-deps --no-index --no-compile --target /tmp/site .whl/transformers-*.whl \
        && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
SANITIZER_SMALL="${SANITIZER_SMALL:-1}"

SANITIZER="$(command -v compute-sanitizer || true)"
if [[ -z "$SANITIZER" ]]; then
    for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        [[ -x "$c" ]] && SANITIZER="$c" && break
    done
fi

SUMMARY=()   # rows "part|result|seconds|sanitizer errors"
FAILED=0

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
    "$PY" - <<'EOF' 2>&1
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
try:
    import cupy
    print("cupy", cupy.__version__)
except Exception as e:
    print("cupy: not importable:", e)
EOF
    echo "compute-sanitizer: ${SANITIZER:-not found}"
} | tee "$OUT/summary.md"

# Count sanitizer errors: the sum over every "ERROR SUMMARY: N error(s)" line (memcheck: one per sanitized
# process) and every "RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)" line's E. "?" when the
# log has neither (the sanitizer did not finish: timeout, crash).
sanitizer_errors() {
    if ! grep -Eq '(ERROR|RACECHECK) SUMMARY' "$1"; then
        echo "?"
        return
    fi
    {
        grep -Eo 'ERROR SUMMARY: [0-9]+ error' "$1" | grep -Eo '[0-9]+'
        grep -Eo 'RACECHECK SUMMARY: .*\([0-9]+ error' "$1" | grep -Eo '[0-9]+ error' | grep -Eo '[0-9]+'
    } | awk '{s += $1} END {print s + 0}'
}

# Racecheck warnings (potential hazards, reported but not counted as errors).
racecheck_warnings() {
    grep -Eo 'RACECHECK SUMMARY: .*[0-9]+ warning' "$1" | grep -Eo '[0-9]+ warning' | grep -Eo '[0-9]+' |
        awk '{s += $1} END {print s + 0}'
}

# pytest's closing line, e.g. "412 passed, 3 skipped in 80.1s"
pytest_tail() {
    grep -E '^(=+ )?([0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran)' "$1" | tail -n 1 | sed -E 's/=+//g; s/^ +| +$//g'
}

# run_part NAME TIMEOUT LOGFILE CMD...: run with a timeout, log stdout+stderr, return the exit status.
run_part() {
    local name=$1 t=$2 log=$3
    shift 3
    echo
    echo "=== $name: $* (timeout ${t}s)"
    local start=$SECONDS
    timeout --signal=TERM --kill-after=15 "$t" "$@" >"$log" 2>&1
    local rc=$?
    PART_SECONDS=$((SECONDS - start))
    tail -n 25 "$log"
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo "=== $name: TIMEOUT after ${t}s"
    fi
    return $rc
}

result_word() {  # rc -> word
    case $1 in
        0) echo "pass" ;;
        124 | 137) echo "TIMEOUT" ;;
        *) echo "FAIL (rc $1)" ;;
    esac
}

has_part() { [[ " $RUN_PARTS " == *" $1 "* ]]; }

# ---- 1. the whole suite
if has_part tests; then
    # Compile every kernel once first (CuPy's on-disk cache then serves the test processes).
    "$PY" -c "import kvcanary; print('kernels loaded:', kvcanary.warmup(0))" 2>&1 | tail -n 2
    # shellcheck disable=SC2086
    run_part tests "$T_TESTS" "$OUT/tests.log" "$PY" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} $TEST_PATHS \
        -k "not test_spec_compiles_clean and not test_plan_free_kernels_wait_before_any_memory_access"
    rc=$?
    [[ $rc -ne 0 ]] && FAILED=1
    SUMMARY+=("tests|$(result_word $rc): $(pytest_tail "$OUT/tests.log")|$PART_SECONDS|-")
fi

# ---- 2. memcheck over the GPU tests
if has_part memcheck; then
    if [[ -z "$SANITIZER" ]]; then
        SUMMARY+=("memcheck|NOT RUN: compute-sanitizer not found|0|?")
        FAILED=1
    else
        # The transformers tests run third-party kernels (cuDNN attention) the sanitizers would report on.
        kargs=(-k "${SANITIZER_K:-not transformers}")
        KVCANARY_GPU_SMALL="$SANITIZER_SMALL" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
            run_part memcheck "$T_MEMCHECK" "$OUT/memcheck.log" \
            "$SANITIZER" --tool memcheck --error-exitcode 97 --print-limit 100 \
            "$PY" -m pytest -q -p no:cacheprovider tests/gpu -m "not torch_graph_pool" "${kargs[@]}"
        rc=$?
        errs=$(sanitizer_errors "$OUT/memcheck.log")
        [[ $rc -ne 0 || "$errs" != "0" ]] && FAILED=1
        SUMMARY+=("memcheck|$(result_word $rc): $(pytest_tail "$OUT/memcheck.log")|$PART_SECONDS|$errs")
        # Tests that capture torch's own allocating ops need torch's graph pool, i.e. the caching allocator
        # (without it every allocation is a cudaMalloc, which a capture forbids); appended to the same log.
        KVCANARY_GPU_SMALL="$SANITIZER_SMALL" \
            run_part "memcheck (caching allocator)" "$T_MEMCHECK" "$OUT/memcheck_pool.log" \
            "$SANITIZER" --tool memcheck --error-exitcode 97 --print-limit 100 \
            "$PY" -m pytest -q -p no:cacheprovider tests/gpu -m torch_graph_pool
        rc=$?
        errs=$(sanitizer_errors "$OUT/memcheck_pool.log")
        [[ $rc -ne 0 || "$errs" != "0" ]] && FAILED=1
        SUMMARY+=("memcheck (graph-pool tests)|$(result_word $rc): $(pytest_tail "$OUT/memcheck_pool.log")|$PART_SECONDS|$errs")
        cat "$OUT/memcheck_pool.log" >>"$OUT/memcheck.log" && rm -f "$OUT/memcheck_pool.log"
    fi
fi

# ---- 3. racecheck over the families that use shared memory
if has_part racecheck; then
    families=()
    for f in kernels_cu/*.cu; do
        [[ -e "$f" ]] || continue
        # a family uses shared memory if its file or a header it includes declares __shared__
        srcs=("$f")
        while read -r h; do [[ -f "kernels_cu/$h" ]] && srcs+=("kernels_cu/$h"); done \
            < <(grep -Eo '#include "[^"]+"' "$f" | sed -E 's/#include "(.*)"/\1/')
        if grep -q '__shared__' "${srcs[@]}"; then
            families+=("$(basename "$f" .cu)")
        fi
    done
    if [[ ${#families[@]} -eq 0 ]]; then
        SUMMARY+=("racecheck|not needed: no kernel uses __shared__|0|-")
    elif [[ -z "$SANITIZER" ]]; then
        SUMMARY+=("racecheck|NOT RUN: compute-sanitizer not found|0|?")
        FAILED=1
    else
        kexpr=$(printf ' or %s' "${families[@]}")
        kexpr="(${kexpr# or }) and not transformers"
        KVCANARY_GPU_SMALL="$SANITIZER_SMALL" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
            run_part "racecheck [$kexpr]" "$T_RACECHECK" "$OUT/racecheck.log" \
            "$SANITIZER" --tool racecheck --error-exitcode 97 --print-limit 100 \
            "$PY" -m pytest -q -p no:cacheprovider tests/gpu -k "$kexpr"
        rc=$?
        errs=$(sanitizer_errors "$OUT/racecheck.log")
        [[ $rc -ne 0 || "$errs" != "0" ]] && FAILED=1
        warns=$(racecheck_warnings "$OUT/racecheck.log")
        SUMMARY+=("racecheck ($kexpr)|$(result_word $rc): $(pytest_tail "$OUT/racecheck.log"); $warns hazard warnings|$PART_SECONDS|$errs")
    fi
fi

# ---- 4. benchmark
if has_part bench; then
    # shellcheck disable=SC2086
    run_part bench "$T_BENCH" "$OUT/bench.log" "$PY" bench/bench_cuda.py ${BENCH_ARGS:-}
    rc=$?
    [[ $rc -ne 0 ]] && FAILED=1
    SUMMARY+=("bench|$(result_word $rc)$(grep -q '^checks: all clean' "$OUT/bench.log" && echo ', checks clean')|$PART_SECONDS|-")
fi

# ---- 5. host time of the hot path
if has_part host; then
    OUT="$OUT" run_part host "$T_HOST" "$OUT/bench_host.log" "$PY" bench/bench_host.py --profile --breakdown --attribute
    rc=$?
    # The same steps with a K and a V real-KV source per layer of a 32-layer model (a TAIL step checks and folds
    # all 64), appended to bench_host.md.
    if [[ $rc -eq 0 ]]; then
        LAYERS_LOG="$(mktemp)"
        env -u OUT timeout 120 "$PY" bench/bench_host.py --layers 32 --steps 200 >"$LAYERS_LOG" 2>&1 || rc=1
        { echo; echo "The same with \`--layers 32\`:"; echo; sed -n '/^Host time per call/,$p' "$LAYERS_LOG"; } \
            >>"$OUT/bench_host.md"
        cat "$LAYERS_LOG" >>"$OUT/bench_host.log"
        rm -f "$LAYERS_LOG"
    fi
    [[ $rc -ne 0 ]] && FAILED=1
    SUMMARY+=("host|$(result_word $rc)|$PART_SECONDS|-")
fi

# ---- 6. the canary's overhead on HF transformers' continuous batching
if has_part hf; then
    # shellcheck disable=SC2086
    OUT="$OUT" run_part hf "$T_HF" "$OUT/bench_transformers.log" "$PY" bench/bench_transformers.py ${HF_ARGS:---repeats 2}
    rc=$?
    [[ $rc -ne 0 ]] && FAILED=1
    SUMMARY+=("hf|$(result_word $rc)|$PART_SECONDS|-")
fi

# ---- 7. hardware counters of the plan-free verify (B, and A with the L2 warm) and of the decode writes (A)
if has_part ncu; then
    NCU="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)"
    if [[ -z "$NCU" ]]; then
        SUMMARY+=("ncu|NOT RUN: ncu not found|0|-")
    else
        # Instructions executed and how busy the issue slots are: what bounds a kernel once its data is in L2.
        INST=(--section SchedulerStats --metrics smsp__inst_executed.sum,smsp__thread_inst_executed.sum)
        run_part ncu "$T_NCU" "$OUT/ncu.log" "$NCU" --clock-control none -k regex:kvc_verify_from_table --launch-skip 2 \
            --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
            --section WarpStateStats --section LaunchStats "${INST[@]}" "$PY" bench/profile_verify_table.py --shape B
        rc=$?
        # The verify at A with the L2 left warm (as in a graph replay), with how much of its reads the L2 kept from
        # the launch before (its hit rate, the DRAM bytes and the L2 requests: one per entry's record, the second
        # 16-byte load of a record being served by the L1; docs/BENCHMARKS.md, 2026-12-06).
        L2M=(--metrics "smsp__inst_executed.sum,smsp__thread_inst_executed.sum,lts__t_sector_op_read_hit_rate.pct,\
dram__bytes_read.sum,lts__t_requests_srcunit_tex_op_read.sum,l1tex__t_sector_hit_rate.pct")
        "$NCU" --clock-control none --cache-control none -k regex:kvc_verify_from_table --launch-skip 2 \
            --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats "${L2M[@]}" \
            "$PY" bench/profile_verify_table.py --shape A >> "$OUT/ncu.log" 2>&1 || rc=1
        # The same on the verify's 64-bit modules only (kvcanary.ops.cuda.specs.FLAT32 off): instructions per entry.
        "$NCU" --clock-control none --cache-control none -k regex:kvc_verify_from_table --launch-skip 2 \
            --launch-count 1 --section SpeedOfLight --section WarpStateStats "${INST[@]}" \
            "$PY" bench/profile_verify_table.py --shape A --op verify_table_64 >> "$OUT/ncu.log" 2>&1 || rc=1
        # The decode writes at A: the plan-free write against the plan-based one.
        "$NCU" --clock-control none -k regex:kvc_write_from_table --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy "${INST[@]}" \
            "$PY" bench/profile_verify_table.py --shape A --op write_table >> "$OUT/ncu.log" 2>&1 || rc=1
        # B (1024 rows: every block reads them all, four per thread): where its time above A's goes.
        "$NCU" --clock-control none -k regex:kvc_write_from_table --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters \
            "${INST[@]}" "$PY" bench/profile_verify_table.py --shape B --op write_table >> "$OUT/ncu.log" 2>&1 || rc=1
        "$NCU" --clock-control none -k 'regex:^kvc_write$' --launch-skip 4 --launch-count 1 \
            --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy "${INST[@]}" \
            "$PY" bench/profile_verify_table.py --shape A --op write >> "$OUT/ncu.log" 2>&1 || rc=1
        SUMMARY+=("ncu|$(result_word $rc)|$PART_SECONDS|-")
    fi
fi

# ---- 8. per-block and per-warp timeline of the plan-free verify at A
if has_part timeline; then
    run_part timeline "$T_TIMELINE" "$OUT/timeline.md" "$PY" bench/timeline_verify_table.py ${TIMELINE_ARGS:-}
    rc=$?
    [[ $rc -ne 0 ]] && FAILED=1
    SUMMARY+=("timeline|$(result_word $rc)|$PART_SECONDS|-")
fi

# ---- 9. (opt-in: RUN_PARTS=... tune) launch-geometry sweep of the plan-free kernels (TUNE_ARGS="--kernel write_table")
if has_part tune; then
    OUT="$OUT" run_part tune "$T_TUNE" "$OUT/tune.log" "$PY" bench/tune_geometry.py ${TUNE_ARGS:-}
    rc=$?
    [[ $rc -ne 0 ]] && FAILED=1
    SUMMARY+=("tune|$(result_word $rc)|$PART_SECONDS|-")
fi

{
    echo
    echo "| part | result | seconds | sanitizer errors |"
    echo "|---|---|---|---|"
    for row in "${SUMMARY[@]}"; do
        IFS='|' read -r p r s e <<<"$row"
        echo "| $p | $r | $s | $e |"
    done
    echo
    [[ $FAILED -eq 0 ]] && echo "run_all: ALL PASSED" || echo "run_all: FAILURES (see the logs in $OUT)"
} | tee -a "$OUT/summary.md"
exit $FAILED
