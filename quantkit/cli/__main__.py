"""``python -m quantkit.cli``: the command line."""

from quantkit.cli import main

main()
