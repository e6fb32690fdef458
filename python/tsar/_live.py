"""tsar.LiveModule: a module that follows the archive at a path (hot swap in Python).

A model server publishes a new version by renaming a new archive over the path
(``tsar pack`` and ``tsar.save`` do). A watching thread notices it (inotify on
the path's directory, and a stat() of the path every ``poll_interval``),
opens and verifies the new file, binds it into a fresh module from ``make()``
(typically built on the meta device: a version costs no weight memory of its
own), warms it up, and only then serves it. Requests that got the old module
finish on it; the old version's mapping goes away with the last reference to
its module. A file that cannot serve is refused and the old version serves on.
"""
from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from typing import Any, Callable, NamedTuple, Optional, Tuple

import torch

from . import _tsar_portable as _files  # identity() and PathWatch: no LibTorch
from ._archive import open as _open
from ._bind import load_into

_VERIFY = ("full", "index")


class LiveEvent(NamedTuple):
    """What happened to a new file at the watched path (``on_event``'s argument)."""

    kind: str  # "swapped" (it serves now as `version`) or "refused" (`error` says why)
    path: str
    # "swapped": the new file's version, serving now. "refused": None, since the
    # refused file never got a version (the one serving is still live.version).
    version: Optional[int]
    error: str  # "" for "swapped"
    load_ms: float  # open + verify + make + bind + warm_up of the new file
    warm_up_ms: float  # of which warm_up (the model's own cost)
    make_ms: float  # and of which make() (the model's own cost too)


