"""Sweeps: many models × plans × shapes × dtypes, each point measured by ``explorer.gpu_runner.run``.

A sweep is a value (``spec.SweepSpec``: read from a TOML or YAML file, or built
from the command line's flags) that expands to points (``spec.Point``). The
scheduler (``runner.run_sweep``) hands the points to workers (``worker.Worker``),
one per GPU or one on the CPU, through a backend: ``backends.LocalBackend``
(worker processes of this host) or ``backends.RayBackend`` (Ray Core actors,
``num_gpus=1`` each, on a local Ray or an existing cluster). A worker measures a
point with the runner every other command uses (the same child process, report
and paired-test verdicts), never a second measurement path, and records the
device, driver, clocks, library versions and host load beside it.

Results go to a sweep folder (``store.SweepStore``): a JSON Lines journal, one
record per point (``results.jsonl``, appended as points finish, so an interrupted
sweep resumes), a Parquet copy of the latest record of each point
(``results.parquet``, pyarrow), and each point's full report
(``reports/<key>.json``). A point's cache key (``spec.cache_key``) is the model's
graph fingerprint, the plan's fingerprint, the shape, dtype, memory format,
CUDA graphs, device name, driver, torch and Triton versions: a re-run skips the
points measured already, ``force`` re-measures them.

Layer 4 (runtime): no Streamlit, plotly or pyvis; Ray is imported only by the
Ray backend, and only when it is asked for.
"""
