"""Great Expectations' Data Docs made to open offline, styled, with no request.

GX's static site loads its styles and scripts from CDNs (Bootstrap, Bootstrap Table, the
datepicker, Font Awesome, jQuery, Popper, Vega) and its logo from GX's own web host: 16 to 32
resources a page. Offline the index is empty and the pages are unstyled. ``localise`` is called
once after GX has built or updated the site: it copies the same files, at the same versions, from
the npm packages installed with amqpscope (``amqpscope.web_assets``: ``package/web/package.json``)
into ``static/vendor/`` of the site, and points every page (and GX's own style sheets) at them by
relative paths, so the site can be moved or served as it is. A file whose ``integrity`` hash
(Subresource Integrity) the page names is checked against it (another file: the page keeps its CDN
and a warning is logged), then the attribute goes with ``crossorigin``: a browser refuses a
cross-origin mode load of a ``file:`` URL. GX's logo is
served from the site's own ``static/images``. Running it again changes nothing.

A resource no entry of ``_FILES`` knows (a newer GX), or whose npm package is not installed, is
left as it is and logged: the site still works online.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from amqpscope.web_assets import MissingAsset, asset

log = logging.getLogger("amqpscope.data_docs")

VENDOR = Path("static") / "vendor"
# The path of each CDN URL GX's templates name -> (npm package, file in it): the same version.
_FILES = {
    "/bootstrap/4.3.1/css/bootstrap.min.css": ("bootstrap", "dist/css/bootstrap.min.css"),
    "/bootstrap/4.3.1/js/bootstrap.min.js": ("bootstrap", "dist/js/bootstrap.min.js"),
    "/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": (
        "@forevolve/bootstrap-dark",
        "dist/css/bootstrap-prefers-dark.css",
    ),
    "/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (
        "bootstrap-datepicker",
        "dist/css/bootstrap-datepicker.min.css",
    ),
    "/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (
        "bootstrap-datepicker",
        "dist/js/bootstrap-datepicker.min.js",
    ),
    "/ajax/libs/font-awesome/6.6.0/css/all.min.css": ("@fortawesome/fontawesome-free", "css/all.min.css"),
    "/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": ("bootstrap-table", "dist/bootstrap-table.min.css"),
    "/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": ("bootstrap-table", "dist/bootstrap-table.min.js"),
    "/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": (
        "bootstrap-table",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    ),
    "/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": (
        "bootstrap-table-1.19.0",
        "dist/extensions/filter-control/bootstrap-table-filter-control.css",
    ),
    "/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": (
        "bootstrap-table-1.19.0",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ),
    "/ajax/libs/popper.js/1.12.9/umd/popper.min.js": ("popper.js", "dist/umd/popper.min.js"),
    "/jquery-3.7.1.min.js": ("jquery", "dist/jquery.min.js"),
    # A CDN serves a package's browser build for its bare name (package.json "jsdelivr" / "unpkg").
    "/npm/vega@5": ("vega", "build/vega.min.js"),
    "/npm/vega-lite@5": ("vega-lite", "build/vega-lite.min.js"),
    "/npm/vega-embed@6": ("vega-embed", "build/vega-embed.min.js"),
}
# Folders a style sheet refers to by relative URL, copied beside it (Font Awesome's fonts).
_BESIDE = {("@fortawesome/fontawesome-free", "css/all.min.css"): ("webfonts",)}
# GX's logo from its web host -> the copy GX ships in the site.
_LOGOS = {"/logo-long.png": "static/images/logo-long.png", "/full_logo_dark.png": "static/images/logo-long.png"}

_TAG = re.compile(r"<(?:script|link|img)\b[^>]*>", re.IGNORECASE)
_URL_ATTRIBUTE = re.compile(r"""\b(src|href)=(["'])(https?://[^"']+)\2""", re.IGNORECASE)
_INTEGRITY = re.compile(r"""\s+integrity=(["'])([^"']*)\1""", re.IGNORECASE)
_CROSSORIGIN = re.compile(r"""\s+crossorigin(=(["'])[^"']*\2)?""", re.IGNORECASE)
_CSS_URL = re.compile(r"""url\((["']?)(https?://[^)"']+)\1\)""")
_RESOURCE_TAG = re.compile(r"<script\b|<img\b|rel=[\"']?(stylesheet|icon|shortcut icon)", re.IGNORECASE)


def localise(site: Path) -> int:
    """Point every page of the Data Docs site in ``site`` (the folder of its index.html) at local
    copies of the files it loads from the network; the number of files changed."""
    site = Path(site)
    changed = 0
    for path in sorted([*site.rglob("*.html"), *(site / "static" / "styles").glob("*.css")]):
        text = path.read_text(encoding="utf-8")
        if "http" not in text:
            continue
        local = _css(text, path, site) if path.suffix == ".css" else _html(text, path, site)
        if local != text:
            _replace(path, local)
            changed += 1
    return changed


def _html(text: str, page: Path, site: Path) -> str:
    def tag(found: re.Match[str]) -> str:
        element = found.group(0)
        url = _URL_ATTRIBUTE.search(element)
        if url is None:
            return element
        target = _local(url.group(3), site)
        if target is None:
            if _RESOURCE_TAG.search(element):
                log.warning("%s loads %s, which amqpscope does not serve locally", page, url.group(3))
            return element
        integrity = _INTEGRITY.search(element)
        if integrity is not None and not _matches(target, integrity.group(2)):
            # Another version than the page names (package/web/package.json): the page keeps its CDN.
            log.warning(
                "%s: %s is not the file %s names (integrity %s)", page, target, url.group(3), integrity.group(2)
            )
            return element
        element = _CROSSORIGIN.sub("", _INTEGRITY.sub("", element))
        relative = os.path.relpath(target, page.parent).replace(os.sep, "/")
        return _URL_ATTRIBUTE.sub(lambda m: f"{m.group(1)}={m.group(2)}{relative}{m.group(2)}", element, count=1)

    return _TAG.sub(tag, text)


def _css(text: str, sheet: Path, site: Path) -> str:
    def url(found: re.Match[str]) -> str:
        target = _local(found.group(2), site)
        if target is None:
            log.warning("%s loads %s, which amqpscope does not serve locally", sheet, found.group(2))
            return found.group(0)
        return f"url('{os.path.relpath(target, sheet.parent).replace(os.sep, '/')}')"

    return _CSS_URL.sub(url, text)


def _local(url: str, site: Path) -> Path | None:
    """The file in ``site`` serving ``url`` (copied there from the npm packages when first needed),
    or None when it is not one GX loads."""
    path = urlsplit(url).path
    if path in _LOGOS:
        return site / _LOGOS[path]
    if path not in _FILES:
        return None
    package, file = _FILES[path]
    target = site / VENDOR / package / file
    if not target.is_file():
        try:
            source = asset(package, file)
        except MissingAsset as missing:
            log.warning("Data Docs keep loading %s: %s", url, missing)
            return None
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        for folder in _BESIDE.get((package, file), ()):
            shutil.copytree(source.parent.parent / folder, target.parent.parent / folder, dirs_exist_ok=True)
        # Each package's licence goes with it, and its package.json (version, licence, repository).
        for kept in ("LICENSE", "LICENSE.txt", "package.json"):
            if (source_file := asset_root(package) / kept).is_file():
                shutil.copyfile(source_file, site / VENDOR / package / kept)
    return target


def asset_root(package: str) -> Path:
    """The installed folder of an npm package (its package.json is there)."""
    return asset(package, "package.json").parent


def _matches(target: Path, integrity: str) -> bool:
    """Whether ``target`` is the file a Subresource Integrity value ("<algorithm>-<base64 digest>",
    several allowed, one enough) names."""
    data = target.read_bytes()
    for value in integrity.split():
        algorithm, _, digest = value.partition("-")
        if algorithm in ("sha256", "sha384", "sha512"):
            if base64.b64encode(hashlib.new(algorithm, data).digest()).decode() == digest:
                return True
    return False


def _replace(path: Path, text: str) -> None:
    # Written whole and renamed over: a reader sees the old page or the new one.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
