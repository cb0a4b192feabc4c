"""Front-end files amqpscope's pages load from disk, so that they open with no network.

They come from the npm registry at install time (``package/web/package.json`` and its lock file;
``make setup`` runs ``npm ci`` there), never from a CDN when a page opens, and none is committed:
plotly.js's basic bundle (scatter and bar traces: every chart of the report) and the files Great
Expectations' Data Docs would fetch (``expectations.data_docs``). Each package keeps its licence
file beside it in ``node_modules``; a built distribution carries the files setup.cfg lists.
"""

from __future__ import annotations

from pathlib import Path

NODE_MODULES = Path(__file__).with_name("web") / "node_modules"


class MissingAsset(FileNotFoundError):
    """A front-end file is not installed: ``make setup`` (npm ci in package/web) was not run."""


def asset(package: str, path: str) -> Path:
    """The file ``path`` of the npm ``package`` as installed, or MissingAsset saying how to install it."""
    found = NODE_MODULES / package / path
    if not found.is_file():
        raise MissingAsset(
            f"{found} is not installed: run `make setup`, or `npm ci` in {NODE_MODULES.parent} "
            f"(the npm packages amqpscope's pages load from disk, package.json there)"
        )
    return found
