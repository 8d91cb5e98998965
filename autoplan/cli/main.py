"""Entry point: builds the typer app from the command modules and maps errors to exit codes.

Exit codes: 0 ok, 1 no feasible plan, 2 bad input (one line on stderr, no traceback), 3 probe failure."""
from __future__ import annotations

import importlib
import sys

import typer

from autoplan.errors import InputError, ProbeFailure

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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
)


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
        import click

        try:  # typer >= 0.2x raises usage errors from its own vendored copy of click
            from typer._click.exceptions import ClickException as VendoredClickException
        except ImportError:
            VendoredClickException = click.ClickException
        if isinstance(e, (click.exceptions.Exit, typer.Exit)):
            sys.exit(e.exit_code)
        if isinstance(e, (click.ClickException, VendoredClickException)):
            message = e.format_message()
            if message:  # no_args_is_help raises a usage error with no message after printing the help
                print(f"autoplan: error: {message}", file=sys.stderr)
            sys.exit(2)
        if isinstance(e, (click.exceptions.Abort, typer.Abort)):
            sys.exit(130)
        raise


if __name__ == "__main__":
    main()
