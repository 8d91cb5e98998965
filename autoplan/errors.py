"""Errors. `InputError` is bad input (exit code 2, one line); `Infeasible` is a legal but unrunnable point
that searches count and skip (it is not an error for the user)."""


class InputError(ValueError):
    """Bad user input. The message is one line: the rule, the value(s), and the fix."""

    exit_code = 2


class Infeasible(Exception):
    """A strategy that is legal to write down but cannot run (e.g. does not fit in memory)."""


class ProbeFailure(RuntimeError):
    """A probe run failed in a way the caller asked to treat as fatal (exit code 3)."""

    exit_code = 3


def did_you_mean(name: str, choices) -> str:
    """A ' did you mean X?' suffix for an unknown name, or '' when nothing is close."""
    import difflib

    close = difflib.get_close_matches(name.lower(), [c.lower() for c in choices], n=1, cutoff=0.5)
    if not close:
        return ""
    original = {c.lower(): c for c in choices}[close[0]]
    return f"; did you mean {original!r}?"
