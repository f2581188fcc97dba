# Sourced by run.sh and the check scripts (check_NAME.sh): the environment of the acceptance run.
# Set by run.sh: XSEG_GPU_EMULATOR (0|1), XSEG_GPU_QUICK (0|1), XSEG_GPU_BUILD (build folder),
# XSEG_GPU_WORK (this check's scratch folder: raw logs, tarred into $OUT/logs.tgz),
# XSEG_GPU_DEADLINE (when this check's time ends, epoch seconds), XSEG_GPU_PREVIOUS (the
# summary.json a --resume continues, or empty), XSEG_GPU_ROOT (repository root).
GPU_DIR="$XSEG_GPU_ROOT/benchmarks/gpu"
PY=${PYTHON:-python3}

# check NAME pass|fail|skip|not-reached [REASON]: one item of this check.
check() { "$PY" "$GPU_DIR/summary.py" check "$XSEG_GPU_WORK" "$@"; }
# summarize tests|lines|junit ARGS...: summary.py reading a tool's output into items; a failure
# of its own is an item that fails (its traceback is in check.log), never a silent loss.
summarize() {
    "$PY" "$GPU_DIR/summary.py" "$1" "$XSEG_GPU_WORK" "${@:2}" ||
        check "summary.py $1 $(basename "$2")" fail "summary.py could not read $(basename "$2") (traceback in check.log)"
}
# data KEY FILE.json: a JSON value stored under data.KEY of this check's line.
data() { "$PY" "$GPU_DIR/summary.py" data "$XSEG_GPU_WORK" "$@"; }
# run_logged NAME CMD...: runs CMD with its output in WORK/NAME.log; returns CMD's status.
run_logged() {
    local name=$1; shift
    echo "\$ $*" > "$XSEG_GPU_WORK/$name.log"
    "$@" >> "$XSEG_GPU_WORK/$name.log" 2>&1
}
# A CUDA build of PyTorch with a device, or the reason there is none (on stdout).
torch_reason() {
    if [ "$XSEG_GPU_EMULATOR" = 1 ]; then
        echo "emulator dry run: PyTorch runs on the real driver only (the adapter never loads cudaemu)"
        return
    fi
    "$PY" - <<'PYEOF' 2>/dev/null || echo "python3 cannot import torch"
try:
    import torch
except ImportError:
    print("PyTorch is not installed"); raise SystemExit
if torch.version.cuda is None:
    print("this PyTorch has no CUDA support")
elif not torch.cuda.is_available():
    print("torch.cuda.is_available() is False")
PYEOF
}

