"""Where the documentation site lives, so that help texts and errors name a page on it rather
than a file of the repository, which someone who installed with pip does not have.

The site is built from ``docs/`` by ``mkdocs build`` (``mkdocs.yml`` at the repository root,
whose ``site_url`` is :data:`DOCS_SITE`); a test builds it and checks that every page in
:data:`PAGES` exists, and every section named through :func:`docs_page` too.
"""

from __future__ import annotations

__all__ = ["DOCS_SITE", "PAGES", "docs_page"]

DOCS_SITE = "https://rllm-core.readthedocs.io/en/latest"

# The pages code may send a user to: docs/<slug>.md, served at <DOCS_SITE>/<slug>/.
PAGES = (
    "running",
    "sft",
    "scaling",
    "scheduler",
    "models",
    "tasks",
    "rollout",
    "gateway",
    "storage",
    "cuts",
    "exporting",
    "inspecting-runs",
    "plan-reference",
    "plugins/authoring",
    "plugins/hooks",
)


def docs_page(slug: str, section: str = "") -> str:
    """The address of ``docs/<slug>.md`` on the site, with ``#section`` when given (the
    heading's anchor: lower case, words joined by ``-``)."""
    if slug not in PAGES:
        raise ValueError(
            f"{slug!r} is not a page of the documentation site; use one of {', '.join(PAGES)}"
            " or add docs/<slug>.md to mkdocs.yml and to rllm_core.docs_site.PAGES"
        )
    return f"{DOCS_SITE}/{slug}/" + (f"#{section}" if section else "")
