"""``python -m dispatch._kube``: the operator (same as the ``dispatch-operator`` console script)."""

from __future__ import annotations

from .main import main

if __name__ == "__main__":
    raise SystemExit(main())
