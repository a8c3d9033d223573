#!/usr/bin/env python3
"""Signs S3 requests with botocore's S3SigV4Auth, as a reference for Tidal's SigV4 signer.

Usage: botocore_sign.py REQUESTS.json

REQUESTS.json holds {"requests": [...]}, each with: name, method, scheme, host, port,
path_style, bucket, key (null for bucket-level requests), query ([[name, value], ...],
decoded), headers ([[name, value], ...], without Host), body_b64, access_key_id,
secret_access_key, session_token, region, amz_date ("20240517T123456Z").

The URL is built the way botocore's own S3 client builds it (the key percent-encoded with
'/' and '~' kept, the bucket in the path or in the host name, the query encoded by
percent_encode_sequence); the Host header is left for botocore to derive from the URL.
Prints a JSON list of {name, url, authorization, content_sha256, canonical_request}.
Needs botocore (PyPI, in tools/venv: run with tools/venv/bin/python3).
"""
import base64
import datetime
import json
import sys
import types

import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.utils import percent_encode, percent_encode_sequence


class FixedDatetime(datetime.datetime):
    """datetime whose utcnow() is the request's X-Amz-Date (botocore reads the clock)."""

    fixed = None

    @classmethod
    def utcnow(cls):
        return cls.fixed


botocore.auth.datetime = types.SimpleNamespace(datetime=FixedDatetime)
# botocore >= 1.36 reads the clock through get_current_datetime (naive UTC).
botocore.auth.get_current_datetime = lambda *args, **kwargs: FixedDatetime.fixed


def url_of(r):
    host = r["host"] if r["path_style"] else r["bucket"] + "." + r["host"]
    default_port = {"http": 80, "https": 443}[r["scheme"]]
    netloc = host if r["port"] == default_port else "%s:%d" % (host, r["port"])
    key = r["key"]
    if r["path_style"]:
        path = "/" + r["bucket"] + ("/" + percent_encode(key, safe="/~") if key is not None else "")
    else:
        path = "/" + (percent_encode(key, safe="/~") if key is not None else "")
    query = percent_encode_sequence([tuple(p) for p in r["query"]])
    return "%s://%s%s%s" % (r["scheme"], netloc, path, "?" + query if query else "")


def sign(r):
    FixedDatetime.fixed = datetime.datetime.strptime(r["amz_date"], botocore.auth.SIGV4_TIMESTAMP)
    url = url_of(r)
    request = AWSRequest(
        method=r["method"],
        url=url,
        headers=dict(r["headers"]),
        data=base64.b64decode(r["body_b64"]),
    )
    credentials = Credentials(
        r["access_key_id"], r["secret_access_key"], r["session_token"] or None
    )
    auth = botocore.auth.S3SigV4Auth(credentials, "s3", r["region"])
    auth.add_auth(request)
    authorization = request.headers["Authorization"]
    # For the diagnosis of a mismatch: the canonical request botocore signed.
    del request.headers["Authorization"]
    canonical = auth.canonical_request(request)
    return {
        "name": r["name"],
        "url": url,
        "authorization": authorization,
        "content_sha256": request.headers["X-Amz-Content-SHA256"],
        "canonical_request": canonical,
    }


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        requests = json.load(f)["requests"]
    json.dump([sign(r) for r in requests], sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
