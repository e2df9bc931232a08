"""The ``kubectl-dispatch`` script: the plugin (:mod:`dispatch._cli.main`), or, where the ``cli``
extra is not installed, a message that says which extra to install instead of a traceback."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from .main import main as plugin
    except ImportError as error:
        missing = error.name or str(error)
        print(
            f"kubectl-dispatch needs the 'cli' extra (missing: {missing}): pip install 'dispatch-jobs[cli]'",
            file=sys.stderr,
        )
        return 2
    return plugin()


if __name__ == "__main__":
    raise SystemExit(main())
