"""User-facing errors.

A ``QuantkitError`` carries one line that names the file or key at fault. The CLI prints it
to stderr and exits with code 2; the Python API lets it propagate.
"""


class QuantkitError(Exception):
    """A problem with the user's input (file, recipe key, model), reported in one line."""
