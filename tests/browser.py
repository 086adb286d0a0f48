"""Headless Chromium driven through the DevTools protocol on a pipe, with nothing but the standard library.

`--remote-debugging-pipe` makes Chromium read commands on fd 3 and answer on fd 4, as
JSON messages each ended by a NUL byte: no port, no WebSocket client, no package. A
test opens a page, runs JavaScript in it, clicks, and lets the page settle under
virtual time (the same clock `--virtual-time-budget` uses: it only moves when the page
has nothing left to run, so "the budget ran out" means "the page went quiet").
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import time
from pathlib import Path
from types import TracebackType
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


class BrowserError(AssertionError):
    """Chromium answered a command with an error, or went away."""


class Chromium:
    """One headless Chromium process; `open(url)` gives a `Page`."""

    def __init__(self, profile: Path) -> None:
        # Each pipe end is moved to fd >= 10 first, so that moving it to 3 or 4 cannot overwrite the other;
        # posix_spawn's dup2 does the move in the child (no Python runs between fork and exec).
        to_browser, self._to_browser = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in os.pipe())
        self._from_browser, from_browser = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in os.pipe())
        self.log = profile.parent / f"{profile.name}.log"  # Chromium's own output, to read when a test fails
        log = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        argv = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
        try:
            self.pid: int | None = os.posix_spawn(
                argv[0],
                argv,
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log, 1),
                    (os.POSIX_SPAWN_DUP2, log, 2),
                    (os.POSIX_SPAWN_DUP2, to_browser, 3),
                    (os.POSIX_SPAWN_DUP2, from_browser, 4),
                ],
            )
        finally:
            for fd in (log, to_browser, from_browser):
                os.close(fd)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _exited(self, timeout: float) -> bool:
        """Whether Chromium has ended (reaped), waiting up to `timeout` seconds for it."""
        deadline = time.monotonic() + timeout
        while self.pid is not None:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                self.pid = None
            elif time.monotonic() > deadline:
                return False
            else:
                time.sleep(0.05)
        return True

    def close(self) -> None:
        if not self._exited(0):
            with contextlib.suppress(BrowserError, OSError):
                self.call("Browser.close", timeout=10)
            if not self._exited(10) and self.pid is not None:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                self.pid = None
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)

    def send(self, method: str, params: dict[str, Any], session: str | None = None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None once `deadline` (time.monotonic) has passed."""
        while b"\0" not in self._buffer:
            if not select.select([self._from_browser], [], [], max(0.0, deadline - time.monotonic()))[0]:
                return None
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium went away (see {self.log})")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)  # type: ignore[no-any-return]

    def call(self, method: str, session: str | None = None, *, timeout: float = 60, **params: Any) -> dict[str, Any]:
        """Send one command and return its result; events that arrive meanwhile are kept in `events`."""
        wanted = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while (message := self._receive(deadline)) is not None:
            if message.get("id") == wanted:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})  # type: ignore[no-any-return]
            self.events.append(message)
        raise BrowserError(f"{method}: no answer in {timeout} s")

    def pump(self) -> None:
        """Keep every message that has already arrived (in `events`), without waiting."""
        while (message := self._receive(time.monotonic())) is not None:
            self.events.append(message)

    def wait_event(self, method: str, session: str | None, *, timeout: float) -> dict[str, Any] | None:
        """The first event `method` (of this session) not yet consumed, or None when `timeout` passes first."""
        deadline = time.monotonic() + timeout
        while True:
            for n, event in enumerate(self.events):
                if event.get("method") == method and event.get("sessionId") == session:
                    return self.events.pop(n)
            message = self._receive(deadline)
            if message is None:
                return None
            self.events.append(message)

    def open(self, url: str) -> Page:
        """A new tab showing `url`, returned once its load event fired; its requests are recorded from the start."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        page = Page(self, session)
        self.call("Page.enable", session)
        self.call("Network.enable", session)
        self.call("Page.navigate", session, url=url)
        if self.wait_event("Page.loadEventFired", session, timeout=120) is None:
            raise BrowserError(f"{url} did not load")
        return page


class Page:
    """One tab: run JavaScript in it, let it settle."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session

    def evaluate(self, expression: str, *, timeout: float = 60) -> Any:
        """The value of a JavaScript expression (a promise is awaited), as JSON."""
        answer = self.browser.call(
            "Runtime.evaluate",
            self.session,
            timeout=timeout,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
        )
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def requested(self) -> list[str]:
        """Every URL the page asked for so far (its own included)."""
        self.browser.pump()
        return [
            e["params"]["request"]["url"]
            for e in self.browser.events
            if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == self.session
        ]

    def click(self, selector: str) -> None:
        """A real mouse click (pressed, released) at the middle of the first element matching `selector`."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.browser.call(
                "Input.dispatchMouseEvent", self.session, type=kind, x=box[0], y=box[1], button="left", clickCount=1
            )

    def settle(self, budget_ms: int = 5000, *, cap: float = 60) -> bool:
        """Let the page run until it has nothing left to do and `budget_ms` of virtual time passed.

        Virtual time only moves while the page is idle, so a page that keeps working holds the
        budget back. Returns False if `cap` real seconds passed first: the caller then looks at
        what the page did meanwhile (this is a bound on the wait, not a timing assertion).
        """
        self.browser.call(
            "Emulation.setVirtualTimePolicy", self.session, policy="pauseIfNetworkFetchesPending", budget=budget_ms
        )
        expired = self.browser.wait_event("Emulation.virtualTimeBudgetExpired", self.session, timeout=cap)
        return expired is not None
