"""The ``quantkit`` command line: one module per command, each a face that parses its flags,
calls one workflow function (quantkit.api has them all) and prints; user errors are one line and
exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

# imported, not guarded: an ImportError here is a bug or a missing dependency, and must say so
# rather than leave the commands out of the help ("No such command"); these modules load
# transformers only when a command runs
from quantkit.cli.calibrate_command import calibrate_command
from quantkit.cli.convert_command import convert
from quantkit.cli.eval_command import eval_command
from quantkit.cli.inspect_command import inspect
from quantkit.cli.loadtest_command import loadtest_command
from quantkit.cli.plan_command import plan_command
from quantkit.cli.sensitivity_command import sensitivity_command
from quantkit.common.disk_space import disk_full_error, is_disk_full
from quantkit.errors import QuantkitError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Post-training quantization for LLMs: convert, inspect, calibrate, evaluate.")
app.command()(convert)
app.command()(inspect)
app.command("sensitivity")(sensitivity_command)
app.command("calibrate")(calibrate_command)
app.command("eval")(eval_command)
app.command("plan")(plan_command)
app.command("loadtest")(loadtest_command)


def main() -> None:
    """The ``quantkit`` command: every failure the user can fix is one ``error:`` line and exit 2,
    a usage mistake (an unknown flag, a missing argument) included."""
    try:   # recent typer vendors click and exports no usage-error type of its own
        from typer._click.exceptions import NoArgsIsHelpError, UsageError
    except ImportError:
        from click.exceptions import NoArgsIsHelpError, UsageError

    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as e:
        typer.echo(e.ctx.get_help() if e.ctx is not None else e.format_message(), err=True)
        code = 2
    except UsageError as e:
        ctx = e.ctx
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        typer.echo(f"error: {e.format_message()}{hint}", err=True)
        code = 2
    except typer.Exit as e:
        code = e.exit_code
    except typer.Abort:
        typer.echo("interrupted", err=True)
        code = 130
    except QuantkitError as e:
        typer.echo(f"error: {e}", err=True)
        code = 2
    except OSError as e:
        if not is_disk_full(e):
            raise
        typer.echo(f"error: {disk_full_error(Path(e.filename or '.').parent)}", err=True)
        code = 2
    sys.exit(code if isinstance(code, int) else 0)
