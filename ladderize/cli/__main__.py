"""``python -m ladderize.cli``: the console script."""

from . import main

main()
