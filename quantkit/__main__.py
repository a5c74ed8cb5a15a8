"""``python -m quantkit``: the command line (torchrun's ``-m quantkit convert ...`` starts here)."""

from .cli import main

main()
