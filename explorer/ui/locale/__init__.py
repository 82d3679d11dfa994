"""The app's strings in English and 中文, one module per page or subject.

Each module defines ``STRINGS = {key: (english, chinese)}`` (``explorer.ui.i18n``
merges them; a key may be defined once). Keys are ``<module>.<what>``:
``learn.*`` and ``tour.*`` (the Learn page), ``teach.*``/``ex.*``/``pred.*``/
``sweep.*``/``bisect.*``/``diagram.*`` (the teaching views),
``app.*`` (the sidebar and the frame), ``graph.*`` and ``gv.*`` (the Graph
page and the drawn graph of ``explorer.ui.graph``), ``fusions.*`` and
``verdict.*`` (the Fusions page, a report's verdict labels), ``export.*``,
``links.*``, ``run.*``, ``results.*`` and ``chart.*`` (the Run and Results pages
and the run report's figures and tables), ``state.*`` (loading, the page
boundary's error line, a run's live progress). A module may also define ``TEXTS = {english: chinese}``: the
translation memory for texts written in English elsewhere and looked up by
that text (``zoo.py``: the zoo's descriptions). What the runtime writes (plans,
progress, run and report-file errors, upload errors, the notes a run report
carries) is not here either: ``explorer/messages.py`` declares it as ``Words``.

What a fusion family says (its patterns' texts, near misses, refusals, kernel
labels, its title) is not here: each family declares it in both languages beside
its patterns (``explorer/fusions/<family>.py``'s ``WORDS``), as messages with ids.

Chinese follows the terms of the reference article (docs/reference-article.zh.txt):
算子融合, 内核启动 (Kernel Launch), 访存, 中间结果, 显存, 寄存器压力, 折叠, 批归一化 (BN),
层归一化 (LayerNorm), 残差, 算术强度, 带宽, 推理, 训练.

Adding a page's strings: create ``locale/<page>.py`` with its ``STRINGS`` and route every
user-facing literal of the page through ``t("<page>.<what>")``; ``tests/test_i18n.py`` lists
any literal left behind (``NOT_YET_TRANSLATED`` is empty since phase 2 of issue 14).
"""
