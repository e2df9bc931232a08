"""Shared pytest configuration: the fixture plugins of the real components."""

pytest_plugins: list[str] = []
