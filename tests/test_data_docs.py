"""Data Docs made to open offline (expectations/data_docs.py), on a site shaped like GX's: the pages'
CDN resources point at copies in the site, checked against the pages' integrity hashes."""

from __future__ import annotations

import base64
import hashlib

from amqpscope.expectations.data_docs import VENDOR, localise
from amqpscope.web_assets import asset

BOOTSTRAP_JS = asset("bootstrap", "dist/js/bootstrap.min.js")


def sri(data: bytes) -> str:
    return "sha384-" + base64.b64encode(hashlib.sha384(data).digest()).decode()


def site(tmp_path, integrity: str):
    root = tmp_path / "local_site"
    page = root / "validations" / "suite" / "run" / "page.html"
    page.parent.mkdir(parents=True)
    (root / "static" / "styles").mkdir(parents=True)
    (root / "static" / "images").mkdir(parents=True)
    (root / "static" / "images" / "logo-long.png").write_bytes(b"png")
    page.write_text(
        '<link rel="stylesheet" href="https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css">\n'
        f'<script src="https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js" integrity="{integrity}" '
        'crossorigin="anonymous"></script>\n'
        '<img src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=1&dataContextId=x">\n'
        '<a href="https://greatexpectations.io">GX</a>\n',
        encoding="utf-8",
    )
    (root / "static" / "styles" / "default.css").write_text(
        ".brand{background:url('https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/full_logo_dark.png')}"
    )
    return root, page


def test_pages_load_the_same_files_from_the_site(tmp_path):
    root, page = site(tmp_path, sri(BOOTSTRAP_JS.read_bytes()))
    assert localise(root) == 2
    text = page.read_text(encoding="utf-8")
    assert text == (
        '<link rel="stylesheet" href="../../../static/vendor/@fortawesome/fontawesome-free/css/all.min.css">\n'
        '<script src="../../../static/vendor/bootstrap/dist/js/bootstrap.min.js"></script>\n'
        '<img src="../../../static/images/logo-long.png">\n'
        '<a href="https://greatexpectations.io">GX</a>\n'
    )  # a link is no request: left as it is
    assert (
        root / "static" / "styles" / "default.css"
    ).read_text() == ".brand{background:url('../images/logo-long.png')}"
    copied = root / VENDOR / "bootstrap" / "dist" / "js" / "bootstrap.min.js"
    assert copied.read_bytes() == BOOTSTRAP_JS.read_bytes()
    assert (root / VENDOR / "bootstrap" / "LICENSE").is_file() and (
        root / VENDOR / "bootstrap" / "package.json"
    ).is_file()
    # Font Awesome's style sheet finds its fonts beside it, as on the CDN.
    assert (root / VENDOR / "@fortawesome" / "fontawesome-free" / "webfonts" / "fa-solid-900.woff2").is_file()
    assert localise(root) == 0 and page.read_text(encoding="utf-8") == text  # again: nothing changes


def test_a_file_that_is_not_the_one_the_page_names_is_not_served(tmp_path, caplog):
    root, page = site(tmp_path, sri(b"another bootstrap"))
    localise(root)
    text = page.read_text(encoding="utf-8")
    assert 'src="https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js" integrity=' in text
    assert "is not the file" in caplog.text
    assert 'href="../../../static/vendor/@fortawesome/fontawesome-free/css/all.min.css"' in text  # the others are
