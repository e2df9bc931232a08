"""``python -m dispatch._controller``: the operator (the ``dispatch-operator`` script starts here too).

kubernetes_asyncio is blocked before kopf is imported: nothing in the operator uses it (its client
is dispatch._kubeclient's), but kopf imports it when installed, only for isinstance checks of its
models (kopf._cogs.helpers.thirdparty, which falls back on ImportError), and the import alone is
about 35 MiB of RSS (a thousand generated model modules).
"""

from __future__ import annotations

import sys

sys.modules.setdefault("kubernetes_asyncio", None)  # type: ignore[arg-type]


def main() -> int:
    """The operator, or, where the ``operator`` extra is not installed, a message that says which
    extra to install instead of a traceback."""
    try:
        from .main import main as operator
    except ImportError as error:
        missing = error.name or str(error)
        print(
            f"dispatch-operator needs the 'operator' extra (missing: {missing}): "
            "pip install 'dispatch-jobs[operator]'",
            file=sys.stderr,
        )
        return 2
    return operator()


if __name__ == "__main__":
    raise SystemExit(main())
