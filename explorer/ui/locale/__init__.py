"""The app's strings in English and 中文, one module per page or subject.

Each module defines ``STRINGS = {key: (english, chinese)}`` (``explorer.ui.i18n``
merges them; a key may be defined once). Keys are ``<module>.<what>``:
``learn.*`` and ``tour.*`` (the Learn page), ``teach.*``/``ex.*``/``pred.*``/
``sweep.*``/``bisect.*``/``diagram.*``/``family.*`` (the teaching views),
``app.*`` (the sidebar and the frame). ``patterns.py`` translates the
patterns' teaching texts by their English text (``TEXTS``) and ``messages.py``
the engine's English messages by pattern (``RULES``).

Chinese follows the seed document's terms (shared/seed/operator-fusion-overview.zh.txt):
算子融合, 内核启动 (Kernel Launch), 访存, 中间结果, 显存, 寄存器压力, 折叠, 批归一化 (BN),
层归一化 (LayerNorm), 残差, 算术强度, 带宽, 推理, 训练.

Adding a page's strings (phase 2 of issue 14): create ``locale/<page>.py`` with its
``STRINGS``, route every user-facing literal of the page through ``t("<page>.<what>")``,
and remove the page from ``NOT_YET_TRANSLATED`` in ``tests/test_i18n.py``; the test then
lists any literal left behind.
"""
