"""Deprecated import path (0.1.0): `from pipeline import convert` (pipeline/deprecated.py)."""
from pipeline.deprecated import moved

moved(__name__, "pipeline.jobs.convert")
