"""The lock of a save to a URL: the object ``<url>/.lazyseq-lock.json`` (an owner id, the host, its
boot and pid namespace, the pid and the process's start time, an expiry time), taken when a save
starts, renewed by a thread every ``LEASE / 3`` seconds and deleted when the save ends, whether it
succeeded or failed.

Object storage has no locks, so this is a lease (docs/remote.md says what each step guarantees):

- **Taking it**: one conditional PUT (``If-None-Match: *``: atomic on S3, GCS and ``memory://``;
  a check then a write on file systems that cannot do it), then, after ``SETTLE`` seconds, one read
  that must show this save's owner id (where the conditional PUT was not atomic, or was ignored by
  the server, the later of two writes wins and the other save refuses).
- **A lock that has expired** (its save was killed, or stalled longer than ``LEASE`` seconds) is
  deleted, if a second read still shows the same expired lock, and taken as above. So is, at once,
  the lock of a save of this machine whose process is gone (:func:`gone`): the same host name, boot
  and pid namespace, and no process with its pid, or one that started at another time (a reused pid).
- **Renewing**: read (still ours?), then write a new expiry. A save that finds another owner's lock
  (it stalled past its lease and was taken over) stops renewing, and :meth:`Lease.check`, called
  right before the manifest is written, refuses: it never writes a manifest without its lock.
- Expiry times are wall-clock (``time.time()``): the hosts' clocks must agree to within a
  fraction of ``LEASE``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any

from ..files import Remote, redact
from ..files.writes import delete, put_bytes, read_small

__all__ = ["Lease", "SaveLocked", "LEASE", "SETTLE", "LOCK"]

LEASE = 60.0  # seconds a lock holds without renewal (tests shrink it)
SETTLE = 0.5  # seconds between writing the lock and reading it back
LOCK = ".lazyseq-lock.json"


class SaveLocked(RuntimeError):
    """Another save holds the lock of a URL, or took it over from this one."""


def _when(t: Any) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))
    except (TypeError, ValueError, OverflowError):
        return f"{t!r:.40}"


def _read(path: str, link: bool = False) -> str | None:
    """The text of a file of /proc (or where a link of it leads); None where there is none."""
    try:
        if link:
            return os.readlink(path)
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _process(pid: int) -> tuple[str, int] | None:
    """The state and the start time (clock ticks after boot) of process ``pid``, from Linux's /proc;
    None where /proc does not say."""
    text = _read(f"/proc/{pid}/stat")
    try:  # "pid (name) state ppid ...": the name may hold spaces and parentheses; the start time is field 22
        fields = text.rsplit(")", 1)[1].split()  # type: ignore[union-attr]
        return fields[0], int(fields[19])
    except (AttributeError, IndexError, ValueError):
        return None


def here() -> dict:
    """What a lock records of its holder, beyond the owner id and times: the host name, the boot (Linux's
    boot id) and the pid namespace its pid is a pid of, the pid and the process's start time (None
    where the system does not say)."""
    me = _process(os.getpid())
    return {"host": socket.gethostname(), "boot": _read("/proc/sys/kernel/random/boot_id"),
            "pidns": _read("/proc/self/ns/pid", link=True), "pid": os.getpid(), "pid_start": me[1] if me else None}


def gone(held: dict) -> str | None:
    """Why the save that holds ``held`` is known to be gone: a process of this machine (the same host name,
    boot and pid namespace) that no longer runs, has exited, or whose pid is now another process's (it
    started at another time); None if it may still run (on another machine, alive, or no way to tell: a
    lock of an older lazyseq records no boot nor namespace)."""
    pid, me = held.get("pid"), here()
    if os.name != "posix" or type(pid) is not int or pid <= 0 or any(k not in held or held[k] != me[k] for k in
                                                                       ("host", "boot", "pidns")):
        return None
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return f"pid {pid} no longer runs on this host"
    except OSError:  # PermissionError: it exists (another user's); its start time tells if it is the same
        pass
    now = _process(pid)
    if now is not None and now[0] in ("Z", "X"):
        return f"pid {pid} has exited"
    if now is not None and isinstance(held.get("pid_start"), int) and now[1] != held["pid_start"]:
        return f"pid {pid} is now another process, started after the lock was taken"
    return None


def who(held: dict) -> str:
    """The save that holds a lock, as a message names it."""
    return f"a save on {str(held.get('host'))[:100]} (pid {held.get('pid')!r:.20}, started {_when(held.get('started'))})"


class Lease:
    """The lock of the store at ``remote``, held inside ``with`` (renewed by a thread)."""

    def __init__(self, remote: Remote, quiet: bool = False, seconds: float | None = None):
        self.remote, self.quiet = remote, quiet
        self.url, self.seconds = f"{remote.url}/{LOCK}", float(seconds or LEASE)
        self.shown = redact(self.url)
        self.owner, self.started = uuid.uuid4().hex, time.time()
        self.lost: dict | None = None  # the lock the renewing thread found in place of ours
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        try:
            self.release()
        except Exception:
            if kind is None:  # the save succeeded: a lock left behind is worth an error
                raise

    def _body(self) -> bytes:
        return json.dumps({"owner": self.owner, **here(), "started": self.started, "expires": time.time() + self.seconds,
                           "lease": self.seconds}).encode()

    def read(self) -> dict | None:
        """The lock now in place (``{}``: unreadable), None if there is none."""
        raw = read_small(self.remote, self.url, "the lock")
        if raw is None:
            return None
        try:
            held = json.loads(raw)
        except ValueError:
            return {}
        return held if isinstance(held, dict) else {}

    def acquire(self) -> None:
        """Take the lock (an expired one is taken over), or raise :class:`SaveLocked`."""
        for _ in range(3):
            try:
                put_bytes(self.remote, self.url, self._body(), "the lock", create=True)
                break
            except FileExistsError:
                pass
            held = self.read()
            if held is None:  # released in between
                continue
            why = self._refuse_unless_free(held)
            if self.read() == held:  # the same lock: no other save renewed or took it meanwhile
                if not self.quiet:
                    print(f"lazyseq.save: taking over the lock of {self.remote.shown}: {who(held)} held it until "
                          f"{_when(held['expires'])} ({why})", file=sys.stderr)
                delete(self.remote, [self.url], "the lock of a save that ended")
        else:
            raise SaveLocked(f"lazyseq.save: another save is taking the lock {self.shown} at the same time; try again")
        time.sleep(SETTLE)
        held = self.read()
        if held is None or held.get("owner") != self.owner:
            raise SaveLocked(f"lazyseq.save: another save took the lock {self.shown} at the same time"
                             f"{f' ({who(held)})' if held else ''}; this one stops before writing anything")
        self._thread = threading.Thread(target=self._renew, name="lazyseq-save-lease", daemon=True)
        self._thread.start()

    def _refuse_unless_free(self, held: dict) -> str:
        """Why the lock ``held`` may be taken over (it expired, its process is gone), or SaveLocked."""
        expires = held.get("expires")
        if not isinstance(expires, int | float):
            raise SaveLocked(f"lazyseq.save: {self.shown} is a lock this lazyseq cannot read; if no save is writing "
                             f"{self.remote.shown}, delete it and save again")
        if expires < time.time():
            return "it expired"
        dead = gone(held)
        if dead is not None:
            return f"its process is gone: {dead}"
        raise SaveLocked(f"lazyseq.save: another save is writing {self.remote.shown}: {who(held)} holds its lock "
                         f"until {_when(expires)}, renewing it while it runs; wait for it or stop it (the lock of "
                         f"a save that was killed expires {held.get('lease', self.seconds)} s after its last renewal)")

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                held = self.read()
                if held is None or held.get("owner") != self.owner:
                    self.lost = held or {}
                    return
                put_bytes(self.remote, self.url, self._body(), "the lock")
                if time.time() >= held.get("expires", 0):
                    # The write landed after the lease it renews had expired: another save may have
                    # taken the lock meanwhile and lost it to this write. This save cannot tell, so it
                    # gives up (check() refuses its manifest); the other one sees its lock gone.
                    self.lost = {}
                    return
            except Exception:  # tried again next period: the lease outlasts two failed renewals
                continue

    def check(self) -> None:
        """Raise :class:`SaveLocked` unless this save still holds the lock (right before its manifest)."""
        held = self.lost if self.lost is not None else self.read()
        if held is None or held.get("owner") != self.owner:
            raise SaveLocked(f"lazyseq.save: lost the lock of {self.remote.shown}"
                             f"{f' to {who(held)}' if held else ''}: another save took it over, as it may once a lock "
                             f"is not renewed for {self.seconds:g} s (a stalled process or network); no manifest was "
                             "written. The shards uploaded so far are kept: run the same save again to resume")

    def release(self) -> None:
        """Stop renewing, and delete the lock if it is still this save's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        held = self.read()
        if held is not None and held.get("owner") == self.owner:
            delete(self.remote, [self.url], "the lock")
