"""The reliability campaign (see conftest.py)."""
