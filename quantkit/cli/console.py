"""What every command face shares: the one-line error and exit 2, sizes in words, the layer bar."""

from __future__ import annotations

import sys

import typer


def fail(msg: str, code: int = 2) -> None:
    """A failure the user can fix: one ``error:`` line on stderr, exit ``code`` (2 by default)."""
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=code)


def human(n: float) -> str:
    """Bytes in words: ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def say(line: str) -> None:
    """A log line: on stderr, so stdout holds only what a command answers."""
    typer.echo(line, err=True)


def layer_progress(iterable, total):
    """The layer loop's progress bar, on stderr."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc="quantizing layers", unit="layer", file=sys.stderr)
