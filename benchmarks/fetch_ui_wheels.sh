#!/usr/bin/env bash
# Fetch the app's UI packages as wheels for the GPU machine (python 3.12, x86-64, no registry there).
#
# The H200 image has torch, triton, pandas, pyarrow, numpy, jinja2, requests, protobuf, pillow, click,
# attrs, narwhals, networkx, scipy, packaging, pygments, typing-extensions (KINDS.md's list) but no
# streamlit, plotly, pyvis or igraph. This downloads those and every dependency the image lacks, one
# version each (the versions this checkout's .venv runs, so the app is tested with what it was
# developed against), into .whl/ (ignored by git), and checks the total stays well under the 64 MiB a
# device call may carry. Run it here, from the repository root:
#
#     bash benchmarks/fetch_ui_wheels.sh
#
# then on the device, first thing in the command (carry: [".whl"]):
#
#     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#         --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEST=.whl
LIMIT_MB=${LIMIT_MB:-40}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p "$DEST"

# What the device image lacks (streamlit, plotly, pyvis, igraph and their dependencies). Left out on
# purpose: pydeck (11 MB; streamlit imports it only for st.pydeck_chart, which the app never calls) and
# jedi (5 MB; IPython's completer, which pyvis's IPython.display import never reaches).
# benchmarks/app_on_gpu.py blocks both imports, so its CPU smoke run proves the app runs without them.
NAMES=(streamlit altair blinker cachetools tenacity toml gitpython gitdb smmap tornado watchdog
       jsonschema jsonschema-specifications referencing rpds-py
       plotly pyvis jsonpickle ipython ipython-pygments-lexers decorator parso matplotlib-inline
       pexpect ptyprocess prompt-toolkit wcwidth stack-data asttokens executing pure-eval traitlets
       igraph texttable starlette uvicorn python-multipart websockets itsdangerous)

# One version each: the local .venv's where it has the package.
declare -A HAVE
while IFS='==' read -r name _ version; do
    HAVE["$(echo "$name" | tr 'A-Z_' 'a-z-')"]="$version"
done < <("$PY" -m pip list --format=freeze 2>/dev/null | sed 's/==/==/')

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64)
for name in "${NAMES[@]}"; do
    version="${HAVE[$name]:-}"
    spec="$name${version:+==$version}"
    if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            "${PLATFORMS[@]}" -d "$DEST" "$spec" 2>/dev/null; then
        echo "fetch_ui_wheels: $spec not found as a wheel for cp312 x86-64; trying the newest" >&2
        "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            "${PLATFORMS[@]}" -d "$DEST" "$name"
    fi
done

# One version of each package: two stop the whole install on the device.
dupes=$(ls "$DEST"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z_' 'a-z-' | sort | uniq -d)
if [ -n "$dupes" ]; then
    echo "fetch_ui_wheels: more than one version of: $dupes (remove the older from $DEST)" >&2
    exit 1
fi
total_kb=$(du -sk "$DEST" | cut -f1)
echo "fetch_ui_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $((total_kb / 1024)) MiB in $DEST (limit ${LIMIT_MB} MiB)"
if [ "$total_kb" -gt $((LIMIT_MB * 1024)) ]; then
    echo "fetch_ui_wheels: over ${LIMIT_MB} MiB: the working tree that travels is limited to 64 MiB" >&2
    exit 1
fi
