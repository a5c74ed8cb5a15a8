"""The evaluation report's words in English and Chinese (``quantkit.common.i18n``).

Measure names (kl_mean, top1_agreement), slice names, levels (GO, REVIEW, NO-GO) and JSON keys
stay as they are in every language: they are the symbols report.json, recipes and thresholds use.
The Chinese is written for engineers who read such reports, in the terms of the glossary the
Chinese guides use too (docs/zh/glossary.md; tests/repository/test_glossary_zh.py holds every message to it):
结论 (decision), 原因 (reasons), 切片 (slice), 级别 (level), 限值 (limit), 余量 (margin); token,
checkpoint and bootstrap as they are. The evaluation's own English sentences (warnings, notes) are
reworded by ``said``; a sentence it does not know is shown as written.
"""
from __future__ import annotations

import re

from quantkit.common.i18n import Catalog, reworded

WORDS = Catalog({
    # headings
    "title": ("quantkit evaluation", "quantkit 评估结论"),
    "colon": (": ", "："),
    "list_sep": ("; ", "；"),
    "aside": (" ({x})", "（{x}）"),
    "reasons": ("Reasons", "原因"),
    "no_reasons": ("Every gated figure is within its limit.", "所有参与判定的指标都在限值之内。"),
    "more_reasons": ("; {n} more below", "；另有 {n} 项见下方"),
    "other_reasons": ("The other {n} reasons", "其余 {n} 项原因"),
    "closest": ("Closest to its limit: {line}", "离限值最近的一项：{line}"),
    "gating": ("Gating figures: value, limit, margin", "判定指标：数值、限值与余量"),
    "gating_note": ("Each gated slice's tightest figure: the one closest to its limit, or furthest past it, "
                    "relative to the limit. Margin: how far the figure is inside its limit (negative: past it).",
                    "每个参与判定的切片列出最紧的一项：相对限值而言离限值最近、或越过限值最多的指标。"
                    "余量：指标距离限值还有多远（负数表示已越过限值）。"),
    "gating_all": ("All {n} gating figures", "全部 {n} 项判定指标"),
    "warnings": ("Warnings", "警告"),
    "within_noise": ("Within noise of a limit (information only)", "处于限值的噪声范围内（仅供参考）"),
    "within_noise_note": ("With other rows of the same traffic, or other prompts, these levels could differ (bootstrap "
                          "over rows; over prompts for greedy agreement and extraction). A measure over a few prompts "
                          "counts only when its whole interval is past a limit, so those marked \"not counted\" did "
                          "not change the decision:",
                          "换用同一业务流量的其他行或其他提示，这些级别可能不同（按行 bootstrap；贪心一致率和数字抽取按提示 bootstrap）。"
                          "基于少量提示的指标只有整个区间都越过限值时才计入，标为“不计入”的项未改变结论："),
    "informational": ("Not gated (information only)", "不参与判定（仅供参考）"),
    "slices": ("Slices", "切片"),
    "group_perplexity": ("Perplexity", "困惑度"),
    "group_tasks": ("Task scores", "任务得分"),
    "group_path": ("The engine's path", "引擎路径"),
    "group_other": ("Other measures", "其他指标"),
    "business": ("Business rows", "业务数据"),
    "lm_eval": ("lm-eval tasks", "lm-eval 任务"),
    "positions": ("KL by position", "按位置的 KL"),
    "positions_of": ("KL by position: {name}", "按位置的 KL：{name}"),
    "modules": ("Per-module quantization error", "逐模块量化误差"),
    "integrity": ("Checkpoint integrity", "checkpoint 完整性"),
    "mixed": ("Mixed-precision plan", "混合精度方案"),
    "engine": ("Served by the engine", "在推理引擎中的评估"),
    "footprint": ("Deployment footprint", "部署资源占用"),
    "worst": ("Worst examples of the slices that are not GO", "非 GO 切片中最差的样本"),
    "thresholds": ("Thresholds", "阈值"),
    "details": ("Details", "详情"),
    # table labels
    "th_slice": ("slice", "切片"),
    "th_language": ("language", "语言"),
    "th_verdict": ("verdict", "结论"),
    "th_gates": ("gates", "参与判定"),
    "th_measure": ("measure", "指标"),
    "th_value": ("value", "数值"),
    "th_limit": ("limit", "限值"),
    "th_margin": ("margin", "余量"),
    "th_level": ("level", "级别"),
    "th_task": ("task", "任务"),
    "th_metric": ("metric", "指标"),
    "th_baseline": ("baseline", "基线"),
    "th_candidate": ("candidate", "候选"),
    "th_drop": ("drop", "下降"),
    "th_start": ("start", "起始位置"),
    "th_end": ("end", "结束位置"),
    "th_positions": ("positions", "位置"),
    "th_tokens": ("tokens", "token 数"),
    "th_variant": ("variant", "变体"),
    "th_would_be": ("would-be level", "本应得到的级别"),
    "th_unit": ("unit", "单元"),
    "th_format": ("format", "格式"),
    "th_predicted_kl": ("predicted KL", "预测 KL"),
    "th_setting": ("setting", "设置"),
    "th_quantity": ("quantity", "项目"),
    "th_review_past": ("REVIEW past", "REVIEW 限值"),
    "th_nogo_past": ("NO-GO past", "NO-GO 限值"),
    "th_better": ("better", "方向"),
    "higher": ("higher", "越高越好"),
    "lower": ("lower", "越低越好"),
    "th_module": ("module or tensor", "模块或张量"),
    "th_finding": ("finding", "发现"),
    "th_layer": ("layer", "层"),
    "business_kl": ("kl_mean [95% interval over rows]", "kl_mean [按行的 95% 区间]"),
    "rows": ("rows", "行数"),
    "in_calibration": ("in_calibration", "在校准集中"),
    "repeats": ("repeats", "重复"),
    "evaluated": ("evaluated", "已评估"),
    "without_reply": ("without_reply", "无回复"),
    "stop": ("stop", "停止条件"),
    "evidence": ("evidence", "证据"),
    "scored_tokens": ("scored_tokens", "计分 token"),
    # a worst example's keys (the others are measure names: kl_mean, f1_base)
    "ex_prompt": ("prompt", "提示"), "ex_baseline": ("baseline", "基线"), "ex_candidate": ("candidate", "候选"),
    "ex_context": ("context", "上下文"), "ex_position": ("position", "位置"), "ex_agreement": ("agreement", "一致率"),
    "yes": ("yes", "是"),
    "no": ("no", "否"),
    "not_gated": ("not gated", "不参与判定"),
    "not_gated_why": ("not gated ({source}: {langs})", "不参与判定（{source} 只列出 {langs}）"),
    # sentences and their parts
    "summary": ("Baseline {baseline}, candidate {candidate}, max length {max_len}{source}, {seconds} s.",
                "基线 {baseline}，候选 {candidate}，最大长度 {max_len}{source}，用时 {seconds} 秒。"),
    "summary_html": ("Baseline {baseline}, candidate {candidate}, max length {max_len}{source}.",
                     "基线 {baseline}，候选 {candidate}，最大长度 {max_len}{source}。"),
    "margin": ("margin {m}", "余量 {m}"),
    "over_by": ("over by {m}", "越过限值 {m}"),
    "gating_all_slices": ("Every slice gates the decision (no language restriction).",
                          "所有切片都参与判定（未限定语言）。"),
    "gating_languages": ("Languages that gate the decision: {langs} (from {source}). Slices in other languages are "
                         "measured and shown with their would-be level but do not change the decision; business "
                         "slices and lm-eval tasks always gate.",
                         "参与判定的语言：{langs}（依据{source}）。其他语言的切片照常测量并给出本应得到的级别，但不改变结论；"
                         "业务切片和 lm-eval 任务始终参与判定。"),
    "source_card": ("the baseline's model card, README.md", "基线的模型卡 README.md"),
    "source_recipe": ("the recipe's eval.languages", "配方的 eval.languages"),
    "source_flag": ("--languages", "命令行参数 --languages"),
    "len_model": ("the model's max_position_embeddings", "模型的 max_position_embeddings"),
    "len_baseline": ("the baseline's max_position_embeddings", "基线的 max_position_embeddings"),
    "len_recipe": ("the recipe's eval.max_len", "配方的 eval.max_len"),
    "len_flag": ("--max-len", "命令行参数 --max-len"),
    "len_given": ("given", "由调用方指定"),
    "len_default": ("the default, {n}: the model's config gives no max_position_embeddings",
                    "默认值 {n}：模型配置中没有 max_position_embeddings"),
    "noise": ("{slice}: {measure} {value} (95% interval over rows {lo}-{hi}) holds its {level} limit {limit}: "
              "within noise",
              "{slice}：{measure} {value}（按行的 95% 区间 {lo}-{hi}）包含其 {level} 限值 {limit}，处于噪声范围内"),
    "interval_prompts": (" (95% interval over prompts {lo}-{hi})", "（按提示的 95% 区间 {lo}-{hi}）"),
    "noise_prompts": ("{slice}: {measure} {value} (95% interval over prompts {lo}-{hi}) holds its {level} limit "
                      "{limit}: within noise, not counted",
                      "{slice}：{measure} {value}（按提示的 95% 区间 {lo}-{hi}）包含其 {level} 限值 {limit}，"
                      "处于噪声范围内，不计入"),
    "variants_note": ("Variants of the candidate on the same windows (information: they do not change the decision):",
                      "在相同窗口上评估的候选变体（仅供参考，不改变结论）："),
    "candidate_kv": ("candidate (kv {option})", "候选（kv {option}）"),
    "not_gated_label": ("{name} (not gated)", "{name}（不参与判定）"),
    "fallback": ("Checked from the checkpoint alone (layout, finite positive scales, codes on the grid; "
                 "no reference to compare with):",
                 "仅依据 checkpoint 本身检查（布局、有限且为正的缩放因子、码值落在网格上；没有可比较的参考）："),
    "excess_clean": ("No part's error exceeds what its scheme and the quantizer's record allow: the closest is "
                     "layer {layer}, {kind}, at {db} dB (a part past 0 dB is flagged).",
                     "没有任何部分的误差超出其量化方案与量化器记录所允许的范围：最接近的是第 {layer} 层的 {kind}，{db} dB"
                     "（超过 0 dB 即标记）。"),
    "excess_same": ("No part's error exceeds what its scheme and the quantizer's record allow: every part is at "
                    "{db} dB (a part past 0 dB is flagged).",
                    "没有任何部分的误差超出其量化方案与量化器记录所允许的范围：每个部分都在 {db} dB（超过 0 dB 即标记）。"),
    "excess_found": ("Excess over expected error, dB, in the {n} layers where a part is past it (> 0 is flagged; "
                     "worst: layer {layer}, {kind}, {db} dB):",
                     "误差超出预期的幅度（dB），仅列出有部分超出的 {n} 层（超过 0 即标记；最差：第 {layer} 层的 {kind}，{db} dB）："),
    "footprint_assumed": ("An assumption: priced for a GPU of {gib} GiB, since none was named (--gpu-mem); the "
                          "evaluation's own device says nothing about the one the model is served on. Pass --gpu-mem "
                          "for yours.",
                          "以下为假设值：未指定 GPU（--gpu-mem），按 {gib} GiB 显存的 GPU 估算；评估所用的设备不代表部署时的"
                          " GPU。请用 --gpu-mem 指定实际的 GPU。"),
    "footprint_named": ("Priced for a GPU of {gib} GiB (--gpu-mem).", "按 {gib} GiB 显存的 GPU 估算（--gpu-mem）。"),
    "note": ("note", "注"),
    "none": ("none", "无"),
    "nothing": ("nothing", "无"),
    "integrity_text": ("{n} quantized modules decoded from the candidate's files (the tensors that serve) and compared "
                       "with the baseline's weights{how}; every other tensor compared with the baseline; {s} s. "
                       "{flagged} flagged.",
                       "从候选的文件中解码出 {n} 个量化模块（即推理时实际使用的张量），与基线的权重比较{how}；"
                       "其余张量也都与基线比较；用时 {s} 秒。标记 {flagged} 项。"),
    "integrity_how": (", the recorded transforms re-applied on {k} layers", "，并在 {k} 层上重新应用了记录的变换"),
    "business_checked": ("rows whose content is in the calibration sample ({manifest}{other}) are left out "
                         "(in_calibration)", "内容出现在校准样本（{manifest}{other}）中的行已剔除（在校准集中）"),
    "business_other_log": (", drawn from another log", "，来自另一份日志"),
    "business_unchecked": ("not checked against a calibration sample (--calib-sample)",
                           "未与校准样本核对（--calib-sample）"),
    "business_head": ("Business rows from {log}: {said}; repeats of a row already taken are left out; chat rows "
                      "score their assistant turns only (without_reply: rows with none, their turns scored).",
                      "业务数据来自 {log}：{said}；已取过的行的重复项已剔除；对话行只对助手回复计分"
                      "（无回复：没有助手回复的行，对其全部轮次计分）。"),
    "engine_note": ("Both models were scored inside the serving engine. KL {kl}. Path agreement: the candidate's "
                    "figures in the engine beside quantkit's own path on up to {tokens} tokens a slice. Not measured "
                    "in the engine: {missing}.",
                    "两个模型都在推理引擎中计分。KL：{kl}。路径一致率：候选在引擎中的指标与 quantkit 自身路径的指标并列，"
                    "每个切片最多 {tokens} 个 token。引擎中未测量：{missing}。"),
    "mixed_text": ("{bits} bits per planned weight (budget: {budget}), predicted KL {kl} nats per token ({method} "
                   "score){measured}; {shares}.",
                   "按方案每个权重 {bits} 位（预算：{budget}），预测 KL 为每 token {kl} nats（{method} 评分）{measured}；"
                   "{shares}。"),
    "mixed_measured": ("; measured mean KL over the gated slices {kl}", "；参与判定切片上实测的平均 KL 为 {kl}"),
    "mixed_units": ("{fmt} {n} units", "{fmt} {n} 个单元"),
    "no_cjk_font": ("", "未找到中文字体，图中标注为英文（scripts/setup-browser.sh 会安装 fonts-wqy-zenhei）。"),
    # the evaluation's own sentences (warnings, long-context notes), reworded by ``said``
    "said_untested_positions": ("{name}: its longest text holds {n} tokens: positions {first}-{last} of the deployment "
                                "length {length} ({source}) are not measured (a KV-cache error growing with position "
                                "would not show there); add longer texts",
                                "{name}：最长的文本只有 {n} 个 token，部署长度 {length}（{source}）中第 {first}-{last} 个位置"
                                "未被测量（随位置增长的 KV cache 误差在那里看不到）；请加入更长的文本"),
    "said_short_windows": ("Long slices ran windows of {window} tokens, not the deployment length {length}: one window "
                           "of {length} needs about {need} GiB, {free} GiB free.",
                           "长切片的窗口为 {window} 个 token，而非部署长度 {length}：一个 {length} 的窗口约需 {need} GiB，"
                           "可用 {free} GiB。"),
    "said_engine_windows": ("Windows held {window} tokens, not the deployment length {length}: the engine takes a prompt "
                            "only when it and one output token fit its max_model_len.",
                            "窗口为 {window} 个 token，而非部署长度 {length}：提示连同一个输出 token 都放得进引擎的 "
                            "max_model_len 时，引擎才接受它。"),
    "said_measured_to": ("{name}: {texts} text(s) of {lengths} tokens, measured to a context of {deepest} tokens "
                         "(deployment length {length}, {source}){cut}.",
                         "{name}：{texts} 段文本，分别有 {lengths} 个 token，测量到 {deepest} 个 token 的上下文"
                         "（部署长度 {length}，{source}）{cut}。"),
    "said_cut": ("; {cut} text(s) longer than the window were cut at {window} tokens ({left} tokens left out)",
                 "；{cut} 段长于窗口的文本在第 {window} 个 token 处截断（{left} 个 token 未计入）"),
    "said_fallback": ("kernel backend: {name} has no kernel for {fmt}; the slower torch reference runs it",
                      "内核后端：{name} 没有 {fmt} 格式的内核，改由较慢的 torch 参考实现运行"),
    "said_unchecked_business": ("business slices not checked against the calibration sample (--calib-sample): rows "
                                "the candidate was calibrated on may be among them",
                                "业务切片未与校准样本核对（--calib-sample）：其中可能有候选校准时用过的行"),
    "said_nothing_measured": ("nothing was measured on a slice that gates the verdict: REVIEW, not GO",
                              "参与判定的切片上没有测到任何指标：结论为 REVIEW，而非 GO"),
    "said_code_skipped": ("code items skipped, not measured: {which}: no sandbox for generated code ({why}); "
                          "--unsafe-code-exec runs them without one",
                          "代码题已跳过、未测量：{which}：没有运行生成代码的沙箱（{why}）；--unsafe-code-exec 可在没有沙箱的"
                          "情况下运行它们"),
    "said_no_plan": ("mixed-precision plan not shown: {why}", "未显示混合精度方案：{why}"),
    # plot labels
    "plot_kl": ("mean KL(baseline || candidate) per token, nats", "每 token 平均 KL(基线 || 候选)，nats"),
    "plot_top1": ("top-1 agreement", "top-1 与基线的一致率"),
    "plot_context": ("context length (bucket end, tokens)", "上下文长度（分桶终点，token）"),
    "plot_mean_kl": ("mean KL, nats", "平均 KL，nats"),
    "plot_sqnr": ("SQNR, dB (lower = more error)", "SQNR，dB（越低误差越大）"),
    "plot_layers": ("per-layer quantization error: the layer's modules (as recorded by the algorithm)",
                    "逐层量化误差：每层各模块（量化算法记录的数值）"),
    "plot_median": ("median module", "模块中位数"),
    "plot_range": ("best to worst module", "最好到最差的模块"),
    "plot_worst": ("worst module", "最差模块"),
    "plot_modules": ("per-module quantization error (as recorded by the algorithm)", "逐模块量化误差（量化算法记录的数值）"),
    "plot_module_order": ("module, in layer order", "模块（按层顺序）"),
    "plot_sqnr_base": ("SQNR vs the baseline, dB", "相对基线的 SQNR，dB"),
    "plot_excess": ("worst part's excess over expected, dB (> 0: flagged)", "最差部分超出预期的幅度，dB（> 0 即标记）"),
    "alt_slices": ("per-slice measures", "各切片指标"),
    "alt_positions": ("KL by position", "按位置的 KL"),
    "alt_modules": ("per-module error", "逐模块误差"),
    "alt_integrity": ("integrity heat map", "完整性热力图"),
    "alt_mixed": ("size against KL", "大小与 KL 的关系"),
})

