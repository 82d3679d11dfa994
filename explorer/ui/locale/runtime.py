"""中文 for what the measurement runtime writes in English: its progress, its errors, and the notes a run report carries.

The runtime (``explorer/runtime/*``, ``explorer/gpu_runner.py``, ``explorer/stats.py``,
``explorer/report.py``) never imports the UI: it writes English, and the app
translates at the moment it shows a text, through ``explorer.ui.i18n.message``.
``RULES`` here are merged after those of ``locale/messages.py`` (plans, notes,
progress; a fusion family's own words are messages with ids, not rules), in the
same form: a regular expression matching the whole English text, and its Chinese template with ``{0}``, ``{1}``, ... for the groups; a
group named ``msg...`` is a message itself (translated by the rules again).

What is here, and where the app shows it:

- progress of a run (``explorer.runtime.progress.Schedule``: "<status> · about
  N s left", "done in N s") and of the app's job ("starting…", "cancelling…"):
  the Run page and the sidebar;
- run errors (``RunError`` of the runner and its child process, the job's own
  lines in ``explorer.ui.state``): the Run page;
- errors of a report file (``explorer.report``, ``explorer.jsonfile``,
  ``explorer.ui.files.load_report``, ``explorer.teaching.report``) and of an
  upload (``explorer.ui.files``): the Results page and the sidebar;
- the notes of a run report (memory, launches, precision, rotation, byte model,
  stages, verdict notes, baselines' errors): the Run and Results pages.

``tests/test_i18n.py`` checks every rule on the example beside it, and that
every note of the committed reports (``benchmarks/results/report_*.json``) has
its Chinese.
"""

#: The JSON and schema types the validators name ("must be an object, got list").
_TYPES = r"(?:an object|a list|a string|a number|an integer|a boolean|true or false|null)"

