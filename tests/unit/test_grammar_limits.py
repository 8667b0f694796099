"""core/runtime/grammar_limits.py: what counts as nesting and as a rule."""

from __future__ import annotations

from uma_serve.core.runtime.grammar_limits import MAX_DEPTH, MAX_RULES, shape_error
from uma_serve.gateway.gbnf import JSON_OBJECT


def test_parentheses_in_literals_classes_and_comments_are_not_groups() -> None:
    quoted = "(" * (MAX_DEPTH + 1)
    text = f'# {quoted}\nroot ::= "{quoted}" [(] "\\"(" ("a")\n'
    assert shape_error(text) is None
    assert shape_error(JSON_OBJECT) is None


def test_depth_and_rule_bounds() -> None:
    deep = "root ::= " + "(" * (MAX_DEPTH + 1) + '"a"' + ")" * (MAX_DEPTH + 1)
    assert "nests groups" in (shape_error(deep) or "")
    ok = "root ::= " + "(" * MAX_DEPTH + '"a"' + ")" * MAX_DEPTH
    assert shape_error(ok) is None
    chain = "".join(f"r{i} ::= r{i + 1}\n" for i in range(MAX_RULES + 1))
    assert "rules" in (shape_error(chain) or "")
