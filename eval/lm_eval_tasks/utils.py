"""Scoring for humaneval_local: run the completion against the problem's tests."""
from quantkit.evaluation.code_exec import humaneval_program, run_program


def process_results(doc, results):
    passed = run_program(humaneval_program(doc, results[0]), timeout_s=5.0).passed
    return {"pass_at_1": float(passed)}
