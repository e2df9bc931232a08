"""The end-to-end tier: the Helm chart installed into a real API server (see conftest.py)."""