#: (regex, Chinese template, an English example the regex must match)
EXAMPLES: list[tuple[str, str, str]] = [
    # ------------------------------------------------------------------ progress (runtime.progress, runtime.session, ...)
    (r"(?P<msg>.+) · about (?P<msg2>\d+ s|\d+ min \d+ s) left", "{0} · 约剩 {1}",
     "timing unfused vs fused, round 3/20 · about 12 s left"),
    (r"done in (?P<msg>\d+ s|\d+ min \d+ s)", "完成，用时 {0}", "done in 1 min 05 s"),
    (r"(\d+) s", "{0} 秒", "45 s"),
    (r"(\d+) min (\d+) s", "{0} 分 {1} 秒", "3 min 20 s"),
    (r"starting…", "正在启动…", "starting…"),
    (r"cancelling…", "正在取消…", "cancelling…"),
    (r"loading (.+)", "正在加载 {0}", "loading resnet50"),
    (r"applying the plan", "正在应用融合计划", "applying the plan"),
    (r"preparing models \((\S+), (\S+), (\S+)\)", "正在准备模型（{0}，{1}，{2}）", "preparing models (fp32, cpu, nchw)"),
    (r"computing the float64 reference", "正在计算 float64 参照输出", "computing the float64 reference"),
    (r"warming up unfused and fused", "正在预热融合前和融合后的模型", "warming up unfused and fused"),
    (r"timing unfused vs fused, round (\d+)/(\d+)", "正在交替计时融合前与融合后，第 {0}/{1} 轮",
     "timing unfused vs fused, round 3/20"),
    (r"timing chain (\d+)/(\d+)", "正在给链计时：第 {0}/{1} 条", "timing chain 4/53"),
    (r"timed (\d+) chains", "已给 {0} 条链计时", "timed 53 chains"),
    (r"measuring stages", "正在测量各融合阶段", "measuring stages"),
    (r"timing (\d+) distinct stage graphs", "正在给 {0} 个不同的阶段计算图计时", "timing 3 distinct stage graphs"),
    (r"timing stages, round (\d+)/(\d+)", "正在给各阶段计时，第 {0}/{1} 轮", "timing stages, round 2/8"),
    (r"measuring eager and torch\.compile baselines", "正在测量 eager 与 torch.compile 基线",
     "measuring eager and torch.compile baselines"),
    (r"compiling with torch\.compile \((\S+)\)", "正在用 torch.compile 编译（{0}）",
     "compiling with torch.compile (max-autotune-no-cudagraphs)"),
    (r"timing (\d+) variants alternated", "正在交替给 {0} 个变体计时", "timing 3 variants alternated"),

    # ------------------------------------------------------------------ run errors (runtime.child, runtime.measure, ui.state)
    (r"cancelled", "已取消", "cancelled"),
    (r"could not start the measurement process: (.*)", "无法启动测量进程：{0}",
     "could not start the measurement process: [Errno 12] Cannot allocate memory"),
    (r"the measurement timed out after (\S+) s and was stopped", "测量超过 {0} 秒，已被停止",
     "the measurement timed out after 1800 s and was stopped"),
    (r"(?P<msg>.+); last stderr line: (.*)", "{0}；stderr 的最后一行：{1}",
     "the measurement process crashed with exit status 3; last stderr line: EXPLORER_CRASH_TEST=1: simulated crash"),
    (r"the measurement process was killed by (\S+) \(often: out of host memory\)",
     "测量进程被 {0} 终止（通常是主机内存不足）", "the measurement process was killed by SIGKILL (often: out of host memory)"),
    (r"the measurement process was killed by (.+)", "测量进程被 {0} 终止", "the measurement process was killed by SIGTERM"),
    (r"the measurement process ended without a report", "测量进程结束了，却没有给出报告",
     "the measurement process ended without a report"),
    (r"the measurement process crashed with exit status (\S+)", "测量进程崩溃，退出状态 {0}",
     "the measurement process crashed with exit status 3"),
    (r"out of GPU memory: (.*)", "GPU 显存不足：{0}", "out of GPU memory: CUDA out of memory. Tried to allocate 2 GiB"),
    (r"CUDA error: (.*)", "CUDA 错误：{0}", "CUDA error: RuntimeError: CUDA error: an illegal memory access"),
    (r"out of host memory: (.*)", "主机内存不足：{0}", "out of host memory: RuntimeError: not enough memory"),
    (r"measurement failed: (.*)", "测量失败：{0}", "measurement failed: ValueError: bad shape"),
    (r"device 'cuda' was requested but this machine has no usable CUDA GPU",
     "请求的设备是“cuda”，但这台机器没有可用的 CUDA GPU",
     "device 'cuda' was requested but this machine has no usable CUDA GPU"),
    (r"unknown device '(.*)' \(expected auto, cuda or cpu\)", "未知设备“{0}”（应为 auto、cuda 或 cpu）",
     "unknown device 'tpu' (expected auto, cuda or cpu)"),
    (r"unknown dtype '(.*)' \(expected fp32, fp16 or bf16\)", "未知数据类型“{0}”（应为 fp32、fp16 或 bf16）",
     "unknown dtype 'int8' (expected fp32, fp16 or bf16)"),
    (r"does not fit in memory: needs (\S+) GiB, (\S+) GiB available \((?P<msg>.+)\)",
     "内存放不下：需要 {0} GiB，可用 {1} GiB（{2}）",
     "does not fit in memory: needs 12.0 GiB, 3.5 GiB available (host memory, inputs alone)"),
    (r"host memory, inputs alone", "主机内存，仅算输入", "host memory, inputs alone"),
    (r"host memory, weights and largest activations", "主机内存，算上权重和最大的激活",
     "host memory, weights and largest activations"),
    (r"GPU memory, estimated from weights, inputs and largest activation", "GPU 显存，按权重、输入和最大的激活估算",
     "GPU memory, estimated from weights, inputs and largest activation"),
    (r"unknown torch\.compile mode\(s\) (.+): choose from (.+)", "未知的 torch.compile 模式 {0}：可选 {1}",
     "unknown torch.compile mode(s) fast: choose from default, reduce-overhead"),
    (r"cpu_threads must be at least 1, got (.+)", "cpu_threads 至少为 1，实际是 {0}", "cpu_threads must be at least 1, got 0"),
    (r"the measurement runner is not available: (.*)", "测量程序不可用：{0}",
     "the measurement runner is not available: No module named 'torch'"),
    (r"run failed \((\w+)\): (.*)", "运行失败（{0}）：{1}", "run failed (KeyError): 'x'"),
    (r"run failed", "运行失败", "run failed"),
    (r"unexpected error \((\w+)\): (.*)", "意外错误（{0}）：{1}", "unexpected error (KeyError): 'x'"),
    (r"could not load (.+): (\w+): (.*)", "无法加载 {0}：{1}：{2}", "could not load resnet50: KeyError: 'x'"),

    # ------------------------------------------------------------------ a report file (report, jsonfile, files, teaching.report)
    (r"(.+) is not a run report: it holds a JSON (?P<msg>\w+), not an object", "{0} 不是运行报告：其中是一个 JSON {1}，不是对象",
     "list.json is not a run report: it holds a JSON list, not an object"),
    (r"(.+) is not a run report: no integer 'version'", "{0} 不是运行报告：没有整数类型的“version”",
     "plan.json is not a run report: no integer 'version'"),
    (r"(.+): report version (.+) is not supported \(this explorer reads versions (.+)\)",
     "{0}：不支持报告版本 {1}（本程序能读取的版本：{2}）",
     "r.json: report version 9 is not supported (this explorer reads versions 1, 2)"),
    (r"(.+) is not a valid run report \(version 1\): '(.+)' must be an object", "{0} 不是有效的运行报告（版本 1）：“{1}”必须是对象",
     "r.json is not a valid run report (version 1): 'unfused' must be an object"),
    (r"(.+) is not a run report: no '(.+)' object with latency_ms", "{0} 不是运行报告：没有带 latency_ms 的“{1}”对象",
     "r.json is not a run report: no 'fused' object with latency_ms"),
    (r"(.+) is not a run report: '(.+)' is not a (?P<msg>\w+)", "{0} 不是运行报告：“{1}”不是{2}",
     "chains.json is not a run report: 'chains' is not a list"),
    (r"(.+) is not a valid run report: (?P<msg>.+)", "{0} 不是有效的运行报告：{1}",
     "typed.json is not a valid run report: 'chains[0].id' must be a string, got number"),
    (r"unknown field '(.+)'", "未知字段“{0}”", "unknown field 'chains[0].speed'"),
    (r"missing field '(.+)'", "缺少字段“{0}”", "missing field 'model.name'"),
    (r"'(.+)' must be (?P<msg>" + _TYPES + r"(?: or " + _TYPES + r")*), got (?P<msg2>\w+)",
     "“{0}”必须是{1}，实际是{2}", "'chains[0].id' must be a string, got number"),
    (r"(?P<msg>" + _TYPES + r") or (?P<msg2>.+)", "{0}或{1}", "a number or null"),
    (r"an object|object|dict", "对象", "an object"),
    (r"a list|list", "列表", "a list"),
    (r"a string|string", "字符串", "a string"),
    (r"a number|number", "数字", "number"),
    (r"an integer", "整数", "an integer"),
    (r"a boolean|boolean", "布尔值", "boolean"),
    (r"true or false", "true 或 false（布尔值）", "true or false"),
    (r"null", "空值（null）", "null"),
    (r"(.+) is not a JSON report: not UTF-8 text \((.*)\)", "{0} 不是 JSON 报告：不是 UTF-8 文本（{1}）",
     "garbage.json is not a JSON report: not UTF-8 text ('utf-8' codec can't decode byte 0x80 in position 0)"),
    (r"(.+) is not a JSON report here: nested (\d+) deep, more than (\d+)", "{0} 在这里不是 JSON 报告：嵌套 {1} 层，超过 {2} 层",
     "deep.json is not a JSON report here: nested 100 deep, more than 64"),
    (r"(.+) is not a JSON report: (?P<msg>.*)", "{0} 不是 JSON 报告：{1}",
     "broken.json is not a JSON report: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (r"Expecting (?P<msg>.+): line (\d+) column (\d+) \(char (\d+)\)", "第 {1} 行第 {2} 列（第 {3} 个字符）处应为{0}",
     "Expecting value: line 1 column 1 (char 0)"),
    (r"value", "一个值", "value"),
    (r"property name enclosed in double quotes", "用双引号括起的属性名", "property name enclosed in double quotes"),
    (r"'(.)' delimiter", "分隔符“{0}”", "',' delimiter"),
    (r"Extra data: line (\d+) column (\d+) \(char (\d+)\)", "多余的数据：第 {0} 行第 {1} 列（第 {2} 个字符）",
     "Extra data: line 1 column 5 (char 4)"),
    (r"Unterminated string starting at: line (\d+) column (\d+) \(char (\d+)\)",
     "字符串没有结束，起始于第 {0} 行第 {1} 列（第 {2} 个字符）", "Unterminated string starting at: line 1 column 2 (char 1)"),
    (r"Invalid control character at: line (\d+) column (\d+) \(char (\d+)\)",
     "无效的控制字符：第 {0} 行第 {1} 列（第 {2} 个字符）", "Invalid control character at: line 1 column 3 (char 2)"),
    (r"Invalid \\escape: line (\d+) column (\d+) \(char (\d+)\)", "无效的转义符：第 {0} 行第 {1} 列（第 {2} 个字符）",
     "Invalid \\escape: line 1 column 3 (char 2)"),
    (r"(.+): (\S+) MB is over the report limit of (\d+) MB", "{0}：{1} MB，超过了报告 {2} MB 的上限",
     "big.json: 51 MB is over the report limit of 50 MB"),
    (r"this report was measured on model '(.*)' \(graph (\S*)\), not on the model '(.*)' loaded here \(graph (\S*)\)",
     "这份报告测的是模型“{0}”（计算图 {1}），不是这里加载的模型“{2}”（计算图 {3}）",
     "this report was measured on model 'resnet50' (graph 0123), not on the model 'residual_block' loaded here "
     "(graph 4567)"),
    (r"this report was measured on model '(.*)' \(graph (\S*)\), not on the model loaded here \(graph (\S*)\)",
     "这份报告测的是模型“{0}”（计算图 {1}），不是这里加载的模型（计算图 {2}）",
     "this report was measured on model 'resnet50' (graph 0123), not on the model loaded here (graph 4567)"),
    (r"cannot read (.+): the path holds a NUL byte", "无法读取 {0}：路径中有 NUL 字节", "cannot read r.json: the path holds a NUL byte"),
    (r"cannot read (.+): it is (.+), not a regular file", "无法读取 {0}：它是 {1}，不是普通文件",
     "cannot read r.json: it is a directory, not a regular file"),
    (r"cannot read (.+): (.*)", "无法读取 {0}：{1}", "cannot read r.json: No such file or directory"),
    (r"(.+) grew past the limit of (\S+) MiB while being read", "{0} 在读取过程中变大，超过了 {1} MiB 的上限",
     "r.json grew past the limit of 50 MiB while being read"),
    # the teaching report (explorer.teaching.report)
    (r"(.+) is not a teaching report: it holds (?P<msg>.+), not an object", "{0} 不是教学报告：其中是{1}，不是对象",
     "t.json is not a teaching report: it holds a list, not an object"),
    (r"(.+) is not a teaching report: its 'schema' is missing, not '(.+)'", "{0} 不是教学报告：缺少“schema”（应为“{1}”）",
     "t.json is not a teaching report: its 'schema' is missing, not 'fusion-explorer-teaching-report'"),
    (r"(.+) is not a teaching report: its 'schema' is (.+), not '(.+)'", "{0} 不是教学报告：它的“schema”是 {1}，不是“{2}”",
     "t.json is not a teaching report: its 'schema' is 'x', not 'fusion-explorer-teaching-report'"),
    (r"(.+): teaching report version (.+) is not supported \(this explorer reads version (\d+)\)",
     "{0}：不支持教学报告版本 {1}（本程序读取版本 {2}）",
     "t.json: teaching report version 2 is not supported (this explorer reads version 1)"),
    (r"(.+) is not a valid teaching report: (?P<msg>.+)", "{0} 不是有效的教学报告：{1}",
     "t.json is not a valid teaching report: models[0].breakdown.fused.categories_ms.other: expected a number, got a "
     "string"),
    (r"(\S+): expected an object with a string 'id'", "{0}：应为带字符串“id”的对象", "models[0].measured[2]: expected an object "
     "with a string 'id'"),
    (r"(\S+): expected (?P<msg>" + _TYPES + r"), got (?P<msg2>.+)", "{0}：应为{1}，实际是{2}",
     "models[0].breakdown.fused.categories_ms.other: expected a number, got a string"),
    (r"(\S+): missing", "{0}：缺失", "models[0].fingerprint: missing"),
    (r"(\S+): not a finite number", "{0}：不是有限的数", "models[0].breakdown.fused.wall_ms: not a finite number"),
    (r"(\S+): negative", "{0}：为负数", "models[0].breakdown.fused.categories_ms.other: negative"),
    (r"(\S+): they add up to (\S+) ms, not the wall time (\S+) ms", "{0}：各项加起来是 {1} ms，不等于墙钟时间 {2} ms",
     "models[0].breakdown.unfused.categories_ms: they add up to 3.1 ms, not the wall time 2.1 ms"),
    (r"models: empty", "models：为空", "models: empty"),
    # notes of a teaching report's model entry (benchmarks/teach_reports.py)
    (r"ncu not run: DRAM bytes are measured on a GPU only", "没有运行 ncu：显存字节数只能在 GPU 上测量",
     "ncu not run: DRAM bytes are measured on a GPU only"),
    (r"staged table failed: (.*)", "分阶段表测量失败：{0}", "staged table failed: RuntimeError: x"),
    (r"staged table skipped: the run's time budget is spent", "已跳过分阶段表：本次运行的时间预算已用完",
     "staged table skipped: the run's time budget is spent"),
    (r"(\d+) chain\(s\) not timed: chain budget of (\d+) s spent", "{0} 条链没有计时：链的 {1} 秒时间预算已用完",
     "12 chain(s) not timed: chain budget of 300 s spent"),
    (r"chain (?!benchmark )(\S+) failed: (.*)", "链 {0} 失败：{1}", "chain conv_bn_act@conv2d failed: RuntimeError: x"),

    # ------------------------------------------------------------------ an upload (explorer.ui.files)
    (r"(.+): (\S+) MB is over the upload limit of (\d+) MB", "{0}：{1} MB，超过了 {2} MB 的上传上限",
     "model.onnx: 250 MB is over the upload limit of 200 MB"),
    (r"(.+): could not store the upload: (.*)", "{0}：无法保存上传的文件：{1}", "model.onnx: could not store the upload: "
     "No space left on device"),
    (r"(.+): not a zip file", "{0}：不是 zip 文件", "model.zip: not a zip file"),
    (r"(.+): (\d+) members is more than (\d+); refused", "{0}：有 {1} 个成员，超过 {2} 个；拒绝",
     "model.zip: 5000 members is more than 1000; refused"),
    (r"(.+): member (.+) would be written outside the archive; refused", "{0}：成员 {1} 会被写到压缩包之外；拒绝",
     "model.zip: member '../evil' would be written outside the archive; refused"),
    (r"(.+): member '(.+)' is a link or special file; refused", "{0}：成员“{1}”是链接或特殊文件；拒绝",
     "model.zip: member 'link' is a link or special file; refused"),
    (r"(.+): member '(.+)' inflates (\d+) times \((\S+) MB\); refused as a zip bomb",
     "{0}：成员“{1}”解压后膨胀 {2} 倍（{3} MB）；作为 zip 炸弹拒绝",
     "model.zip: member 'big' inflates 1000 times (300 MB); refused as a zip bomb"),
    (r"(.+): expands to (\S+) MB, over the limit of (\S+) MB", "{0}：解压后有 {1} MB，超过了 {2} MB 的上限",
     "model.zip: expands to 500 MB, over the limit of 400 MB"),
    (r"(.+): the zip must hold exactly one \.onnx or \.pt2 model, found (\d+)",
     "{0}：zip 中必须恰好有一个 .onnx 或 .pt2 模型，实际找到 {1} 个",
     "model.zip: the zip must hold exactly one .onnx or .pt2 model, found 2"),
    (r"(.+): member '(.+)' escapes the folder; refused", "{0}：成员“{1}”逃出了目标文件夹；拒绝",
     "model.zip: member 'a/../../b' escapes the folder; refused"),
    (r"(.+): member '(.+)' is larger than it declares", "{0}：成员“{1}”比它声明的大",
     "model.zip: member 'model.onnx' is larger than it declares"),
    (r"(.+): could not extract it \((\w+)\)", "{0}：无法解压（{1}）", "model.zip: could not extract it (BadZipFile)"),
    (r"the rewriter is not available: (.*)", "改写器不可用：{0}", "the rewriter is not available: No module named 'x'"),
    (r"torch\.export could not save the fused model: (.*)", "torch.export 无法保存融合后的模型：{0}",
     "torch.export could not save the fused model: unsupported op"),
    (r"torch\.onnx\.export failed: (.*)", "torch.onnx.export 失败：{0}", "torch.onnx.export failed: unsupported op"),

    # ------------------------------------------------------------------ loading a model (explorer.sources): the usual ones
    (r"no such file or folder: (.+)", "没有这个文件或文件夹：{0}", "no such file or folder: /tmp/x.onnx"),
    (r"(.+): unknown model format '(.+)' \(expected a zoo name, \.onnx, \.pt2 or a Hugging Face folder\)",
     "{0}：未知的模型格式“{1}”（应为模型库中的名字、.onnx、.pt2 或 Hugging Face 文件夹）",
     "x.bin: unknown model format '.bin' (expected a zoo name, .onnx, .pt2 or a Hugging Face folder)"),
    (r"(.+) is not a valid ONNX file \(no graph or outputs\)", "{0} 不是有效的 ONNX 文件（没有计算图或输出）",
     "x.onnx is not a valid ONNX file (no graph or outputs)"),
    (r"(.+) is not a valid ONNX file \((.+)\)", "{0} 不是有效的 ONNX 文件（{1}）", "broken.onnx is not a valid ONNX file "
     "(DecodeError)"),
    (r"unsupported ONNX operator\(s\) in (.+): (.+)", "{0} 中有不支持的 ONNX 算子：{1}",
     "unsupported ONNX operator(s) in nms.onnx: NonMaxSuppression"),
    (r"unsupported ONNX operator\(s\): (.+)", "不支持的 ONNX 算子：{0}", "unsupported ONNX operator(s): NonMaxSuppression"),
    (r"(.+): this is a pickle, not a torch\.export archive; pickles are refused because they can run arbitrary code",
     "{0}：这是一个 pickle 文件，不是 torch.export 归档；pickle 会执行任意代码，因此拒绝加载",
     "model.pt2: this is a pickle, not a torch.export archive; pickles are refused because they can run arbitrary code"),
    (r"(.+): pickled PyTorch files are refused because unpickling can run arbitrary code; save the model with "
     r"torch\.export\.save \(\.pt2\) or export it to ONNX",
     "{0}：拒绝加载 pickle 格式的 PyTorch 文件，因为反序列化会执行任意代码；请用 torch.export.save 保存模型（.pt2），"
     "或导出为 ONNX",
     "model.pth: pickled PyTorch files are refused because unpickling can run arbitrary code; save the model with "
     "torch.export.save (.pt2) or export it to ONNX"),
    (r"(.+): '(.+)' is stored as a pickle, which is refused because unpickling can run arbitrary code",
     "{0}：“{1}”以 pickle 格式存储；反序列化会执行任意代码，因此拒绝加载",
     "model.pt2: 'fc.weight' is stored as a pickle, which is refused because unpickling can run arbitrary code"),
    (r"(.+): not a torch\.export archive \(not a zip file\)", "{0}：不是 torch.export 归档（不是 zip 文件）",
     "model.pt2: not a torch.export archive (not a zip file)"),
    (r"could not capture (.+) with torch\.export: (.*)", "无法用 torch.export 捕获 {0}：{1}",
     "could not capture resnet50 with torch.export: data-dependent shape"),
    (r"(.+): not a folder", "{0}：不是文件夹", "/tmp/x: not a folder"),
    (r"(.+): not a Hugging Face model folder \(no config\.json\)", "{0}：不是 Hugging Face 模型文件夹（没有 config.json）",
     "/tmp/x: not a Hugging Face model folder (no config.json)"),
    (r"sequence length (\d+) exceeds this model's maximum of (\d+)", "序列长度 {0} 超过了这个模型的上限 {1}",
     "sequence length 9000 exceeds this model's maximum of 512"),
    (r"unknown model '(.+)': the zoo has (.+)", "未知模型“{0}”：模型库中有 {1}", "unknown model 'x': the zoo has resnet50, bert_base"),
    (r"batch must be at least 1, got (.+)", "批大小至少为 1，实际是 {0}", "batch must be at least 1, got 0"),
    (r"sequence length must be at least 1, got (.+)", "序列长度至少为 1，实际是 {0}", "sequence length must be at least 1, got 0"),

    # ------------------------------------------------------------------ notes of a run report (runtime.*, stats, report)
    (r"CPU run: no device allocator high-water mark; not measured", "CPU 运行：没有设备内存分配器的峰值记录；未测量",
     "CPU run: no device allocator high-water mark; not measured"),
    (r"peak = own weights \+ inputs \+ activation peak \(max_memory_allocated over one forward minus memory held "
     r"before it\)",
     "峰值 = 自身权重 + 输入 + 激活峰值（一次前向中的 max_memory_allocated 减去前向开始前已占用的显存）",
     "peak = own weights + inputs + activation peak (max_memory_allocated over one forward minus memory held before it)"),
    (r"cuda kernels", "CUDA 内核", "cuda kernels"),
    (r"aten ops \(cpu\)", "ATen 算子（CPU）", "aten ops (cpu)"),
    (r"not counted: (.*)", "未计数：{0}", "not counted: profiler failed"),
    (r"CUDA graphs need CUDA: plain calls on CPU", "CUDA graph 需要 CUDA：在 CPU 上按普通调用运行",
     "CUDA graphs need CUDA: plain calls on CPU"),
    (r"CUDA graph capture failed, plain calls instead: (.*)", "CUDA graph 捕获失败，改为普通调用：{0}",
     "CUDA graph capture failed, plain calls instead: operation not permitted when stream is capturing"),
    (r"timed as CUDA-graph replays of a forward captured on static inputs",
     "按 CUDA graph 回放计时（在静态输入上捕获的一次前向）",
     "timed as CUDA-graph replays of a forward captured on static inputs"),
    (r"timed as cudagraph-tree replays \(torch\.compile's own CUDA graphs\)",
     "按 cudagraph tree 回放计时（torch.compile 自己的 CUDA graph）",
     "timed as cudagraph-tree replays (torch.compile's own CUDA graphs)"),
    (r"max_rel = max\|out-ref\| / max\|ref\|; rel_l2 = \|\|out-ref\|\| / \|\|ref\|\|; ref = (?P<msg>.+); top1_agreement "
     r"only for classification \(argmax of last dim\); relative figures are refused \(with the reason\) when the "
     r"reference is all zero, constant or denormal in the run's dtype",
     "max_rel = max|out-ref| / max|ref|；rel_l2 = ||out-ref|| / ||ref||；ref = {0}；top1_agreement 只用于分类模型"
     "（最后一维的 argmax）；参照输出全为零、为常数，或在本次运行的数据类型中是非规格化数时，不给相对误差（并写明原因）",
     "max_rel = max|out-ref| / max|ref|; rel_l2 = ||out-ref|| / ||ref||; ref = unfused graph in float64 on cpu; "
     "top1_agreement only for classification (argmax of last dim); relative figures are refused (with the reason) "
     "when the reference is all zero, constant or denormal in the run's dtype"),
    (r"max_rel = max\|out-ref\| / max\|ref\|; rel_l2 = \|\|out-ref\|\| / \|\|ref\|\|; ref = (?P<msg>.+); top1_agreement "
     r"only for classification \(argmax of last dim\)",
     "max_rel = max|out-ref| / max|ref|；rel_l2 = ||out-ref|| / ||ref||；ref = {0}；top1_agreement 只用于分类模型"
     "（最后一维的 argmax）",
     "max_rel = max|out-ref| / max|ref|; rel_l2 = ||out-ref|| / ||ref||; ref = unfused graph in float64 on cuda; "
     "top1_agreement only for classification (argmax of last dim)"),
    (r"unfused graph in float64 on (\S+)", "融合前的计算图，在 {0} 上以 float64 计算", "unfused graph in float64 on cpu"),
    (r"the reference output is empty", "参照输出为空", "the reference output is empty"),
    (r"the reference output is not finite", "参照输出中有非有限值", "the reference output is not finite"),
    (r"the reference output is all zero: relative errors would divide by zero", "参照输出全为零：相对误差会除以零",
     "the reference output is all zero: relative errors would divide by zero"),
    (r"the reference output is constant \(every element (\S+)\): relative errors say nothing about the model",
     "参照输出是常数（每个元素都是 {0}）：相对误差说明不了模型的任何问题",
     "the reference output is constant (every element 0.5): relative errors say nothing about the model"),
    (r"the reference output is denormal in (\S+) \(largest \|value\| (\S+), smallest normal (\S+)\): relative errors "
     r"would measure underflow, not fusion",
     "参照输出在 {0} 中是非规格化数（最大 |值| {1}，最小规格化数 {2}）：相对误差量出的是下溢，不是融合带来的误差",
     "the reference output is denormal in float16 (largest |value| 1.00e-08, smallest normal 6.10e-05): relative "
     "errors would measure underflow, not fusion"),
    (r"no comparable floating outputs", "没有可比较的浮点输出", "no comparable floating outputs"),
    (r"CPU run: chain inputs and weights are the same tensors every call and may stay in the CPU's caches \(not "
     r"rotated\)",
     "CPU 运行：每次调用的链输入和权重都是同一批张量，可能一直留在 CPU 缓存中（没有轮换）",
     "CPU run: chain inputs and weights are the same tensors every call and may stay in the CPU's caches (not rotated)"),
    (r"L2 flushed before every timed call \((\S+) MiB zeroed; L2 is (\S+) MiB\), as triton\.testing\.do_bench does: "
     r"inputs and weights come from device memory",
     "每次计时调用之前都清空 L2（清零 {0} MiB；L2 为 {1} MiB），与 triton.testing.do_bench 的做法相同：输入和权重都从显存读取",
     "L2 flushed before every timed call (120 MiB zeroed; L2 is 60 MiB), as triton.testing.do_bench does: inputs and "
     "weights come from device memory"),
    (r"version 1: chain inputs were the same tensors every call \(cache-resident\), not rotated",
     "版本 1：每次调用的链输入都是同一批张量（留在缓存中），没有轮换",
     "version 1: chain inputs were the same tensors every call (cache-resident), not rotated"),
    (r"not rotated \(version 1\)", "没有轮换（版本 1）", "not rotated (version 1)"),
    (r"CUDA graphs requested but ignored: they need CUDA", "请求了 CUDA graph，但已忽略：它需要 CUDA",
     "CUDA graphs requested but ignored: they need CUDA"),
    (r"per-chain micro-benchmarks not run \(quick mode\)", "没有运行逐链微基准（快速模式）",
     "per-chain micro-benchmarks not run (quick mode)"),
    (r"per-chain micro-benchmarks not run \(per_chain off\)", "没有运行逐链微基准（per_chain 已关闭）",
     "per-chain micro-benchmarks not run (per_chain off)"),
    (r"quick mode: fewer repetitions and no per-chain timing; verdicts may be undecided",
     "快速模式：重复次数更少，不做逐链计时；结论可能无法判定",
     "quick mode: fewer repetitions and no per-chain timing; verdicts may be undecided"),
    (r"(\d+) intra-op thread\(s\) on the CPU \(quick mode's default: stable on a shared CPU\)",
     "CPU 上用 {0} 个算子内线程（快速模式的默认值：在共享的 CPU 上更稳定）",
     "1 intra-op thread(s) on the CPU (quick mode's default: stable on a shared CPU)"),
    (r"(\d+) intra-op thread\(s\) on the CPU", "CPU 上用 {0} 个算子内线程", "2 intra-op thread(s) on the CPU"),
    (r"Upgraded from report version 1: per-chain verdicts are the old spread rule \(fused p20 above unfused p80\), "
     r"not a statistical test; re-measure for tested verdicts\.?",
     "由版本 1 的报告升级而来：逐链结论用的是旧的离散度规则（融合后的 p20 高于融合前的 p80），不是统计检验；"
     "要得到经过检验的结论，请重新测量。",
     "Upgraded from report version 1: per-chain verdicts are the old spread rule (fused p20 above unfused p80), not a "
     "statistical test; re-measure for tested verdicts."),
    (r"graph byte model: each op reads its inputs and weights once and writes its outputs once; captured in float32, "
     r"floating tensors scaled by (\S+) for (\S+); fused = unfused minus the fused chains' intermediates",
     "计算图字节模型：每个算子把输入和权重各读一次、把输出写一次；以 float32 捕获，浮点张量按 {1} 乘以 {0}；"
     "融合后 = 融合前 − 已融合链的中间结果",
     "graph byte model: each op reads its inputs and weights once and writes its outputs once; captured in float32, "
     "floating tensors scaled by 0.5 for fp16; fused = unfused minus the fused chains' intermediates"),
    (r"unfused and fused graphs alike are timed lean \(explorer\.runtime\.lean\): ATen calls through their public "
     r"bindings, fused calls resolved once to the library call they take on this device, weights read as plain "
     r"attributes; the same kernels either way",
     "融合前和融合后的计算图一样以精简方式计时（explorer.runtime.lean）：ATen 调用走公开的绑定，融合调用在这台设备上"
     "一次性解析到它实际调用的库函数，权重作为普通属性读取；两边用的内核相同",
     "unfused and fused graphs alike are timed lean (explorer.runtime.lean): ATen calls through their public "
     "bindings, fused calls resolved once to the library call they take on this device, weights read as plain "
     "attributes; the same kernels either way"),
    (r"CPU run: numbers are CPU numbers, not GPU numbers", "CPU 运行：这些是 CPU 上的数字，不是 GPU 上的数字",
     "CPU run: numbers are CPU numbers, not GPU numbers"),
    (r"CUDA run", "CUDA 运行", "CUDA run"),
    # the staged table (runtime.stages; report.upgrade_v1)
    (r"the captured graph: (\d+) ops, nothing fused", "捕获到的计算图：{0} 个算子，没有任何融合",
     "the captured graph: 175 ops, nothing fused"),
    (r"(\d+) BatchNorm\(s\) folded into their convs \((\d+) → (\d+) batch_norm ops, (\d+) → (\d+) ops\); activations "
     r"and adds still separate ops",
     "{0} 个 BN 折叠进了各自的卷积（batch_norm 算子 {1} → {2}，算子 {3} → {4}）；激活和相加仍是单独的算子",
     "53 BatchNorm(s) folded into their convs (53 → 0 batch_norm ops, 175 → 122 ops); activations and adds still "
     "separate ops"),
    (r"(\d+) BatchNorm\(s\) folded into their convs \((\d+) → (\d+) batch_norm ops, (\d+) → (\d+) ops\); activations "
     r"and adds still separate ops; (\d+) RMSNorm γ folded into the linears that read them",
     "{0} 个 BN 折叠进了各自的卷积（batch_norm 算子 {1} → {2}，算子 {3} → {4}）；激活和相加仍是单独的算子；{5} 个 RMSNorm 的 γ "
     "折叠进了读取它们的线性层",
     "0 BatchNorm(s) folded into their convs (0 → 0 batch_norm ops, 700 → 690 ops); activations and adds still "
     "separate ops; 9 RMSNorm γ folded into the linears that read them"),
    (r"conv/GEMM epilogues fused: (\d+) fused call\(s\), (\d+) → (\d+) ops", "卷积/GEMM 尾处理已融合：{0} 次融合调用，算子 {1} → {2}",
     "conv/GEMM epilogues fused: 53 fused call(s), 122 → 57 ops"),
    (r"every accepted chain applied: (\d+) chain\(s\), (\d+) fused call\(s\), (\d+) → (\d+) ops",
     "每条已接受的链都已应用：{0} 条链，{1} 次融合调用，算子 {2} → {3}",
     "every accepted chain applied: 60 chain(s), 60 fused call(s), 175 → 50 ops"),
    (r"the same graph as '(?P<msg>.+)': no accepted chain is applied first at this stage",
     "与“{0}”的计算图相同：没有哪条已接受的链是在这一阶段才首次应用的",
     "the same graph as '+ epilogues (activation/add)': no accepted chain is applied first at this stage"),
    (r"original", "原始模型", "original"),
    (r"Conv\+BN folded", "Conv+BN 折叠", "Conv+BN folded"),
    (r"Conv\+BN fused", "Conv+BN 融合", "Conv+BN fused"),
    (r"\+ epilogues \(activation/add\)", "+ 尾处理（激活/残差相加）", "+ epilogues (activation/add)"),
    (r"all accepted", "全部接受的融合", "all accepted"),
    (r"version 1 did not record how this stage's graph differs", "版本 1 没有记录这一阶段的计算图有何不同",
     "version 1 did not record how this stage's graph differs"),
    (r"not timed in version 1: (?P<msg>.*)", "版本 1 中没有计时：{0}",
     "not timed in version 1: fuses the same 53 chain(s) as the previous stage"),
    (r"fuses the same (\d+) chain\(s\) as the previous stage", "融合的 {0} 条链与上一阶段相同",
     "fuses the same 53 chain(s) as the previous stage"),
    # verdicts (explorer.stats, runtime.chains, report.upgrade_v1)
    (r"(\d+) paired rounds: at least (\d+) are needed for a test", "{0} 轮配对测量：至少要 {1} 轮才能做检验",
     "3 paired rounds: at least 5 are needed for a test"),
    (r"95% CI inside ±(\S+)", "95% 置信区间在 ±{0} 以内", "95% CI inside ±3%"),
    (r"significant but under the (\S+) minimum effect", "差异显著，但小于 {0} 的最小效应",
     "significant but under the 3% minimum effect"),
    (r"not significant with (\d+) rounds \(enough for 80% power at (\S+)\)",
     "{0} 轮后仍不显著（这个轮数足以在 {1} 的效应上达到 80% 的检验功效）",
     "not significant with 40 rounds (enough for 80% power at 3%)"),
    (r"undecided: (\d+) rounds, (\d+) needed for 80% power at (\S+)",
     "无法判定：测了 {0} 轮，要在 {2} 的效应上达到 80% 的检验功效需要 {1} 轮",
     "undecided: 60 rounds, 400 needed for 80% power at 3%"),
    (r"Wilcoxon signed-rank test on paired log ratios \(two-sided\); 95% bootstrap CI of the median ratio; minimum "
     r"effect (\S+)",
     "对配对的对数比值做 Wilcoxon 符号秩检验（双侧）；中位数比值的 95% bootstrap 置信区间；最小效应 {0}",
     "Wilcoxon signed-rank test on paired log ratios (two-sided); 95% bootstrap CI of the median ratio; minimum "
     "effect 3%"),
    (r"version 1 rule: fused p20 above unfused p80 \(a spread rule, no statistical test\)",
     "版本 1 的规则：融合后的 p20 高于融合前的 p80（离散度规则，不是统计检验）",
     "version 1 rule: fused p20 above unfused p80 (a spread rule, no statistical test)"),
    (r"version 1 recorded no paired samples for the whole model", "版本 1 没有记录整个模型的配对样本",
     "version 1 recorded no paired samples for the whole model"),
    (r"per-chain timing not run", "没有做逐链计时", "per-chain timing not run"),
    (r"not fused: (?P<msg>.+)", "未融合：{0}", "not fused: refused"),
    (r"refused", "已拒绝", "refused"),
    (r"not applied", "未应用", "not applied"),
    (r"failed", "失败", "failed"),
    (r"the fused form runs the same ops on this device; not timed", "在这台设备上，融合后的形式运行的是同样的算子；不计时",
     "the fused form runs the same ops on this device; not timed"),
    (r"chain benchmark failed: (.*)", "链的基准测试失败：{0}", "chain benchmark failed: RuntimeError: x"),
    (r"chain benchmark failed", "链的基准测试失败", "chain benchmark failed"),
    (r"apply_plan did not report this chain", "apply_plan 没有报告这条链", "apply_plan did not report this chain"),
    # baselines (runtime.baselines)
    (r"this source has no eager nn\.Module \(ONNX or \.pt2\): not measured",
     "这个来源没有 eager 的 nn.Module（ONNX 或 .pt2）：未测量",
     "this source has no eager nn.Module (ONNX or .pt2): not measured"),
    (r"reduce-overhead is torch\.compile's CUDA-graph mode: not measured without CUDA",
     "reduce-overhead 是 torch.compile 的 CUDA graph 模式：没有 CUDA 时不测量",
     "reduce-overhead is torch.compile's CUDA-graph mode: not measured without CUDA"),
    (r"torch\.compile \((\S+)\) failed: (.*)", "torch.compile（{0}）失败：{1}", "torch.compile (default) failed: "
     "InductorError: x"),
    (r"not a CUDA-graph measurement: (?P<msg>.*)", "不是 CUDA graph 测量：{0}",
     "not a CUDA-graph measurement: CUDA graph capture failed, plain calls instead: x"),
    (r"its partner '(\S+)' was not measured as named", "与它配对的“{0}”没有按名称所说的方式测量",
     "its partner 'fused_cuda_graphs' was not measured as named"),
    (r"failed while timed, dropped: (.*)", "计时时失败，已去掉：{0}", "failed while timed, dropped: RuntimeError: x"),
    (r"precision not measured: (.*)", "未测量精度：{0}", "precision not measured: RuntimeError: x"),
    # phases that failed (runtime.session, gpu_runner: report.failures)
    (r"not timed: the main phase failed \(the report's failures say why\)", "未计时：主阶段失败（原因见报告的失败列表）",
     "not timed: the main phase failed (the report's failures say why)"),
    (r"not timed", "未计时", "not timed"),
    (r"not run: phase '(\S+)' left this process's CUDA context unusable",
     "未运行：阶段“{0}”使本进程的 CUDA 上下文无法再用", "not run: phase 'chains' left this process's CUDA context unusable"),
    (r"not run: the fresh process failed to set up \((?P<msg>.*)\)", "未运行：新的测量进程未能完成准备（{0}）",
     "not run: the fresh process failed to set up (measurement failed: RuntimeError: x)"),
    (r"failure injected by (\S+)", "由 {0} 注入的失败", "failure injected by FUSION_EXPLORER_FAIL_PHASE=main"),
    (r"baselines' precision not measured: the float64 reference failed \((.*)\)",
     "未测量基线的精度：float64 参考计算失败（{0}）",
     "baselines' precision not measured: the float64 reference failed (RuntimeError: x)"),
    # the model's own casts (runtime.measure.record_casts)
    (r"the model's own casts kept in (\w+): (\d+) dtype argument\(s\) as the model gives them at \w+, (\d+) of them "
     r"wider than \w+ \(its float32 islands\)",
     "保留模型自身在 {0} 下的类型转换：{1} 个 dtype 参数与模型在 {0} 下一致，其中 {2} 个比 {0} 更宽（模型的 float32 区段）",
     "the model's own casts kept in bfloat16: 22 dtype argument(s) as the model gives them at bfloat16, 11 of them "
     "wider than bfloat16 (its float32 islands)"),
    (r"the model could not be captured in (\w+) to read its own casts \((.*)\): the unfused graph computes every "
     r"float32 op in \w+",
     "无法在 {0} 下捕获模型以读取它自身的类型转换（{1}）：未融合图的每个 float32 运算都以 {0} 计算",
     "the model could not be captured in bfloat16 to read its own casts (RuntimeError: x): the unfused graph computes "
     "every float32 op in bfloat16"),
    (r"the model's capture in (\w+) differs from its float32 capture: its own casts could not be matched, and the "
     r"unfused graph computes every float32 op in \w+",
     "模型在 {0} 下的捕获与 float32 下的不同：无法对应它自身的类型转换，未融合图的每个 float32 运算都以 {0} 计算",
     "the model's capture in float16 differs from its float32 capture: its own casts could not be matched, and the "
     "unfused graph computes every float32 op in float16"),
    (r"no eager module for this source: its graph's (\S+) ops run in (\w+), its other floating dtypes as captured",
     "这个来源没有 eager 模块：图中 {0} 的运算以 {1} 运行，其他浮点类型保持捕获时的样子",
     "no eager module for this source: its graph's torch.float32 ops run in bf16, its other floating dtypes as "
     "captured"),
]

RULES: list[tuple[str, str]] = [(rx, zh) for rx, zh, _ in EXAMPLES]