# The tools a bare GPU image lacks, from the Debian packages prepare.sh put in .gpu-deps/,
# unpacked (never installed) into build-gpu-deps/; each only where the machine has none of its own.
gpu_deps_env() {
    local deps="$XSEG_GPU_ROOT/build-gpu-deps" arch
    ls "$XSEG_GPU_ROOT"/.gpu-deps/*.deb >/dev/null 2>&1 || return 0
    if [ ! -f "$deps/.unpacked" ]; then
        rm -rf "$deps"
        "$PY" "$GPU_DIR/unpack_deb.py" "$deps" "$XSEG_GPU_ROOT"/.gpu-deps/*.deb || return 1
        touch "$deps/.unpacked"
    fi
    arch=$(ls -d "$deps"/usr/lib/*-linux-gnu 2>/dev/null | head -1)
    mkdir -p "$deps/bin" "$deps/pkgconfig"
    export LD_LIBRARY_PATH="$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    if ! command -v pkg-config >/dev/null; then
        ln -sf "$deps/usr/bin/pkgconf" "$deps/bin/pkg-config"
        export PATH="$deps/bin:$PATH"
    fi
    if ! pkg-config --exists cmocka 2>/dev/null; then
        # The package's .pc names /usr: point it at the private prefix.
        sed "s|/usr|$deps/usr|g" "$arch/pkgconfig/cmocka.pc" > "$deps/pkgconfig/cmocka.pc"
        export PKG_CONFIG_PATH="$deps/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    fi
    if ! command -v meson >/dev/null; then
        printf '#!/bin/sh\nPYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}" exec %s "%s" "$@"\n' \
            "$deps/usr/lib/python3/dist-packages" "$(command -v "$PY")" "$deps/usr/bin/meson" > "$deps/bin/meson"
        chmod +x "$deps/bin/meson"
        export PATH="$deps/bin:$PATH"
    fi
    if ! command -v ninja >/dev/null; then
        ln -sf "$deps/usr/bin/ninja" "$deps/bin/ninja"
        export PATH="$deps/bin:$PATH"
    fi
    # pytest: only its own folder, so Debian's other Python modules never shadow the image's.
    # Wanted where either Python lacks it: $PY (the torch check's pytest) or /usr/bin/python3 (the
    # python suite's, as meson finds it). On the H200 (2026-11-27) $PY had pytest and
    # /usr/bin/python3 had none: the python suite was skipped again.
    XSEG_GPU_PY_PYTEST=1
    "$PY" -c 'import pytest' 2>/dev/null || XSEG_GPU_PY_PYTEST=0
    export XSEG_GPU_PY_PYTEST
    if [ "$XSEG_GPU_PY_PYTEST" = 0 ] ||
       { [ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c 'import pytest' 2>/dev/null; }; then
        local pt="$deps/pytest-path" m
        mkdir -p "$pt"
        for m in _pytest pytest py.py pluggy iniconfig attr packaging; do
            [ -e "$deps/usr/lib/python3/dist-packages/$m" ] && ln -sfn "$deps/usr/lib/python3/dist-packages/$m" "$pt/$m"
        done
        export XSEG_GPU_PYTEST_PATH="$pt"
    fi
}

# run_pytest SECONDS ARGS...: the image's pytest, or the carried one, stopped after SECONDS.
run_pytest() {
    local limit=$1; shift
    timeout --kill-after=10 "$limit" \
        env PYTHONPATH="$([ "${XSEG_GPU_PY_PYTEST:-0}" = 1 ] || echo "${XSEG_GPU_PYTEST_PATH:+$XSEG_GPU_PYTEST_PATH:}")$XSEG_GPU_ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
        "$PY" -m pytest -p no:cacheprovider "$@"
}
# time_left [RESERVE]: seconds left before this check's limit (run.sh sets XSEG_GPU_DEADLINE),
# less 3 s to record what a step did and RESERVE for the steps after it; at least 5.
time_left() {
    local t=$(( ${XSEG_GPU_DEADLINE:-$(( $(date +%s) + 3600 ))} - $(date +%s) - 3 - ${1:-0} ))
    echo $(( t > 5 ? t : 5 ))
}
# meson_tests LIMIT LOGBASE LOG JSON ARGS...: `meson test ARGS` of the build, one test at a time,
# each under a limit of its own (test_limit.py, as meson's --wrapper: a quarter of its meson
# timeout, 10 to 90 s), all of it under LIMIT seconds; output in LOG, meson's JSON log copied to
# JSON. The status of meson test (124 or 137: stopped at LIMIT). Without the tests' table (meson
# introspect), the tests run under meson's own limits, and LOG says so.
meson_tests() {
    local limit=$1 base=$2 log=$3 json=$4 table=$XSEG_GPU_WORK/tests.json wrap=() rc
    shift 4
    [ -s "$table" ] || meson introspect "$XSEG_GPU_BUILD" --tests > "$table" 2> "$table.err" || rm -f "$table"
    if [ -s "$table" ]; then
        # The interpreter itself, not a launcher script (pyenv's shim costs a second a test here).
        local py
        py=$("$PY" -c 'import sys; print(sys.executable)' 2>/dev/null) || py=$PY
        wrap=(--wrapper "$py $GPU_DIR/test_limit.py $table")
        : > "$log"
    else
        echo "no per-test limits: meson introspect --tests failed: $(tail -1 "$table.err")" > "$log"
    fi
    rm -f "$XSEG_GPU_BUILD/meson-logs/$base".json "$XSEG_GPU_BUILD/meson-logs/$base"-*.json
    PYTHONPATH="${XSEG_GPU_PYTEST_PATH:+$XSEG_GPU_PYTEST_PATH${PYTHONPATH:+:}}${PYTHONPATH:-}" \
        timeout --kill-after=5 "$limit" meson test -C "$XSEG_GPU_BUILD" --no-rebuild --logbase "$base" --num-processes 1 \
        --print-errorlogs --timeout-multiplier 2 "${wrap[@]}" "$@" >> "$log" 2>&1
    rc=$?
    # With --wrapper, meson names its log LOGBASE-WRAPPER.json.
    cp "$(ls "$XSEG_GPU_BUILD/meson-logs/$base".json "$XSEG_GPU_BUILD/meson-logs/$base"-*.json 2>/dev/null | head -1)" \
        "$json" 2>/dev/null
    return $rc
}
# has_time SECONDS: whether this check has that much time left (before a step worth starting).
has_time() { [ $(( ${XSEG_GPU_DEADLINE:-$(( $(date +%s) + 3600 ))} - $(date +%s) - 3 )) -ge "$1" ]; }

# The build this run tests: an existing one (--build, the CI dry run), else build-gpu
# (-Demulator=false: the tests load the real libcuda.so.1) or build-gpu-emu (--emulator).
ensure_build() {
    local b=$XSEG_GPU_BUILD emu=false
    [ "$XSEG_GPU_EMULATOR" = 1 ] && emu=true
    if [ "${XSEG_GPU_BUILD_GIVEN:-0}" = 1 ]; then
        # --build: built by the caller (the CI dry run runs inside that build's own meson test).
        [ -f "$b/build.ninja" ] || { echo "--build $b: not a meson build folder" > "$XSEG_GPU_WORK/ninja.log"; return 1; }
        echo "using the existing build $b (--build)" > "$XSEG_GPU_WORK/ninja.log"
        return 0
    fi
    if [ ! -f "$b/build.ninja" ]; then
        # The python suite is configured where /usr/bin/python3 imports pytest: the carried one
        # too (on the H200 the image's had none, and the suite was skipped).
        PYTHONPATH="${XSEG_GPU_PYTEST_PATH:+$XSEG_GPU_PYTEST_PATH${PYTHONPATH:+:}}${PYTHONPATH:-}" \
            run_logged meson-setup meson setup "$b" -Demulator=$emu -Dtests=enabled || return 1
    fi
    run_logged ninja ninja -C "$b" ${XSEG_GPU_NINJA_JOBS:+-j "$XSEG_GPU_NINJA_JOBS"} || return 1
}
