#!/usr/bin/env python3
"""Make this overlay's credentials, which the repository does not carry: a random scrape password
(scrape-password, what Prometheus sends) and the exporter's web config with its bcrypt hash
(web-config.yml). kustomize's secretGenerator reads both; it fails, naming the file, until they exist.

    python3 make-credentials.py          # once; again to change the password (both files together)

Needs the bcrypt module (a dependency of vllm-xpu-exporter). Files are written mode 0600.
"""

import os
import secrets
import sys
from pathlib import Path

import bcrypt

HERE = Path(__file__).resolve().parent
WEB_CONFIG = """\
# The exporter's web configuration (exporter-toolkit's format; docs/deployment.md, "Securing the endpoint"),
# made by make-credentials.py with the password in scrape-password beside it. Basic auth over plain HTTP
# shows the password to anyone on the pod network: add tls_server_config (cert_file and key_file from a
# Secret, e.g. cert-manager's) and tlsConfig in the ServiceMonitor for more than a try-out.
basic_auth_users:
  {user}: {hash}
"""


def write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


def main() -> int:
    user = (HERE / "scrape-username").read_text().strip()
    password = secrets.token_urlsafe(24)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    write_private(HERE / "scrape-password", password)
    write_private(HERE / "web-config.yml", WEB_CONFIG.format(user=user, hash=hashed))
    print(f"make-credentials.py: wrote scrape-password and web-config.yml for user {user} in {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
