"""The client side of a start: poll ``/health`` until it answers 200, then time one completion."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

POLL_S = 0.1


class StartFailed(Exception):
    """The server exited, timed out or answered the completion with an error."""


def wait_healthy(url: str, deadline: float, alive: Callable[[], bool], clock: Callable[[], float]) -> None:
    """Returns once ``url`` answers 200. ``deadline`` is on ``clock``; ``alive`` says whether the
    server still runs (a server that died is not waited for)."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass  # not listening yet, or 503 while it starts
        if not alive():
            raise StartFailed("the server exited before /health answered 200")
        if clock() > deadline:
            raise StartFailed("timed out waiting for /health 200")
        time.sleep(POLL_S)


def complete(url: str, body: Mapping[str, object], timeout: float) -> dict:
    """POSTs ``body`` as JSON and returns the JSON answer; an error status is a failed start."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=max(timeout, 1.0)) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        raise StartFailed(f"the completion was answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise StartFailed(f"the completion failed: {exc}") from None


def completion_text(answer: dict) -> str:
    """The generated text of a /v1/completions or SGLang /generate answer (for the record)."""
    if isinstance(answer, list) and answer:
        answer = answer[0]
    if "choices" in answer and answer["choices"]:
        return str(answer["choices"][0].get("text", ""))
    return str(answer.get("text", ""))
