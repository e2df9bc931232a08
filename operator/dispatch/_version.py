"""The version, in one place: pyproject.toml reads it from here (``dynamic = ["version"]``)."""

__version__ = "0.1.0"
