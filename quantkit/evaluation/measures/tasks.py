"""Task measures: the baseline's score minus the candidate's on multiple choice, number
extraction and code (a positive drop is a loss)."""
from __future__ import annotations

from quantkit.evaluation.backends.base import ScoredSlice
from quantkit.evaluation.measures.base import measure


@measure(name="mc_accuracy_drop", higher_is_better=False, review=0.05, nogo=0.15,
         applies=lambda s: s.choices is not None,
         evidence="W8A16 0, FP8_DYNAMIC 0, W4 RTN -0.04: 48 questions, one question = 0.021",
         table=("mc_accuracy_base", "mc_accuracy_cand"), table_rank=8)
def mc_accuracy_drop(s: ScoredSlice) -> float:
    from quantkit.evaluation.task_metrics import mc_summary   # here: the registry is read without loading the models' code

    c = s.choices
    summary = mc_summary(c.items, c.base, c.cand)
    return summary["mc_accuracy_base"] - summary["mc_accuracy_cand"]


def extract_f1_drops(s: ScoredSlice) -> list[float]:
    """Each prompt's F1 drop (baseline minus candidate): 12 prompts, so the drop gates on its interval."""
    return [b["f1"] - c["f1"] for b, c in zip(s.extraction.base, s.extraction.cand)]


@measure(name="extract_f1_drop", higher_is_better=False, review=0.05, nogo=0.15,
         applies=lambda s: s.extraction is not None,
         evidence="W8A16 -0.01, FP8_DYNAMIC -0.08, W4 RTN 0.065 (numbers-en: REVIEW)",
         table=("extract_f1_base", "extract_f1_cand"), table_rank=9, per_prompt=extract_f1_drops)
def extract_f1_drop(s: ScoredSlice) -> float:
    fb, fc = s.extraction.means("f1")
    return fb - fc


@measure(name="code_pass_drop", higher_is_better=False, review=0.07, nogo=0.20,
         applies=lambda s: s.code is not None,
         evidence="W8A16 0, FP8_DYNAMIC 0, W4 RTN 0: 12 problems, one lost (0.083) is REVIEW "
                  "(SmolLM2 passes none: no evidence)",
         table=("code_pass_base", "code_pass_cand"), table_rank=10)
def code_pass_drop(s: ScoredSlice) -> float:
    pb, pc = s.code.means("passed")
    return pb - pc
