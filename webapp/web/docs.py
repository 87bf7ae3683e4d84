"""The documentation site at /docs: the pages `make docs` builds into site/, served by the lab
itself, so an instructor and the attendees read them beside the dashboard.

When site/ has not been built, every /docs page says how to build it (200, not an error: the lab
works without its docs). The built pages are MkDocs Material's, with a few small inline scripts
(the theme's bootstrap); each page is sent with a Content-Security-Policy that allows exactly
those scripts by their hash, and nothing else inline.
"""
from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from flask import Blueprint, abort, redirect, render_template, request, send_from_directory
from werkzeug.security import safe_join

from .headers import CONTENT_SECURITY_POLICY

bp = Blueprint("docs", __name__, url_prefix="/docs")
SITE = Path(__file__).resolve().parents[2] / "site"
# An inline, executable script (a JSON <script type="application/json"> is data, not run).
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>(.*?)</script>", re.DOTALL)


def site_dir() -> Path:
    """Where the built site is (read at each request: `make docs` may build it while the lab runs)."""
    return SITE


def built() -> bool:
    return (site_dir() / "index.html").is_file()


def policy_for(html: str) -> str:
    """The lab's Content-Security-Policy, with this page's own inline scripts allowed by hash and
    data: images."""
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
                      for script in INLINE_SCRIPT.findall(html))
    policy = CONTENT_SECURITY_POLICY.replace("script-src 'self'", f"script-src 'self' {hashes}".rstrip(), 1)
    # The theme's icons are SVGs in data: URLs of its stylesheet (an image cannot run script).
    return policy.replace("img-src 'self'", "img-src 'self' data:", 1)


@bp.get("/", defaults={"path": ""})
@bp.get("/<path:path>")
def page(path: str):
    site = site_dir()
    if not built():
        return render_template("docs/missing.html")
    target = safe_join(str(site), path) if path else str(site)
    if target is None:
        abort(404)
    if Path(target).is_dir():
        if path and not path.endswith("/"):  # the pages' relative links need the trailing slash
            return redirect(request.path + "/", code=308)
        path = f"{path}index.html"
    if not (site / path).is_file():
        abort(404)
    if path.endswith(".html"):  # read whole: its CSP depends on its inline scripts
        html = (site / path).read_text(encoding="utf-8")
        return html, 200, {"Content-Type": "text/html; charset=utf-8", "Content-Security-Policy": policy_for(html)}
    return send_from_directory(site, path)
