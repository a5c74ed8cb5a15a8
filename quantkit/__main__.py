"""``python -m quantkit``: the command line (torchrun's ``-m quantkit convert ...`` starts here)."""

from quantkit.cli import main

main()
