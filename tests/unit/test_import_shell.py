"""The bash subset launch scripts use, read without running anything (autoplan.integrations.shell)."""
import pytest

from autoplan.integrations.shell import command_words, logical_lines, read_script, split_statements


def words_of_last_command(text):
    return command_words(read_script(text).commands[-1])


def test_assignments_defaults_and_arithmetic():
    s = read_script('A=${A:-4}\nB=${1:-"x y"}\nC=$((A*2+1))\nexport D=1 E="$B"\nF=$(hostname)\n')
    assert s.variables["A"] == "4" and s.variables["B"] == "x y" and s.variables["C"] == "9"
    assert s.variables["D"] == "1" and s.variables["E"] == "x y" and s.variables["F"] == "$(hostname)"


def test_arrays_append_and_quoted_expansion_keep_elements():
    text = 'A=("--x 1" --y)\nA+=(--z)\nB=("${A[@]}" --w)\nrun "${B[@]}" ${A[@]}\n'
    s = read_script(text)
    assert s.variables["B"] == ["--x 1", "--y", "--z", "--w"]
    assert words_of_last_command(text) == ["run", "--x 1", "--y", "--z", "--w", "--x", "1", "--y", "--z"]


def test_expansions_are_not_reread_as_shell_syntax():
    text = "P='<path> a;b \"q'\nrun $P\n"
    assert words_of_last_command(text) == ["run", "<path>", 'a;b', '"q']


@pytest.mark.parametrize("condition, taken", [
    ('[[ "$M" == "fp8" ]]', True), ('[ "$M" = bf16 ]', False), ('[ -z "$UNSET" ]', True),
    ('[ -n "$UNSET" ]', False), ('[[ "$N" -gt 3 ]]', True), ('[ ! -f "$M" ]', False),
    ('[[ "$M" == x ]] || [[ "$N" -eq 4 ]]', True), ('[[ "$M" == fp8 ]] && [[ "$N" -lt 4 ]]', False),
])
def test_conditions(condition, taken):
    s = read_script(f'M=fp8\nN=4\nif {condition}; then\n  R=yes\nelse\n  R=no\nfi\n')
    assert s.variables["R"] == ("yes" if taken else "no")


def test_elif_nesting_loops_case_and_functions_are_skipped_or_followed():
    text = """
X=b
if [ "$X" = a ]; then Y=1
elif [ "$X" = b ]; then
  if [ 1 -eq 2 ]; then Y=2; else Y=3; fi
else Y=4
fi
while [[ $# -gt 0 ]]; do
  case $1 in
    --x) X="$2"; shift 2 ;;
  esac
done
f() {
  X=changed
}
for i in 1 2; do X=loop; done
"""
    s = read_script(text)
    assert (s.variables["X"], s.variables["Y"]) == ("b", "3")


def test_lines_comments_continuations_and_heredocs():
    text = "A=(\n --x 1  # note (with parens)\n --y\n)\nrun a \\\n  b # c\ncat <<EOF\nit's data\nEOF\nZ=1; W=2\n"
    lines = logical_lines(text)
    assert lines[0].startswith("A=(") and "note" not in lines[0]
    assert lines[1].split() == ["run", "a", "b"] and lines[3] == "it's data"
    assert split_statements("Z=1; W=2") == ["Z=1", "W=2"]
    assert logical_lines("echo a\\\\\necho b\n") == ["echo a\\\\", "echo b"]  # an escaped backslash ends it
    assert split_statements("case x in a) b ;; esac") == ["case x in a) b ;; esac"]


def test_unassigned_variables_are_kept_and_named():
    s = read_script("run --seq $SEQ ${TP} $1\n")
    assert command_words(s.commands[0]) == ["run", "--seq", "$SEQ", "${TP}", "$1"]
    assert s.unresolved == {"SEQ", "TP"}


def test_case_on_a_value_runs_the_first_matching_clause():
    text = """SCALE=8B
case "${SCALE}" in
    "800M") TP=1 ;;
    8B|16B)
        TP=4
        HIDDEN=4096
        ;;
    *) TP=99 ;;
esac
"""
    s = read_script(text)
    assert (s.variables["TP"], s.variables["HIDDEN"]) == ("4", "4096")
    assert read_script(text.replace("SCALE=8B", "SCALE=2B")).variables["TP"] == "99"
