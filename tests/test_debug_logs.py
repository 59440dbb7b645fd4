"""DEBUG logs never show a secret (issue #31, "a stranger's data, second pass"): with DEBUG logging on
every logger, what the libraries lazyseq reads through log (botocore, s3fs, fsspec, aiohttp, urllib3 ...)
carries no access key id, secret key, session token nor signature, in a message, its arguments, a
traceback or a stack.

Each scenario runs in a fresh interpreter that calls ``logging.basicConfig(level=DEBUG)`` as a user
would (pytest's own log capture stays out of the way), reads from the session's moto S3 server
(tests/servers.py) with credentials that include a session token, and hands back everything its root
handler wrote, records formatted with their ``exc_info`` and ``stack_info``."""

import io
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import lazyseq

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "AKIALAZYSEQTESTKEY12"  # the shape of an AWS access key id
SECRET = "lazyseqSecretKey/0123456789+abcdefghijklmn"
TOKEN = "FwoGZXIvYXdzELAZYSEQSessionTokenQWxhZGRpbjpvcGVuIHNlc2FtZQ" * 3

SCRIPT = r"""
import io, json, logging, sys, traceback
buf = io.StringIO()
logging.basicConfig(level=logging.DEBUG, stream=buf,
                    format="%(asctime)s %(name)s %(levelname)s %(message)s")
import lazyseq
a = json.loads(sys.argv[1])
endpoint = {"client_kwargs": {"endpoint_url": a["endpoint"], "region_name": "us-east-1"}}
opts = {"key": a["key"], "secret": a["secret"], "token": a["token"], **endpoint}
log = logging.getLogger("user")
out = {}
# first the credentials of the environment (lazyseq never sees them), then the same in storage_options
for name, url, o in (("s3", a["s3"], endpoint), ("presigned", a["presigned"], None), ("s3-options", a["s3"], opts)):
    store = lazyseq.load(url, storage_options=o, cache_dir=a["cache"] + name)
    out[name] = [int(store[i]["n"]) for i in (0, 5, len(store) - 1)] + [int(x["n"]) for x in store[3:9]]
for name, url, o in (("s3-missing", a["s3_missing"], opts), ("presigned-missing", a["presigned_missing"], None)):
    try:
        lazyseq.load(url, storage_options=o, timeout=2)
    except Exception as e:
        out[name] = type(e).__name__
        log.exception("the load failed")  # a user logs the error with its traceback
        log.debug("the failure, with the stack", stack_info=True)
sys.stdout.write(json.dumps({"out": out, "log": buf.getvalue()}))
"""


def _presign(s3, key: str) -> str:
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client("s3", endpoint_url=s3.endpoint_url, region_name=s3.region,
                                            config=Config(signature_version="s3v4"), aws_access_key_id=KEY,
                                            aws_secret_access_key=SECRET, aws_session_token=TOKEN)
    try:
        return client.generate_presigned_url("get_object", Params={"Bucket": s3.bucket, "Key": key}, ExpiresIn=600)
    finally:
        client.close()


def test_debug_logs_of_s3_reads_show_no_secret(s3, tmp_path):
    saved = tmp_path / "train"
    lazyseq.save([{"n": i, "x": np.full(40, i, np.int32)} for i in range(40)], saved, method="thread", shard_bytes=600)
    for f in os.listdir(saved):
        s3.client.upload_file(str(saved / f), s3.bucket, f"train/{f}")
    presigned, presigned_missing = _presign(s3, "train"), _presign(s3, "missing")
    signatures = [re.search(r"X-Amz-Signature=([0-9a-f]+)", u)[1] for u in (presigned, presigned_missing)]
    args = {"key": KEY, "secret": SECRET, "token": TOKEN, "endpoint": s3.endpoint_url, "cache": str(tmp_path / "cache-"),
            "s3": f"s3://{s3.bucket}/train", "s3_missing": f"s3://{s3.bucket}/missing", "presigned": presigned,
            "presigned_missing": presigned_missing}
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_SESSION_TOKEN=TOKEN)
    for k in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        env.pop(k, None)
    run = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(args)], capture_output=True, text=True, timeout=180,
                         env=env, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    expect = [0, 5, 39, 3, 4, 5, 6, 7, 8]
    assert got["out"]["s3"] == got["out"]["presigned"] == got["out"]["s3-options"] == expect
    assert got["out"]["s3-missing"] in ("StoreError", "FileNotFoundError")
    assert got["out"]["presigned-missing"] in ("StoreError", "FileNotFoundError")
    text = got["log"] + run.stderr
    # the log is a real DEBUG log of the reads: botocore signed requests, fsspec and s3fs spoke
    assert "botocore" in text and "s3fs" in text and "Traceback" in text and "the load failed" in text
    assert text.count("\n") > 200
    for name, secret in [("access key id", KEY), ("secret key", SECRET), ("session token", TOKEN),
                         ("the token's start", TOKEN[:24]), ("presigned signature", signatures[0]),
                         ("presigned signature", signatures[1])]:
        assert _absent(secret, text), f"the {name} is in the DEBUG log: ...{_around(text, secret)}..."
    assert secret_free(text)