#: what a breach of a measure says, in Chinese, for the measures whose record carries a meaning
MEANING_ZH = {
    "the engine computes something other than the checkpoint describes": "引擎的计算与 checkpoint 描述的不一致",
}


def gating_source(source: object, words) -> str:
    """Where the gating languages came from, in the report's language."""
    known = {"model card": "source_card", "eval.languages": "source_recipe", "--languages": "source_flag"}
    return words(known[source]) if source in known else str(source)


#: where the evaluated length came from (context.py, serving/deployment.py, evaluation/cli.py) -> its words
LENGTH_SOURCES = {"the model's max_position_embeddings": "len_model",
                  "the baseline's max_position_embeddings": "len_baseline", "eval.max_len": "len_recipe",
                  "--max-len": "len_flag", "given": "len_given"}


def length_source(source: str, words) -> str:
    """Where the evaluated length came from, in the report's language (an unknown source as it is)."""
    if source in LENGTH_SOURCES:
        return words(LENGTH_SOURCES[source])
    default = re.match(r"default \((\d+):", source)
    return words("len_default", n=default.group(1)) if default else source


_NUMBER = r"\d[\d.]*"
#: the sentences the evaluation writes (context.py's long-context notes, kernels/' fallbacks, api.py's
#: warnings), as report.json keeps them in English -> their message id; one not here is shown as it is
SENTENCES = tuple((re.compile(pattern), key) for pattern, key in (
    (r"(?P<name>\S+): its longest text holds (?P<n>\d+) tokens: positions (?P<first>\d+)-(?P<last>\d+) of the "
     r"deployment length (?P<length>\d+) \((?P<source>.+)\) are not measured \(a KV-cache error growing with "
     r"position would not show there\); add longer texts", "said_untested_positions"),
    (rf"Long slices ran windows of (?P<window>\d+) tokens, not the deployment length (?P<length>\d+): one window of "
     rf"\d+ needs about (?P<need>{_NUMBER}) GiB, (?P<free>{_NUMBER}) GiB free\.", "said_short_windows"),
    (r"Windows held (?P<window>\d+) tokens, not the deployment length (?P<length>\d+): the engine takes a prompt only "
     r"when it and one output token fit its max_model_len\.", "said_engine_windows"),
    (r"(?P<name>\S+): (?P<texts>\d+) text\(s\) of (?P<lengths>[\d, ]+) tokens, measured to a context of "
     r"(?P<deepest>\d+) tokens \(deployment length (?P<length>\d+), (?P<source>.+?)\)(?P<cut>; .+)?\.",
     "said_measured_to"),
    (r"; (?P<cut>\d+) text\(s\) longer than the window were cut at (?P<window>\d+) tokens \((?P<left>\d+) tokens "
     r"left out\)", "said_cut"),
    (r"kernel backend: (?P<name>\S+) has no kernel for (?P<fmt>\S+); the slower torch reference runs it",
     "said_fallback"),
    (r"business slices not checked against the calibration sample \(--calib-sample\): rows the candidate was "
     r"calibrated on may be among them", "said_unchecked_business"),
    (r"nothing was measured on a slice that gates the verdict: REVIEW, not GO", "said_nothing_measured"),
    (r"code items skipped, not measured: (?P<which>.+): no sandbox for generated code \((?P<why>.*)\); "
     r"--unsafe-code-exec runs them without one", "said_code_skipped"),
    (r"mixed-precision plan not shown: (?P<why>.+)", "said_no_plan"),
))


def said(sentence: str, words) -> str:
    """One of the evaluation's own sentences in the report's language (``SENTENCES``); in English,
    the sentence as written."""
    if words("yes") == "yes":
        return sentence

    def fields(found: dict) -> dict:
        if found.get("source"):
            found["source"] = length_source(found["source"], words)
        if found.get("cut"):
            found["cut"] = said(found["cut"], words)
        return found
    return reworded(sentence, SENTENCES, words, fields)
