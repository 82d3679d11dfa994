"""Teaching fusion on the user's own model: predictions, worked examples and the teaching report.

- ``predict``: a roofline of the device (``explorer.runtime.ceilings``), each
  chain's arithmetic intensity and its predicted gain from the bytes and
  launches it saves, and why a measured gain is far from the prediction.
- ``examples``: worked examples computed from the loaded model: one output
  channel of a Conv+BN fold, and the bytes each version of a chain reads and
  writes, one example per pattern family present.
- ``report``: the teaching report (``benchmarks/teach_reports.py`` writes it
  on a GPU; the app opens it anywhere): its schema, version and validation.

Layer 4 (it reads the runtime's byte model and ceilings); no UI packages.
"""
