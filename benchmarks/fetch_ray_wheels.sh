#!/usr/bin/env bash
# Fetch Ray (the sweep's --backend ray) as wheels for the GPU machine (python 3.12, x86-64, no registry there),
# split in two halves: Ray's wheel alone (about 76 MiB for 2.60.0) is over the 64 MiB a device call may carry.
#
# Run it here, from the repository root:
#
#     bash benchmarks/fetch_ray_wheels.sh
#
# It writes .rayw/a/ and .rayw/b/ (ignored by git, each under 45 MiB): Ray's wheel cut in two (ray.whl.part-aa,
# -ab) and the small wheels of the dependencies the H200 image lacks (msgpack, filelock, pyyaml, jsonschema and its
# own: jsonschema-specifications, referencing, rpds-py, attrs; click). On the device, two calls on the same warm
# machine. A carried path replaces its parent folder there (carrying .rayw/b removes the .rayw/a an earlier call
# left), so the first half is copied out of the tree first:
#
#     call 1, carry [".rayw/a"]:   mkdir -p /tmp/rayw && cp .rayw/a/ray.whl.part-aa /tmp/rayw/
#     call 2, carry [".rayw/b"]:   cat /tmp/rayw/ray.whl.part-aa .rayw/b/ray.whl.part-ab > /tmp/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl \
#         && python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/ray-*.whl .rayw/b/*.whl \
#         && export PYTHONPATH=/tmp/site:$PWD && python3 -c "import ray; print(ray.__version__)"
#
# (measured on the H200, 2026-12-02: Ray 2.60.0 imports with these; the machine is given back after 30 minutes
# held or when idle: then both calls again).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
VERSION=${RAY_VERSION:-2.60.0}
grep -qx '/.rayw/' .git/info/exclude 2>/dev/null || echo '/.rayw/' >> "$(git rev-parse --git-common-dir)/info/exclude"
rm -rf .rayw && mkdir -p .rayw/a .rayw/b .rayw/dl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .rayw/dl "ray==$VERSION"
for name in msgpack filelock pyyaml jsonschema jsonschema-specifications referencing rpds-py attrs click; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d .rayw/b "$name"
done
wheel=$(ls .rayw/dl/ray-*.whl)
half=$(( ($(stat -c %s "$wheel") + 1) / 2 ))
split -b "$half" "$wheel" .rayw/dl/ray.whl.part-
mv .rayw/dl/ray.whl.part-aa .rayw/a/ && mv .rayw/dl/ray.whl.part-ab .rayw/b/
( cd .rayw/dl && sha256sum "$(basename "$wheel")" ) > .rayw/b/SHA256
rm -rf .rayw/dl
du -sh .rayw/a .rayw/b
