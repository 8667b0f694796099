"""One request never hurts another: inputs that crashed the core or closed a shared connection
(issue 35) are refused alone, with a 400 naming the field, and the core serves on."""

from __future__ import annotations

import itertools
import string

import httpx
import pytest

from .gateway_fixtures import *  # noqa: F403

pytestmark = pytest.mark.integration


def _names(n: int) -> list[str]:
    """``n`` distinct three-letter rule names (short, so a long chain fits one body)."""
    letters = string.ascii_letters
    return ["".join(t) for t in itertools.islice(itertools.product(letters, repeat=3), n)]


def _rule_chain(n: int) -> str:
    """``root ::= r0``, ``r0 ::= r1``, ...: llama.cpp recurses once per link."""
    names = _names(n + 1)
    links = "".join(f"{a} ::= {b}\n" for a, b in itertools.pairwise(names))
    return f'root ::= {names[0]}\n{links}{names[-1]} ::= "a"\n'


CRASHERS = {
    "groups-30000-deep": "root ::= " + "(" * 30000 + '"a"' + ")" * 30000,
    "rule-chain-70000": _rule_chain(70000),
}


@pytest.mark.parametrize("name", sorted(CRASHERS))
def test_a_grammar_too_deep_for_the_parser_is_400_and_the_core_serves_on(
    gateway, umad, model_id, name
) -> None:
    body = {"model": model_id, "prompt": "hi", "max_tokens": 1, "grammar": CRASHERS[name]}
    r = httpx.post(f"{gateway.base_url}/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "grammar" and "grammar" in err["message"], err
    assert umad.proc.poll() is None, umad.log()[-2000:]
    ok = gateway.client().completions.create(model=model_id, prompt="Hello", max_tokens=4)
    assert ok.choices[0].text
    assert "Traceback" not in umad.log() and "Traceback" not in gateway.log()
