"""deploy/*.service: systemd's own review of each unit's sandbox (`systemd-analyze security
--offline`, which needs none of the unit's paths to exist) keeps the exposure docs/DEPLOY.md
reports, and systemd understands every line (an unknown key is ignored with a warning, and the
hardening it meant is then silently missing)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# the highest exposure (systemd's 0-10 scale) each unit may have; docs/DEPLOY.md gives the
# measured ones
LIMITS = {
    "umad.service": 1.0,
    "uma-gateway.service": 1.5,
    "umad.service + umad.service.d/gpu.conf": 1.0,
}


def _offline_supported() -> bool:
    if shutil.which("systemd-analyze") is None:
        return False
    usage = subprocess.run(["systemd-analyze", "--help"], capture_output=True, text=True).stdout
    return "--offline" in usage


pytestmark = pytest.mark.skipif(
    not _offline_supported(), reason="needs systemd-analyze with --offline (systemd 250+)"
)


def unit_text(name: str) -> str:
    """A unit with its drop-ins appended, as systemd merges them (later lines win, lists add)."""
    return "\n".join((DEPLOY / part).read_text() for part in name.split(" + "))


@pytest.mark.parametrize("name", LIMITS)
def test_unit_exposure_stays_low_and_every_line_is_understood(name: str, tmp_path: Path) -> None:
    unit = tmp_path / name.split(" + ")[0]
    unit.write_text(unit_text(name))
    limit = LIMITS[name]
    run = subprocess.run(
        [
            "systemd-analyze", "security", "--offline=true", "--no-pager",
            f"--threshold={round(limit * 10)}",  # systemd's threshold is in tenths
            str(unit),
        ],
        capture_output=True,
        text=True,
    )  # fmt: skip
    score = re.search(r"Overall exposure level for \S+: ([\d.]+)", run.stdout)
    assert score is not None, run.stdout + run.stderr
    assert run.returncode == 0 and float(score[1]) <= limit, run.stdout[-3000:]
    assert run.stderr == "", run.stderr  # e.g. "Unknown key 'ProtectFoo' in section [Service]"
