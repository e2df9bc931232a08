"""Root pytest configuration: the fixture plugins of the real components, for tests/ and e2e/."""

pytest_plugins = [
    "tests.support.kube",
    "tests.support.kueue",
    "tests.support.slurm",
    "tests.support.recorded",
]
