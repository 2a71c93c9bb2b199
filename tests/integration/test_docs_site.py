"""The docs site builds strictly, has no broken link, and renders in a real browser.

The site is built with ``mkdocs build --strict`` into a temporary folder, served on
loopback, and its home page and a guide are rendered by headless Chromium (Debian's
``chromium``). Without Chromium the browser test is skipped, except under
``PLANRUN_REQUIRE_CHROMIUM=1`` (CI), where a missing browser fails it.
"""

from __future__ import annotations

import functools
import html.parser
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and ((tag == "a" and name == "href") or (tag in ("link", "script", "img")
                                                              and name in ("href", "src"))):
                self.links.append(value)


def _target(site: Path, page: Path, link: str) -> Path | None:
    """The file a relative link of ``page`` points to (None: not a link into the site)."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("#", "mailto:")):
        return None
    base = "/" + str(page.relative_to(site)).replace(os.sep, "/")
    path = urlsplit(urljoin(base, parts.path)).path.lstrip("/")
    target = site / path
    return target / "index.html" if path.endswith("/") or target.is_dir() else target


def test_every_page_is_built_and_every_link_inside_the_site_resolves(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    for wanted in ("index.html", "reference/cli/index.html", "reference/api/index.html",
                   "guides/durable/index.html", "concepts/failures/index.html"):
        assert (site / wanted).is_file(), wanted
    checked = 0
    for page in pages:
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        for link in parser.links:
            target = _target(site, page, link)
            if target is not None:
                assert target.exists(), f"{page.relative_to(site)} links to a missing {link}"
                checked += 1
    assert checked > 200


def test_the_cli_page_holds_the_generated_reference(site: Path) -> None:
    text = (site / "reference/cli/index.html").read_text(encoding="utf-8")
    for wanted in ("planrun run", "--deadline", "planrun worker", "planrun fixtures check"):
        assert wanted in text, wanted
    assert "cli-reference" not in text  # the marker was replaced


def _section(page: str, identifier: str) -> str:
    """The API page's HTML from ``identifier``'s heading to the next heading of its level."""
    start = page.index(f'id="{identifier}"')
    return page[start:page.find("doc doc-heading", start + 200)]


def test_the_api_reference_has_cross_references_real_defaults_and_formatted_signatures(
        site: Path) -> None:
    import re

    page = (site / "reference/api/index.html").read_text(encoding="utf-8")
    roles = re.findall(r":(?:class|func|meth|mod|data|attr|exc|obj):", page)
    assert roles == [], f"{len(roles)} raw Sphinx roles"
    links = re.findall(r'class="autorefs autorefs-internal"[^>]*href="#([\w.]+)"', page)
    assert len(links) > 100 and {"planrun.Plan", "planrun.Model", "planrun.resume_run"} <= set(
        links)
    run = _section(page, "planrun.plan_and_run")
    parameters, others = run.split("Other Parameters", 1)
    names = re.findall(r"<td>\s*<code>(\w+)</code>\s*</td>", parameters)
    assert names == ["goal_or_plan", "app", "options"]  # model and store are not required
    assert "model" in others and "store" in others and "default <code>None</code>" in others
    signature = re.sub(r"<[^>]+>", "", re.search(r'<div class="doc-signature[^"]*">(.*?)</div>',
                                                 run, re.S)[1])
    lines = [line for line in signature.splitlines() if line.strip()]
    assert len(lines) > 1 and max(map(len, lines)) <= 88  # one parameter a line when long


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None  # type: ignore[assignment]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        if os.environ.get("PLANRUN_REQUIRE_CHROMIUM"):
            pytest.fail("PLANRUN_REQUIRE_CHROMIUM is set and no chromium is installed")
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium)")
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.mark.parametrize("page, heading", [("", "Getting started"),
                                           ("guides/durable/", "Durable runs")])
def test_a_browser_renders_the_page_with_its_code(served: str, tmp_path: Path, page: str,
                                                  heading: str) -> None:
    proc = _chromium("--dump-dom", served + page, profile=tmp_path / "profile")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert "<h1" in dom and heading in dom
    assert 'class="language-python highlight"' in dom or 'class="highlight"' in dom
    assert "```" not in dom  # every fenced block became a code block
    assert dom.count("<pre") >= 2
    shot = tmp_path / "page.png"
    proc = _chromium("--window-size=1280,900", f"--screenshot={shot}", served + page,
                     profile=tmp_path / "profile2")
    assert proc.returncode == 0 and shot.stat().st_size > 10_000