class LiveModule:
    """A module that follows the archive at ``path``; see the module's docstring.

    ``make()`` returns a fresh module (built on the meta device, or on the CPU:
    ``load_into`` binds it in place either way); each version gets its own.
    ``warm_up(module)``, if given, runs before a version serves (one forward, to
    fault its pages in and fill any caches); what it raises refuses the file.
    ``verify``: "full" (every storage's checksum before a version serves; it
    also reads the file into the page cache) or "index". ``poll_interval``
    seconds between stat()s of the path (0: none); ``inotify``: also wake on
    renames into the directory and files closed after writing (what notices a
    new version at once). With neither, only :meth:`check` looks.
    ``on_event(LiveEvent)`` is called on the watching thread after each swap
    or refusal; what it raises is ignored. ``load_into_kwargs`` go to every
    :func:`tsar.load_into` (``entry``, ``strict``, ``rank``, ``world``...).

    On the watching thread, anything ``make``, ``warm_up`` or loading raises,
    ``SystemExit``, ``KeyboardInterrupt`` and every other BaseException
    included, refuses the file (``last_error`` names the exception), and
    anything ``on_event`` raises is ignored: the watcher never dies of them.
    On the caller's thread (:meth:`check`), an Exception refuses the file
    too, while a BaseException that is not an Exception (Ctrl-C) propagates
    and refuses nothing, as does one raised by ``on_event`` (after the swap or
    refusal is recorded).

    The first version is loaded in the constructor, which raises what
    opening, ``make``, binding or ``warm_up`` raised: there is nothing to serve.

    Per request, take the module once and use it to the end: ``module =
    live.get()`` (or ``module, version = live.current()``). Never keep it
    beyond the request: the old version's mapping is released only when no
    reference to its module is left.

    Thread-safe: get(), current(), version, stats() from any thread, at any
    time; they never wait for a load. The watching thread holds no lock
    readers need, and waits and verifies without the GIL.

    Pre-fork servers: create the LiveModule in each worker after the fork
    (gunicorn's ``post_fork``, a pool's initializer). One made before a fork
    is restarted in the child: the child serves the version the parent had
    and watches the path with its own thread.
    """

    def __init__(self, path, make: Callable[[], torch.nn.Module], *,
                 warm_up: Optional[Callable[[torch.nn.Module], Any]] = None,
                 verify: str = "full", poll_interval: float = 1.0, inotify: bool = True,
                 on_event: Optional[Callable[[LiveEvent], Any]] = None, **load_into_kwargs):
        if verify not in _VERIFY:
            raise ValueError(f"verify: expected one of {', '.join(_VERIFY)}, found {verify!r}")
        if poll_interval < 0:
            raise ValueError(f"poll_interval: expected seconds >= 0, found {poll_interval!r}")
        self._path = os.fspath(path)
        self._make, self._warm_up, self._verify = make, warm_up, verify
        self._poll, self._inotify, self._on_event = float(poll_interval), bool(inotify), on_event
        self._kwargs = load_into_kwargs
        self._check_lock = threading.Lock()  # one load at a time (watcher or check())
        # Guards _closed and _loading together: close() waits for the watcher
        # only when it is not loading, and a watcher loads only when not closed.
        self._state_lock = threading.Lock()
        self._loading = False
        self._closed = False
        self._stats = collections.Counter()
        self._last_error = ""
        self._last_load_ms = self._last_warm_up_ms = self._last_make_ms = 0.0
        self._refused = None  # identity of the last refused file: not retried until it changes
        ident = _files.identity(self._path)
        module, load_ms, warm_ms, make_ms = self._load()  # raises: nothing to serve
        self._serving: Tuple[torch.nn.Module, int, Any] = (module, 1, ident)
        self._last_load_ms, self._last_warm_up_ms, self._last_make_ms = load_ms, warm_ms, make_ms
        self._watch = None
        self._thread = None
        self._start()
        # A watcher thread does not survive fork(): restart it in the child.
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (lambda s: s and s._after_fork())(ref()))

    # -- serving -----------------------------------------------------------------
    def get(self) -> torch.nn.Module:
        """The module serving now. Use it for one request, then let it go."""
        return self._serving[0]

    def current(self) -> Tuple[torch.nn.Module, int]:
        """(module, version) serving now, taken together."""
        module, version, _ = self._serving
        return module, version

    @property
    def version(self) -> int:
        """1 for the file the LiveModule opened, +1 at each swap."""
        return self._serving[1]

    @property
    def path(self) -> str:
        return self._path

    @property
    def last_error(self) -> str:
        """Why the last refused file was refused ("" if none was)."""
        return self._last_error

    def stats(self) -> dict:
        """Counters: version, swaps, refusals, checks (looks at the path), and the
        last load's milliseconds (load_ms, of which warm_up_ms and make_ms);
        ``watching``: whether a watching thread is alive."""
        t = self._thread
        return {"version": self.version, "swaps": self._stats["swaps"],
                "refusals": self._stats["refusals"], "checks": self._stats["checks"],
                "load_ms": self._last_load_ms, "warm_up_ms": self._last_warm_up_ms,
                "make_ms": self._last_make_ms,
                "last_error": self._last_error, "watching": t is not None and t.is_alive()}

    # -- watching ----------------------------------------------------------------
    def check(self) -> bool:
        """Looks at the path now, on the caller's thread; loads and swaps in a new
        file if there is one. True if a new version now serves."""
        if self._closed:
            raise ValueError("check(): the LiveModule is closed")
        return self._check()

    def close(self) -> None:
        """Stops watching, promptly. The module serving stays usable by whoever
        holds it; get() keeps returning it. An idle watching thread is joined;
        one in the middle of a load (a full verify of a large file, a slow
        ``make`` or ``warm_up``) is not waited for: it ends when that load
        does, and the version it loaded is dropped, never served, and no
        event is sent for it."""
        with self._state_lock:
            self._closed = True
            loading = self._loading
        if self._watch is not None:
            self._watch.wake()
        t = self._thread
        if t is not None and t is not threading.current_thread() and not loading:
            t.join()
        self._thread = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"<tsar.LiveModule {self._path!r} version={self.version}{' closed' if self._closed else ''}>"

    # -- internals ---------------------------------------------------------------
    def _start(self):
        if not self._inotify and self._poll == 0:
            return  # only check() looks
        self._watch = _files.PathWatch(self._path, self._inotify)
        self._thread = threading.Thread(target=self._run, name=f"tsar-live {self._path}", daemon=True)
        self._thread.start()

    def _after_fork(self):
        self._check_lock = threading.Lock()  # the parent's may have been held by its watcher
        self._state_lock = threading.Lock()
        self._loading = False
        self._watch = self._thread = None
        if not self._closed:
            self._start()

    def _run(self):
        timeout_ms = int(self._poll * 1000) if self._poll > 0 else -1
        watch = self._watch
        while not self._closed:
            watch.wait(timeout_ms)  # without the GIL
            if self._closed:
                break
            try:
                self._check()
            except BaseException:  # noqa: BLE001 (the thread must live; _check reports)
                pass

    def _load(self):
        """(module, load ms, warm-up ms, make ms) of the file at the path now."""
        t0 = time.perf_counter()
        archive = _open(self._path, verify=self._verify)  # verifies without the GIL
        try:
            tm = time.perf_counter()
            module = self._make()
            make_ms = (time.perf_counter() - tm) * 1e3
            if not isinstance(module, torch.nn.Module):
                raise TypeError(f"make() returned {type(module).__name__}, expected a torch.nn.Module")
            serving = getattr(self, "_serving", None)
            if serving is not None and module is serving[0]:
                raise ValueError("make() returned the module serving now; it must build a new one")
            load_into(module, archive, **self._kwargs)
        finally:
            archive.close()  # the module's tensors keep the mapping
        t1 = time.perf_counter()
        if self._warm_up is not None:
            with torch.no_grad():
                self._warm_up(module)
        t2 = time.perf_counter()
        return module, (t2 - t0) * 1e3, (t2 - t1) * 1e3, make_ms

    def _check(self) -> bool:
        watcher = threading.current_thread() is self._thread
        with self._check_lock:
            self._stats["checks"] += 1
            ident = _files.identity(self._path)
            if ident is None or ident == self._serving[2] or ident == self._refused:
                return False
            with self._state_lock:
                if self._closed and watcher:
                    return False
                self._loading = True
            try:
                module, load_ms, warm_ms, make_ms = self._load()
            except BaseException as e:  # noqa: BLE001 (any failure refuses the file)
                with self._state_lock:
                    self._loading = False
                    closed = self._closed
                if not isinstance(e, Exception) and not watcher:
                    raise  # Ctrl-C in check() on the caller's thread: not the file's fault
                if closed:
                    return False  # closed while it loaded: nothing more is reported
                self._refused = ident
                if isinstance(e, Exception):
                    self._last_error = str(e) or repr(e)
                else:  # SystemExit, KeyboardInterrupt... on the watcher: refuse, live on
                    self._last_error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                self._stats["refusals"] += 1
                self._event("refused", self._last_error, 0.0, 0.0, 0.0)
                return False
            with self._state_lock:
                self._loading = False
                if self._closed:
                    return False  # closed while it loaded: dropped, never served
            # A file replaced while it loaded is looked at again next time.
            version = self._serving[1] + 1
            self._serving = (module, version, ident)
            del module  # only _serving (and requests) hold it
            self._last_load_ms, self._last_warm_up_ms, self._last_make_ms = load_ms, warm_ms, make_ms
            self._refused = None
            self._stats["swaps"] += 1
            self._event("swapped", "", load_ms, warm_ms, make_ms)
            return True

    def _event(self, kind, error, load_ms, warm_ms, make_ms):
        if self._on_event is None:
            return
        version = self.version if kind == "swapped" else None  # a refused file has none
        try:
            self._on_event(LiveEvent(kind, self._path, version, error, load_ms, warm_ms, make_ms))
        except Exception:  # noqa: BLE001 (what on_event raises is ignored)
            pass
        except BaseException:  # noqa: BLE001
            if threading.current_thread() is not self._thread:
                raise  # check() on the caller's thread: Ctrl-C goes through
            # On the watcher: ignored too, or the thread would die of it.
