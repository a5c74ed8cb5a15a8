"""Scoring backends: what runs the two models for the measures (base.py: the contract)."""
from quantkit.evaluation.backends.base import CodeRequest, Continuation, PairedRuns, ScoredSlice, ScoringBackend

__all__ = ["CodeRequest", "Continuation", "PairedRuns", "ScoredSlice", "ScoringBackend"]
