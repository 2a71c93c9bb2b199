"""The run viewer's assets ship in the wheel and load nothing from elsewhere.

The wheel is built from the repository (hatchling, as ``pip wheel`` does); every file of
``src/planrun/cli/ui/static`` must be in it byte for byte, and no asset may name another host
(no CDN: the page works offline).
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "src" / "planrun" / "cli" / "ui" / "static"


def test_a_wheel_built_from_the_repository_holds_every_asset(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("planrun-*.whl")
    assets = sorted(p for p in STATIC.rglob("*") if p.is_file())
    assert {p.name for p in assets} >= {"ui.css", "run.js", "runs.js"}
    with zipfile.ZipFile(wheel) as archive:
        for path in assets:
            inside = "planrun/cli/ui/static/" + path.relative_to(STATIC).as_posix()
            assert archive.read(inside) == path.read_bytes(), inside


def test_no_asset_loads_anything_from_another_host() -> None:
    for path in STATIC.rglob("*"):
        if path.suffix not in (".js", ".css", ".html"):
            continue
        text = path.read_text(encoding="utf-8")
        hosts = set(re.findall(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text)) - {
            "http://www.w3.org"}  # the SVG namespace, a name and not a request
        assert not hosts, (path.name, hosts)
        assert not re.search(r"@import|url\(\s*['\"]?(?:https?:)?//", text), path.name
