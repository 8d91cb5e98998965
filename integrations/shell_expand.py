"""Parameter and arithmetic expansion and `[`/`[[` conditions for the bash-subset reader
(`autoplan.integrations.shell`); nothing is ever executed."""
from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Union

Value = Union[str, List[str]]


@dataclass
class ShellScript:
    """What reading a script found: its variables, the commands it would run (expanded), unknown names."""

    variables: Dict[str, Value] = field(default_factory=dict)
    commands: List[str] = field(default_factory=list)
    unresolved: Set[str] = field(default_factory=set)
    notes: List[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- expansion
def matching(text: str, start: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes the one opened at `start`."""
    depth, i = 0, start
    while i < len(text):
        if text[i] == open_:
            depth += 1
        elif text[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def _arith(expr: str) -> Optional[int]:
    """Integer value of a `$(( ))` expression of literals, + - * / %, or None."""
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
                   ast.FloorDiv: lambda a, b: a // b, ast.Div: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}
            if type(node.op) in ops:
                return ops[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(expr)

    try:
        return ev(ast.parse(expr.strip(), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


class Expander:
    def __init__(self, script: ShellScript, empty_unset: bool):
        self.script, self.empty_unset = script, empty_unset
        self.in_double = False

    def _lookup(self, name: str, index: Optional[str]) -> Optional[str]:
        value = self.script.variables.get(name)
        if value is None:
            return None
        if isinstance(value, list):
            if index == "@" and self.in_double:  # "${A[@]}": one word per element, as bash expands it
                return '" "'.join(self._literal(e) for e in value)
            if index in ("@", "*"):
                return self._literal(" ".join(value))
            pos = int(index) if index and index.isdigit() else 0
            return self._literal(value[pos]) if pos < len(value) else ""
        return self._literal(value) if index in (None, "@", "*", "0") else ""

    def _literal(self, value: str) -> str:
        """A variable's value as text that later word splitting reads back verbatim: bash splits an unquoted
        expansion at blanks but never re-reads its quotes, backslashes or operators."""
        special = r'(["\\$`])' if self.in_double else r"""(["'\\;&|<>])"""
        return re.sub(special, r"\\\1", value)

    def _names_to_values(self, expr: str) -> str:
        """Bare variable names in an arithmetic expression replaced by their values; an unknown one is left in
        (the expression then stays unevaluated)."""
        def value(m: "re.Match[str]") -> str:
            v = self.script.variables.get(m.group(0))
            return v if isinstance(v, str) and v.lstrip("-").isdigit() else m.group(0)

        return re.sub(r"[A-Za-z_]\w*", value, expr)

    def _unset(self, name: str, original: str) -> str:
        if self.empty_unset:
            return ""
        if not name.isdigit() and name not in "@*#?$!":
            self.script.unresolved.add(name)
        return original

    def _braced(self, body: str, original: str) -> str:
        m = re.match(r"^(#?)([A-Za-z_]\w*|\d+|[@*#?])(?:\[([^\]]*)\])?(?:(:?)([-=+?])(.*))?$", body, re.S)
        if not m:
            return original
        length, name, index, colon, op, word = m.groups()
        value = self._lookup(name, index)
        if length:
            return str(len(value)) if value is not None else self._unset(name, original)
        unset = value is None or (colon and value == "")
        if op in ("-", "="):
            if unset:
                value = self.expand(word)
                if op == "=":
                    self.script.variables[name] = value
            return value
        if op == "+":
            return "" if unset else self.expand(word)
        return self._unset(name, original) if value is None else value

    def expand(self, text: str) -> str:
        """`text` with parameter and arithmetic expansions done; single-quoted parts kept verbatim."""
        out, i, outer = [], 0, self.in_double
        self.in_double = False
        while i < len(text):
            ch = text[i]
            if ch == "'" and not self.in_double:
                end = text.find("'", i + 1)
                end = len(text) if end < 0 else end + 1
                out.append(text[i:end])
                i = end
                continue
            if ch == "\\" and i + 1 < len(text):
                out.append(text[i:i + 2])
                i += 2
                continue
            if ch == '"':
                self.in_double = not self.in_double
            if ch != "$" or i + 1 >= len(text):
                out.append(ch)
                i += 1
                continue
            i = self._dollar(text, i, out)
        self.in_double = outer
        return "".join(out)

    def _dollar(self, text: str, i: int, out: List[str]) -> int:
        nxt = text[i + 1]
        if text.startswith("$((", i):
            end = matching(text, i + 1, "(", ")")
            value = _arith(self._names_to_values(self.expand(text[i + 3:end - 2])))
            out.append(str(value) if value is not None else text[i:end])
            return end
        if nxt == "(":
            end = matching(text, i + 1, "(", ")")
            out.append(text[i:end])  # command substitution: never run
            return end
        if nxt == "{":
            end = matching(text, i + 1, "{", "}")
            out.append(self._braced(text[i + 2:end - 1], text[i:end]))
            return end
        m = re.match(r"[A-Za-z_]\w*|\d|[@*#?$!]", text[i + 1:])
        if not m:
            out.append("$")
            return i + 1
        name = m.group(0)
        value = "0" if name == "#" else self._lookup(name, None)
        out.append(self._unset(name, "$" + name) if value is None else value)
        return i + 1 + len(name)


# ---------------------------------------------------------------------------------------------- conditions
def _test(words: List[str]) -> Optional[bool]:
    """One `[ ... ]` / `[[ ... ]]` / `test ...` over expanded words; None when it cannot be decided (file tests)."""
    if words and words[0] == "!":
        inner = _test(words[1:])
        return None if inner is None else not inner
    if len(words) == 1:
        return words[0] != ""
    if len(words) == 2:
        op, arg = words
        return {"-z": arg == "", "-n": arg != ""}.get(op)
    if len(words) == 3:
        a, op, b = words
        if op in ("=", "=="):
            return a == b
        if op == "!=":
            return a != b
        ints = {"-eq": int.__eq__, "-ne": int.__ne__, "-gt": int.__gt__, "-lt": int.__lt__, "-ge": int.__ge__,
                "-le": int.__le__}
        if op in ints and a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
            return ints[op](int(a), int(b))
    return None


def condition(text: str, expander: Expander) -> bool:
    """An `if` condition: tests joined by || and &&, left to right as bash does; undecidable counts as false."""
    try:
        lexer = shlex.shlex(expander.expand(text), posix=True, punctuation_chars="|&;")
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return False
    result: Optional[bool] = None
    joiner, current = None, []
    for word in words + ["||"]:
        if word not in ("||", "&&"):
            if word not in ("[", "]", "[[", "]]", "test", ";"):
                current.append(word)
            continue
        value = bool(_test(current))
        result = value if joiner is None else (result or value) if joiner == "||" else (result and value)
        joiner, current = word, []
    return bool(result)
