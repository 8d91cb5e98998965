"""Entry point: builds the typer app from the command modules and maps errors to exit codes.

Exit codes: 0 ok, 1 no feasible plan, 2 bad input (one line on stderr, no traceback), 3 probe failure, 130
interrupted (SIGINT or SIGTERM: both unwind through the commands' cleanup, which ends every process a probe
started and records a running tune trial as failed)."""
from __future__ import annotations

import importlib
import os
import signal
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
    "autoplan.cli.report",
    "autoplan.cli.calibrate",
    "autoplan.cli.rl",
    "autoplan.cli.vlm",
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


INTERRUPTED = 130
INTERRUPTED_MESSAGE = "autoplan: interrupted; every process it started was stopped"


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _interrupted_while_loading(signum, frame) -> None:
    """SIGINT/SIGTERM while the command modules load: nothing has been written or started yet."""
    os.write(2, b"autoplan: interrupted while starting; nothing was done\n")
    os._exit(INTERRUPTED)


def main(argv=None) -> None:
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, _interrupted_while_loading)
    try:
        build_app()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _interrupt)  # as SIGINT: unwind, so that cleanup runs
    try:
        _run(argv)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(argv) -> None:
    try:
        code = app(args=argv, standalone_mode=False)
        if code == INTERRUPTED:  # typer turns KeyboardInterrupt (SIGINT, and SIGTERM here) into Exit(130)
            print(INTERRUPTED_MESSAGE, file=sys.stderr)
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
        print(INTERRUPTED_MESSAGE, file=sys.stderr)
        return INTERRUPTED
    raise e

if __name__ == "__main__":
    main()
