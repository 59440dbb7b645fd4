"""Helpers of the tests that play a stranger's data: a manifest read and rewritten in place, and a
call that must end (raise or return) within a time limit, never hang."""

import json
import threading


def manifest_of(path):
    return json.loads((path / "manifest.json").read_text())


def rewrite(path, change):
    """The store at ``path`` with its manifest changed in place by ``change(manifest)``."""
    m = manifest_of(path)
    change(m)
    (path / "manifest.json").write_text(json.dumps(m))


def raised_within(seconds, fn):
    """The exception ``fn()`` raises (None if none), failing the test if it still runs after ``seconds``."""
    out = []

    def run():
        try:
            fn()
            out.append(None)
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still waiting after {seconds} s: a stranger's file must never make a read hang"
    return out[0]
