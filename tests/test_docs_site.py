"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a missing page or
a page left out of the nav fails), every page the code sends users to exists in it, and the
built home page and a plugin page render in a real browser (headless Chromium screenshots that
are not blank)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageStat
from reference.chromium import headless
from rllm_core.docs_site import DOCS_SITE, PAGES

REPO_ROOT = Path(__file__).resolve().parent.parent
# A call naming a page, as code writes it: docs_page("running") or docs_page("running", "x").
DOCS_PAGE_CALL = re.compile(r"""docs_page\(\s*["']([^"']+)["'](?:\s*,\s*["']([^"']+)["'])?""")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built once for this module, strictly, with no network."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO_ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (
        "mkdocs build --strict failed; fix the pages it names (a new page goes into the nav of"
        f" mkdocs.yml):\n{done.stdout}{done.stderr}"
    )
    return out


def test_site_builds_strictly_with_every_kind_of_page(site):
    for page in (
        "index.html",
        "running/index.html",
        "plan-reference/index.html",
        "plugins/hooks/index.html",
        "benchmarks/index.html",
        "benchmarks/training_throughput/index.html",
        "reference/api/training/index.html",
        "reference/plugins/losses-ppo/index.html",
    ):
        assert (site / page).is_file(), page
    api = (site / "reference/api/training/index.html").read_text(encoding="utf-8")
    # mkdocstrings rendered the Protocol's docstring, its roles made Markdown.
    assert 'id="rllm_core.ports.training.TrainerBackend"' in api
    assert "Owns the policy weights" in api
    assert ":class:" not in api


def test_site_url_is_the_one_the_code_names():
    config = (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^site_url: (\S+)$", config, re.M)[1].rstrip("/") == DOCS_SITE


def _docs_page_calls() -> list[tuple[Path, str, str]]:
    sources = [REPO_ROOT / "core/src", *REPO_ROOT.glob("plugins/*/*/src"), REPO_ROOT / "examples"]
    calls = []
    for source in sources:
        for path in sorted(source.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            calls += [(path, m[1], m[2] or "") for m in DOCS_PAGE_CALL.finditer(text)]
    return calls


def test_every_page_the_code_names_exists_in_the_site(site):
    calls = _docs_page_calls()
    assert len(calls) >= 5, "the CLI's help and errors name pages through docs_page"
    for slug in PAGES:
        assert (site / slug / "index.html").is_file(), f"docs_site.PAGES names {slug}; no page"
    for path, slug, section in calls:
        where = f"{path.relative_to(REPO_ROOT)}: docs_page({slug!r}, {section!r})"
        assert slug in PAGES, f"{where}: not in rllm_core.docs_site.PAGES"
        if section:
            html = (site / slug / "index.html").read_text(encoding="utf-8")
            assert f'id="{section}"' in html, f"{where}: docs/{slug}.md has no such heading"


def _screenshot(url: str, png: Path, profile: Path) -> None:
    done = headless(
        url,
        profile,
        "--window-size=1280,900",
        f"--screenshot={png}",
        why="screenshot the documentation site",
    )
    assert done.returncode == 0 and png.is_file(), f"{url}: no screenshot\n{done.stderr}"


@pytest.mark.parametrize(
    ("page", "heading"),
    [("index.html", "Two commands"), ("reference/plugins/losses-ppo/index.html", "rllm-loss-ppo")],
)
def test_pages_render_in_a_browser(site, tmp_path, page, heading):
    assert heading in (site / page).read_text(encoding="utf-8")
    png = tmp_path / "page.png"
    _screenshot((site / page).as_uri(), png, tmp_path / "profile")
    with Image.open(png) as image:
        rgb = image.convert("RGB")
    assert rgb.size == (1280, 900)
    # A styled page: the theme's header bar, text and code in many shades, not a blank canvas
    # (a blank page is one colour with no variance).
    colours = rgb.getcolors(maxcolors=1 << 20)
    assert len(colours) > 100, f"{page}: {len(colours)} colours; the page looks blank"
    grey = rgb.convert("L")
    assert ImageStat.Stat(grey).stddev[0] > 10, f"{page}: almost uniform"
    dark = grey.point(lambda value: 255 if value < 200 else 0).histogram()[255]
    assert dark > 0.02 * 1280 * 900, f"{page}: hardly anything but white"
