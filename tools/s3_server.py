#!/usr/bin/env python3
"""A real S3-protocol server for the s3:// tests and benchmarks: moto's S3 (PyPI moto[server],
installed into tools/venv by `make deps`) on a loopback port, with SigV4 verified.

moto checks a request's signature only once its IAM side knows the access key: the server
therefore starts open, creates an IAM user with an access key and an s3:* policy and the
bucket through its own HTTP API, and only then turns verification on. From that moment a
request signed with any other secret, or with an unknown key, is refused
(SignatureDoesNotMatch / InvalidAccessKeyId), exactly as AWS refuses it.

  tools/venv/bin/python3 tools/s3_server.py --bucket B [--tls-cert C --tls-key K]

prints one JSON line when it serves: {"port", "endpoint", "access_key", "secret_key",
"bucket"}, then serves until killed. Objects live in memory and go with the process."""
import argparse
import json
import logging
import os
import sys
import threading

os.environ.setdefault("MOTO_ALLOW_NONEXISTENT_REGION", "true")

import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402
from moto import settings  # noqa: E402
from moto.moto_server.werkzeug_app import (  # noqa: E402
    DomainDispatcherApplication,
    create_backend_app,
)
from werkzeug.serving import make_server  # noqa: E402

REGION = "us-east-1"
S3_POLICY = json.dumps({
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--tls-cert", help="PEM certificate: serve https")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    args = parser.parse_args()
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")

    # Quiet: a line per request on stderr fills the pipe of a parent that reads it only at the
    # end (the tests' Process), and then every request blocks on the write.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # Open while we set ourselves up; verification goes on below.
    settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
    ssl_context = (args.tls_cert, args.tls_key) if args.tls_cert else None
    server = make_server(args.address, args.port, DomainDispatcherApplication(create_backend_app),
                         threaded=True, ssl_context=ssl_context)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    scheme = "https" if ssl_context else "http"
    endpoint = f"{scheme}://{args.address}:{port}"
    session = boto3.session.Session(aws_access_key_id="setup", aws_secret_access_key="setup",
                                    region_name=REGION)
    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    iam = session.client("iam", endpoint_url=endpoint, verify=False, config=config)
    iam.create_user(UserName="tidal")
    iam.put_user_policy(UserName="tidal", PolicyName="s3", PolicyDocument=S3_POLICY)
    key = iam.create_access_key(UserName="tidal")["AccessKey"]
    session.client("s3", endpoint_url=endpoint, verify=False,
                   config=config).create_bucket(Bucket=args.bucket)
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0

    print(json.dumps({"port": port, "endpoint": endpoint, "bucket": args.bucket,
                      "access_key": key["AccessKeyId"],
                      "secret_key": key["SecretAccessKey"]}), flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
