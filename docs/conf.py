"""Sphinx configuration: the pages of docs/ (Markdown, read by MyST) and the API reference
built from the docstrings (docs/api/). Built with warnings as errors by the suite
(tests/project/test_docs_build.py): ``sphinx-build -W --keep-going -b html docs <out>``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

project = "ratekeeper"
author = "the ratekeeper authors"
copyright = "the ratekeeper authors"

# No napoleon: the docstrings are reStructuredText prose without Google or NumPy sections,
# and napoleon would read an attribute's "what: how" first line as a type.
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# The docstrings are reStructuredText: ``literal``, ``::`` blocks, plain paragraphs.
autodoc_default_options = {"members": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

# Headings become link targets (docs/web.md#what-a-client-sees), as on GitHub.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

html_theme = "alabaster"
html_title = "ratekeeper"
html_static_path: list[str] = []
