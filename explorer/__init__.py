"""Fusion Explorer: see, choose and measure operator fusion in deep-learning models.

The package is layered. The engine (``zoo``, ``sources``, ``capture``,
``onnx_import``, ``ops``, ``graph_model``, ``patterns``, ``fusion_engine``,
``plan``, ``rewrite``, ``kernels``, ``gpu_runner``) imports torch, onnx and
networkx only. The views (``app``, ``ui.graph``, ``ui.charts``) import
Streamlit, plotly and pyvis and sit on top. Importing this package does no
work and pulls in nothing heavy.
"""

__version__ = "0.1.0"
