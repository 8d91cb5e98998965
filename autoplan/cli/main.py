"""Entry point: builds the typer app from the command modules and maps errors to exit codes.

Exit codes: 0 ok, 1 no feasible plan, 2 bad input (one line on stderr, no traceback), 3 probe failure."""
from __future__ import annotations

import importlib
import sys

import typer

from autoplan.errors import InputError, ProbeFailure

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Find the fastest parallel training strategy that fits in memory.")

# Command modules; each defines `register(app)`.
COMMAND_MODULES = (
    "autoplan.cli.catalog",
    "autoplan.cli.estimate",
    "autoplan.cli.plan",
    "autoplan.cli.profile",
    "autoplan.cli.emit",
    "autoplan.cli.probe",
    "autoplan.cli.tune",
    "autoplan.cli.calibrate",
)


def _version(value: bool) -> None:
    if value:
        from autoplan import __version__

        print(f"autoplan {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Find the fastest parallel training strategy that fits in memory."""


def build_app() -> typer.Typer:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)
    return app


def main(argv=None) -> None:
    build_app()
    try:
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except InputError as e:
        print(f"autoplan: error: {e}", file=sys.stderr)
        sys.exit(InputError.exit_code)
    except ProbeFailure as e:
        print(f"autoplan: probe failed: {e}", file=sys.stderr)
        sys.exit(ProbeFailure.exit_code)
    except SystemExit:
        raise
    except Exception as e:  # click usage errors arrive here in non-standalone mode
        sys.exit(_usage_exit_code(e))


def _click_modules():
    """The click exception modules in use: click itself and typer's vendored copy (typer >= 0.2x)."""
    modules = []
    for name in ("click.exceptions", "typer._click.exceptions"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    return modules


def _usage_exit_code(e: Exception) -> int:
    """Exit code for a click/typer exception (2 usage, 130 abort); anything else is re-raised."""
    modules = _click_modules()
    exits = (typer.Exit,) + tuple(getattr(m, "Exit") for m in modules if hasattr(m, "Exit"))
    if isinstance(e, exits):
        return e.exit_code
    usage = tuple(m.ClickException for m in modules)
    if usage and isinstance(e, usage):
        message = e.format_message()
        if message:  # no_args_is_help raises a usage error with no message after printing the help
            print(f"autoplan: error: {message}", file=sys.stderr)
        return 2
    aborts = (typer.Abort,) + tuple(getattr(m, "Abort") for m in modules if hasattr(m, "Abort"))
    if isinstance(e, aborts):
        return 130
    raise e

if __name__ == "__main__":
    main()
