"""What to tell a user whose run could not reach the Hugging Face hub (or any host a download needed).

A model or data set named by hub id (``Qwen/Qwen3-4B``, ``hf://datasets/...``) is fetched on first use; without
network the error that surfaces is a library's (``httpx.ConnectError: [Errno -2] Name or service not known``,
transformers' "We couldn't connect to 'https://huggingface.co'", huggingface_hub's `LocalEntryNotFoundError`),
which says neither what was being fetched nor how to run offline. `hub_error_message` walks the error's chain
for the URL it tried and returns one line that names it and gives the way out: ``HF_HUB_OFFLINE=1`` with a
filled hub cache, or local paths. ``palaestra``'s CLI prints it (`palaestra.shared.cli.one_line_error`); code that
fetches from the hub can raise its own error with it (``raise LLMError(hub_error_message(err)) from err``).
"""

from __future__ import annotations

import re
import socket

_NETWORK_MODULES = ("huggingface_hub", "httpx", "httpcore", "requests", "urllib3")
_NETWORK_NAMES = ("ConnectError", "ConnectionError", "ConnectTimeout", "NameResolutionError", "MaxRetryError")
_OFFLINE_NAMES = ("LocalEntryNotFoundError", "OfflineModeIsEnabled")
_URL = re.compile(r"https?://[^\s'\"()<>]+")
WAY_OUT = (
    "without network: fetch it once where there is network (e.g. `huggingface-cli download REPO`), then set "
    "HF_HUB_OFFLINE=1 to read the hub cache only, or give a local path (llm.model=/path/to/model, a data "
    "source's path=/path/to/file)"
)


def _chain(err: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _is_network(err: BaseException) -> bool:
    module, name = type(err).__module__, type(err).__name__
    if isinstance(err, socket.gaierror) or name in _OFFLINE_NAMES:
        return True
    return module.startswith(_NETWORK_MODULES) and name in _NETWORK_NAMES


def _url(err: BaseException) -> str | None:
    try:  # httpx and requests errors carry the request (httpx raises when it has none)
        url = err.request.url  # type: ignore[attr-defined]
    except Exception:
        url = None
    if url:
        return str(url)
    found = _URL.search(str(err))
    return found[0].rstrip(".,;:") if found else None


def hub_error_message(err: BaseException) -> str | None:
    """One line for an error caused by an unreachable hub or host: what it tried to reach, why, and the offline way
    out; None when nothing in `err`'s chain is a network or offline-cache error."""
    chain = _chain(err)
    network = [e for e in chain if _is_network(e)]
    if not network and not any("couldn't connect to" in str(e) for e in chain):
        return None
    urls = [u for u in map(_url, chain) if u]
    specific = [u for u in urls if re.search(r"https?://[^/]+/.+", u)]  # a file's URL says more than the host's
    target = (specific or urls or ["the Hugging Face hub"])[0]
    cause = str(network[-1] if network else chain[-1]).strip().splitlines()
    reason = f" ({cause[0]})" if cause else ""
    return f"could not reach {target}{reason}; {WAY_OUT}"