def _absent(secret: str, text: str) -> bool:
    return secret not in text  # (a function: pytest's report of a failed `in` would print the secret)


def secret_free(text: str) -> bool:
    """No signature (64 hex digits after 'Signature'), no credential, no token value after its name."""
    patterns = [r"(?i)signature[^0-9a-f\n]{0,12}\n?[0-9a-f]{64}", r"(?i)credential=(?!\*)[A-Z0-9]{8}",
                r"(?i)x-amz-security-token['\"]?\s*[:=]\s*b?['\"]?(?!\*)[A-Za-z0-9+/]{8}", r"\bA[SK]IA[A-Z0-9]{16}\b"]
    for p in patterns:
        m = re.search(p, text)
        assert m is None, f"{p} matches the DEBUG log: ...{_around(text, m[0])}..."
    return True


def _around(text: str, secret: str) -> str:
    i = text.find(secret)
    return text[max(0, i - 200):i + len(secret) + 50].replace(secret, "<SECRET>")


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_any_loggers_records_are_scrubbed_where_they_are_made():
    """A child of a library's logger (no filter on its parent reaches it), a message with arguments, a
    traceback and a stack: each scrubbed, and a handler that reads ``exc_info`` itself (as error trackers
    do) finds no exception that carries the secret."""
    from lazyseq.files.connect import filesystem

    filesystem("memory://x", {}, 5.0)  # as any read does: the scrubbing is in place
    sig = "ab" * 32
    url = f"https://host/b/k?X-Amz-Credential={KEY}%2F20240101&X-Amz-Security-Token={TOKEN}&X-Amz-Signature={sig}"
    keep, text = _Keep(), io.StringIO()
    shown = logging.StreamHandler(text)
    log = logging.getLogger("botocore.auth.lazyseq-test-child")
    log.addHandler(keep), log.addHandler(shown)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        log.debug("Sending %s with %r", url, {"Authorization": f"AWS4-HMAC-SHA256 Credential={KEY}/x, Signature={sig}",
                                             "X-Amz-Security-Token": TOKEN.encode()})
        log.debug("CanonicalRequest:\nGET\n/b/k\n\nhost:h\nx-amz-security-token:%s\n", TOKEN)
        log.debug("Signature:\n%s", sig)
        try:
            raise ConnectionError(f"404 for url={url!r}")
        except ConnectionError:
            log.exception("the request failed", stack_info=True)
    finally:
        log.removeHandler(keep), log.removeHandler(shown)
    out = text.getvalue()
    assert out.count("Sending https://host/b/k with {'Authorization': ***, 'X-Amz-Security-Token': ***}") == 1
    assert "x-amz-security-token:***" in out and "Signature:***" in out
    assert "Traceback" in out and "ConnectionError: 404 for url='https://host/b/k'" in out and "Stack (most recent" in out
    for secret in (KEY, TOKEN[:20], sig):
        assert _absent(secret, out)
    failed = keep.records[-1]
    assert failed.exc_info is None and "ConnectionError" in failed.exc_text and _absent(sig, failed.exc_text)
    assert secret_free(out)


def test_a_record_whose_arguments_do_not_format_is_scrubbed_too():
    from lazyseq.files.connect import filesystem, scrub_record

    filesystem("memory://x", {}, 5.0)
    record = logging.getLogger("urllib3.connectionpool.lazyseq-test").makeRecord(
        "urllib3.connectionpool", logging.DEBUG, __file__, 1, "%s %s %d", (f"Authorization: Bearer {TOKEN}",), None)
    scrub_record(record)
    assert record.args == () and _absent(TOKEN[:20], record.getMessage()) and "Authorization: ***" in record.getMessage()
