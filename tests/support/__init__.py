"""Helpers shared by the tests (no tests here). pyproject.toml puts tests/ (and bench/, for its event
generators) on pytest's `pythonpath`, so tests import them as `support.<module>`."""
