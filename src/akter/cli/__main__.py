"""``python -m akter.cli``: the ``akter`` command line."""

from akter.cli import main

main()
