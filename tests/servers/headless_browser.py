"""The browser of the OAuth tests: opens an authorization URL without a person.

Usage (what Python's `webbrowser` runs when BROWSER names this program, through a wrapper,
see `conformance_client.browser_wrapper`):
    python tests/servers/headless_browser.py URL

It GETs URL and follows the redirects (the test authorization servers approve at once and
redirect to the client's redirect URI); the chain ends at the gateway's loopback callback,
which answers 200. Exit 0 when the last answer is 2xx, else 1 with one line on stderr. The
whole chain is bounded (BOUND seconds), so a callback nobody serves cannot hang a test.

Standard library only: it runs under whatever python3 the wrapper names.
"""

from __future__ import annotations

import sys
import threading
import urllib.error
import urllib.request

# The whole chain: a few local hops, each well under a second.
BOUND = 10.0


def fetch(url: str) -> str | None:
    """None when the chain ends in a 2xx answer, else why not (one line)."""
    # No proxies: the chain is the test's own local servers, and an http_proxy in the
    # environment would be asked to reach 127.0.0.1 on our behalf.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=BOUND) as response:
            status: int = response.status
            response.read()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from {exc.url}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"cannot fetch {url}: {exc}"
    return None if 200 <= status < 300 else f"HTTP {status} at the end of the chain"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: headless_browser.py URL", file=sys.stderr)
        return 2
    outcome: list[str | None] = []
    done = threading.Event()

    def run() -> None:
        outcome.append(fetch(argv[1]))
        done.set()

    # urllib's timeout bounds each socket operation, not the chain of redirects: the thread
    # and the event bound the whole.
    threading.Thread(target=run, daemon=True).start()
    if not done.wait(BOUND):
        print(f"no answer within {BOUND:.0f} s: {argv[1]}", file=sys.stderr)
        return 1
    if outcome[0] is not None:
        print(outcome[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
