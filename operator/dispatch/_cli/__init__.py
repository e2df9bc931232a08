"""The kubectl plugin ``kubectl-dispatch`` (see :mod:`dispatch._cli.main`)."""
