"""Read the command line a bash launch script builds, without running it.

Launch scripts (Megatron-LM's `examples/*/train_*.sh` and their descendants) assign variables and arrays
(`NUM_LAYERS=32`, `GPT_MODEL_ARGS=( ... )`, `ARGS+=( ... )`, `${VAR:-default}`, `$((A*B))`), branch on them
(`if [[ "$DTYPE" == "fp8" ]]; then ... fi`) and finally run `torchrun ... pretrain_gpt.py "${ARGS[@]}"`. This module
reads that subset of bash: assignments, `[`/`[[`/`test` conditions, `if`/`elif`/`else`, `case` on a value, and the
expansions above. Loops (with any `case` inside them) and function bodies are skipped, command substitutions
`$(...)` and sourced files stay unknown, and nothing is ever executed. The environment is taken as empty: an unset
variable is "" in a condition and its default in `${VAR:-default}`; a variable never assigned keeps its `$NAME` text
in a command so that the caller can name it."""
from __future__ import annotations

import fnmatch
import re
import shlex
from typing import Any, Dict, Iterator, List, Optional, Tuple

from autoplan.integrations.shell_expand import Expander, ShellScript, condition, matching

_ASSIGN = re.compile(r"^(?:(?:export|local|readonly|declare(?:\s+-\w+)*)\s+)?([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_IF = re.compile(r"^(if|elif)\s+(.*?)\s*(?:;\s*then)?\s*$", re.S)
_BLOCKS = {"while": "done", "for": "done", "until": "done", "case": "esac"}
_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
_FUNCTION = re.compile(r"^(?:function\s+\w+|\w+\s*\(\s*\))\s*\{?\s*$")


__all__ = ["ShellScript", "read_script", "command_words", "logical_lines", "split_statements"]


# ---------------------------------------------------------------------------------------------- logical lines
def _scan(line: str, state: Tuple[Optional[str], int]) -> Tuple[str, Tuple[Optional[str], int]]:
    """`line` without its comment, and the (open quote, open parenthesis depth) after it."""
    quote, depth = state
    out, i, n = [], 0, len(line)
    while i < n:
        ch = line[i]
        if quote == "'":
            quote = None if ch == "'" else quote
        elif ch == "\\" and i + 1 < n:
            out.append(line[i:i + 2])
            i += 2
            continue
        elif quote == '"':
            quote = None if ch == '"' else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t;(") and not line[i - 1:i + 1] == "$#":
            break
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        out.append(ch)
        i += 1
    return "".join(out), (quote, depth)


def logical_lines(text: str) -> List[str]:
    """Statements of a script: comments dropped, `\\` continuations joined, multi-line quotes and arrays kept
    whole; here-document bodies come back one line each."""
    lines, buf, state = [], [], (None, 0)
    raw = text.replace("\r\n", "\n").split("\n")
    i = 0
    while i < len(raw):
        part, state = _scan(raw[i], state)
        i += 1
        trailing = len(part) - len(part.rstrip("\\"))
        joined = trailing % 2 == 1 and state[0] != "'"  # an odd count: the last backslash escapes the newline
        buf.append(part[:-1] if joined else part)
        if joined or state != (None, 0):
            buf.append(" " if joined or state[0] is None else "\n")
            continue
        line = "".join(buf).strip()
        buf, state = [], (None, 0)
        if line:
            lines.append(line)
        heredoc = _HEREDOC.search(line)
        if heredoc:  # the body is data (expanded by bash when the delimiter is unquoted): one statement per line
            while i < len(raw) and raw[i].strip() != heredoc.group(1):
                lines.append(raw[i].strip())
                i += 1
            i += 1
    if buf:
        lines.append("".join(buf).strip())
    return [line for line in lines if line]


# ---------------------------------------------------------------------------------------------- statements
def _words(text: str) -> List[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _units(text: str) -> Iterator[Tuple[int, str, bool]]:
    """(index, unit, quoted) for each character of `text`, a backslash escape (outside single quotes) as one unit;
    quoted is True inside quotes, for the quote marks themselves and for escapes: only unquoted units separate."""
    quote, i = None, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "'" and i + 1 < len(text):
            yield i, text[i:i + 2], True
            i += 2
            continue
        if quote:
            quote = None if ch == quote else quote
            yield i, ch, True
        elif ch in "'\"":
            quote = ch
            yield i, ch, True
        else:
            yield i, ch, False
        i += 1


def _raw_words(text: str) -> List[str]:
    """Words split at unquoted blanks, quotes kept (each is expanded afterwards)."""
    words, current = [], []
    for _, unit, quoted in _units(text):
        if not quoted and unit in " \t\n":
            if current:
                words.append("".join(current))
            current = []
            continue
        current.append(unit)
    if current:
        words.append("".join(current))
    return words


class _Reader:
    def __init__(self) -> None:
        self.script = ShellScript()
        self.values = Expander(self.script, empty_unset=False)
        self.tests = Expander(self.script, empty_unset=True)
        self.branches: List[Tuple[bool, bool]] = []  # (running this branch, some branch already ran)
        self.skip: List[str] = []  # closing keywords of blocks being skipped
        self.case: Optional[Dict[str, Any]] = None  # the `case` being read: its word, clause state, a match seen

    @property
    def active(self) -> bool:
        return all(running for running, _ in self.branches)

    def statement(self, line: str) -> None:
        first = line.split(None, 1)[0].rstrip(";")
        if self.case is not None and not self.skip:
            self._case_clause(line, first)
            return
        if not self.skip and first == "case" and self.active and self._case_start(line):
            return
        self._statement(line, first)

    def _case_start(self, line: str) -> bool:
        """`case WORD in`: the clauses that follow run only when their pattern matches WORD."""
        m = re.match(r"^case\s+(.*?)\s+in$", line)
        if not m:
            return False
        words = _words(self.tests.expand(m.group(1)))
        self.case = {"word": words[0] if words else "", "state": "seek", "taken": False}
        return True

    def _case_clause(self, line: str, first: str) -> None:
        """One statement inside `case`: a `pattern)` starts a clause (the first match runs, glob patterns joined by
        |), `;;` ends it, `esac` ends the case."""
        case = self.case
        if first == "esac":
            self.case = None
            return
        if case["state"] == "seek":
            m = re.match(r"^\(?\s*([^)]*?)\s*\)\s*(.*)$", line)
            if not m:
                return
            patterns = [" ".join(_words(self.tests.expand(p))) for p in m.group(1).split("|")]
            matched = not case["taken"] and any(fnmatch.fnmatchcase(case["word"], p) for p in patterns)
            case["state"], case["taken"] = ("run" if matched else "skip"), case["taken"] or matched
            line = m.group(2).strip()
        ends = line.endswith(";;")
        body = line[:-2].strip() if ends else line
        if body and case["state"] == "run":
            self.case = None  # the clause's own statements run as ordinary ones
            self._statement(body, body.split(None, 1)[0].rstrip(";"))
            self.case = case
        if ends:
            case["state"] = "seek"

    def _statement(self, line: str, first: str) -> None:
        if self.skip:
            if first in _BLOCKS:
                self.skip.append(_BLOCKS[first])
            elif first == self.skip[-1] or (self.skip[-1] == "}" and line.startswith("}")):
                self.skip.pop()
            return
        if self._control(line, first):
            return
        if not self.active:
            return
        if first in _BLOCKS:
            self.skip.append(_BLOCKS[first])
            if re.search(rf"\b{_BLOCKS[first]}\s*;?\s*$", line):  # a one-line loop
                self.skip.pop()
        elif _FUNCTION.match(line):
            self.skip.append("}")
        else:
            self._simple(line)

    def _control(self, line: str, first: str) -> bool:
        m = _IF.match(line)
        if m and m.group(1) == "if":
            taken = self.active and condition(m.group(2), self.tests)
            self.branches.append((taken, taken))
        elif m:  # elif
            _, done = self.branches.pop()
            taken = not done and all(r for r, _ in self.branches) and condition(m.group(2), self.tests)
            self.branches.append((taken, done or taken))
        elif first == "else" and self.branches:
            _, done = self.branches.pop()
            self.branches.append((not done, True))
            rest = line[4:].strip()
            if rest:
                self.statement(rest)
        elif first == "fi" and self.branches:
            self.branches.pop()
        elif first == "then":
            rest = line[4:].strip()
            if rest:
                self.statement(rest)
        else:
            return False
        return True

    def _simple(self, line: str) -> None:
        body = re.sub(r"^(?:export|local|readonly|declare(?:\s+-\w+)*)\s+", "", line)
        m = _ASSIGN.match(body)
        if m and m.group(3).lstrip().startswith("("):
            self._assign(m.group(1), m.group(2) == "+", m.group(3))
            return
        words = _raw_words(body)
        if m and all(re.match(r"^[A-Za-z_]\w*\+?=", w) for w in words):  # A=1 B="x y": assignments only
            for word in words:
                name, _, value = word.partition("=")
                self._assign(name.rstrip("+"), name.endswith("+"), value)
            return
        if m and body is line and ".py" not in body:  # VAR=value with a quoted or substituted value
            self._assign(m.group(1), m.group(2) == "+", m.group(3))
            return
        first = words[0] if words else ""
        if first == "eval" and body is line:
            # bash joins eval's expanded words with blanks and reads the result again as a command, so quotes
            # written inside a value (`--moe-layer-freq '${FREQ}'` in a run_cmd string) are read as quotes here.
            for statement in split_statements(" ".join(_words(self.values.expand(line[len("eval"):])))):
                self.statement(statement)
        elif first == "unset":
            for name in words[1:]:
                self.script.variables.pop(name, None)
        elif first in ("source", "."):
            self.script.notes.append(f"`{line}` is not read: the variables it sets are unknown")
        elif body is line:
            self.script.commands.append(self.values.expand(line))

    def _assign(self, name: str, append: bool, raw: str) -> None:
        raw = raw.strip()
        if raw.startswith("("):
            inner = raw[1:matching(raw, 0, "(", ")") - 1]
            elements = _words(self.values.expand(inner))
            old = self.script.variables.get(name, [])
            old = old if isinstance(old, list) else [old]
            self.script.variables[name] = (old + elements) if append else elements
            return
        words = _words(self.values.expand(raw))
        value = " ".join(words)
        old = self.script.variables.get(name, "")
        self.script.variables[name] = (" ".join(old) if isinstance(old, list) else old) + value if append else value


def split_statements(line: str) -> List[str]:
    """A logical line cut at each top-level `;` (not inside quotes, brackets or `;;`)."""
    parts, current, depth = [], [], 0
    for i, unit, quoted in _units(line):
        if not quoted:
            if unit in "({[":
                depth += 1
            elif unit in ")}]":
                depth = max(0, depth - 1)
            elif unit == ";" and depth == 0 and not line.startswith(";", i + 1) and not (i and line[i - 1] == ";"):
                parts.append("".join(current).strip())
                current = []
                continue
        current.append(unit)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def read_script(text: str) -> ShellScript:
    """Variables and expanded commands of a bash script (see the module docstring for the subset read)."""
    reader = _Reader()
    for line in logical_lines(text):
        for statement in split_statements(line):
            reader.statement(statement)
    return reader.script


def command_words(command: str) -> List[str]:
    """Shell words of one expanded command, with ; && || | < > as their own words."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    return list(lexer)
