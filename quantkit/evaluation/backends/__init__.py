"""Scoring backends: what runs the two models for the measures (base.py: the contract)."""
from .base import CodeRequest, Continuation, PairedRuns, ScoredSlice, ScoringBackend

__all__ = ["CodeRequest", "Continuation", "PairedRuns", "ScoredSlice", "ScoringBackend"]
