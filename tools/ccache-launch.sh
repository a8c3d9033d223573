#!/bin/sh
# tools/ccache-launch.sh CCACHE COMPILER ARGS... — the compiler launcher (CMakeLists.txt): the
# compile through ccache, and beside a precompiled header it writes (-o X.gch) X.gch.sum, a
# checksum of everything that went into it: the contents of each file its depfile (-MF) lists.
#
# ccache hashes a precompiled header into the key of every source that includes it, and GCC's
# .gch files differ from one build to the next (they hold addresses), so a header compiled
# afresh, or taken from the cache after another build stored a different one, made every
# source that uses it a miss in a new clone (the tests' header: 60 sources, 240 CPU-s). With
# CCACHE_PCH_EXTSUM ccache hashes X.gch.sum instead, which is the same wherever the inputs are.
ccache=$1
shift
"$ccache" "$@" || exit $?
out= depfile=
while [ $# -gt 0 ]; do
  case $1 in
    -o) out=$2; shift ;;
    -MF) depfile=$2; shift ;;
  esac
  shift
done
case $out in
  *.gch) ;;
  *) exit 0 ;;
esac
if [ -z "$depfile" ] || [ ! -f "$depfile" ]; then
  rm -f "$out.sum"  # ccache hashes the header itself then
  exit 0
fi
# The depfile: "target: prerequisite prerequisite \" lines; the target is not an input.
sed -e 's/^[^:]*: *//' -e 's/ *\\$//' "$depfile" | tr ' ' '\n' | grep -v '^$' |
  while IFS= read -r f; do cat "$f"; done | sha256sum > "$out.sum.tmp" &&
  mv "$out.sum.tmp" "$out.sum"
