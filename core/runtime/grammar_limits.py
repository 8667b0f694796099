"""Bounds on a GBNF grammar's shape, checked before llama.cpp parses it.

llama.cpp's grammar parser and its sampler recurse once per nested group ``( ... )`` and once
per rule reached at the start of another (``r0 ::= r1``, ``r1 ::= r2``...; each group is such a
rule too): a grammar nested ~15,000 groups deep, or a chain of ~60,000 rules, overflows an
8 MiB stack and kills the daemon with SIGSEGV. Nesting and the number of rules are bounded
here far below that; grammars people write (and the gateway's JSON-schema grammars) stay far
below the bounds.
"""

from __future__ import annotations

import re

MAX_DEPTH = 1000  # groups nested in one another
MAX_RULES = 10_000  # rule definitions plus groups: a bound on any chain of rules

# what can hold a parenthesis that is not a group: comments, string literals, character classes
_TOKEN = re.compile(r'#[^\r\n]*|"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[()]|::=', re.DOTALL)


def shape_error(text: str) -> str | None:
    """Why ``text`` is too deep or has too many rules for llama.cpp to parse safely, or None."""
    depth = deepest = rules = 0
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok == "(":
            depth += 1
            rules += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                return f"the grammar nests groups over {MAX_DEPTH} deep"
        elif tok == ")":
            depth = max(0, depth - 1)
        elif tok == "::=":
            rules += 1
        else:
            continue
        if rules > MAX_RULES:
            return f"the grammar has over {MAX_RULES} rules and groups"
    return None
