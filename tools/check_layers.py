#!/usr/bin/env python3
"""tools/check_layers.py [--root DIR] — the include rule of docs/architecture.md.

Every quoted #include of the product's sources (not tests/, bench/, fuzz/, which may include
anything) names a file of the same area or of an area its own may depend on (LAYERS below).
An include the other way is reported as FILE:LINE with the rule it breaks, and the exit status
is 1. KNOWN lists wrong-way includes still to be moved (issue 49 began with 8, all since
moved): each must still exist (a fixed one is taken off the list, so the list only shrinks).

Run by ctest as ArchitectureTest.IncludesCrossNoWallTheWrongWay; `--root` points it at another
tree (ArchitectureTest.AWrongWayIncludeIsReportedWithItsFileAndLine plants one there).
"""
import argparse
import os
import re
import sys

# Area -> the areas its files may include (besides its own). An area is a directory; a file
# belongs to the longest area that is a prefix of its path. "proto" is the code generated from
# proto/ (included as "tidal/worker/v1/...").
LAYERS = {
    "common": [],
    "api": ["common"],
    "proto": [],
    "contract": ["proto", "api", "common"],
    "kube": ["common"],
    "operator/planner": ["api", "common"],
    "operator/reconciler": ["operator/planner", "kube", "api", "common"],
    "operator/controller": ["operator/reconciler", "operator/planner", "kube", "contract", "api",
                            "common"],
    "operator": ["operator/controller", "operator/reconciler", "operator/planner", "kube",
                 "contract", "api", "common"],
    # The local cluster runs the operator in its process (local/main.cc): above the operator.
    "local": ["operator/controller", "kube", "api", "common"],
    "worker/objstore": ["common"],
    "worker/engine": ["api", "common"],
    "worker/data": ["worker/engine", "worker/objstore", "api", "common"],
    "worker/checkpoint": ["worker/engine", "worker/objstore", "api", "common"],
    "worker/control": ["worker/checkpoint", "worker/data", "worker/engine", "worker/objstore",
                       "contract", "proto", "api", "common"],
    "worker": ["worker/control", "worker/checkpoint", "worker/data", "worker/engine",
               "worker/objstore", "contract", "proto", "api", "common"],
}
FREE = ("tests/", "bench/", "fuzz/")  # may include anything
SOURCES = (".h", ".cc")

# The wrong-way includes of the tree as it was (file -> included file), each a move to make.
KNOWN = set()

# Headers of an area that only some of the areas allowed to include it may include: the
# protobuf edge of the contract stays with the gRPC client and the worker's service, so that the
# operator sees plain structs only.
PRIVATE = {
    "contract/wire.h": ("contract", "worker/control"),
}


def area_of(path):
    best = None
    for area in LAYERS:
        if path == area or path.startswith(area + "/"):
            if best is None or len(area) > len(best):
                best = area
    return best


def included_area(include):
    if include.startswith("tidal/"):
        return "proto"
    return area_of(include)


def scan(root):
    found = []  # (file, line, include, rule)
    for top in sorted({a.split("/")[0] for a in LAYERS}):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                if path.startswith(FREE):
                    continue
                mine = area_of(path)
                if mine is None:
                    continue
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                        if not m:
                            continue
                        include = m.group(1)
                        if include in PRIVATE and mine not in PRIVATE[include]:
                            found.append((path, number, include,
                                          f"{include} is for {', '.join(PRIVATE[include])}/ only"))
                            continue
                        theirs = included_area(include)
                        if theirs is None or theirs == mine or theirs in LAYERS[mine]:
                            continue
                        allowed = ", ".join(LAYERS[mine]) or "nothing"
                        found.append((path, number, m.group(1),
                                      f"{mine}/ may include {allowed}; not {theirs}/"))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    args = parser.parse_args()
    found = scan(args.root)
    new = [f for f in found if (f[0], f[2]) not in KNOWN]
    seen = {(f[0], f[2]) for f in found}
    fixed = sorted(k for k in KNOWN if k not in seen)
    for path, number, include, rule in new:
        print(f'{path}:{number}: #include "{include}" crosses a wall the wrong way ({rule});'
              " docs/architecture.md says where it belongs")
    for path, include in fixed:
        print(f'{path}: no longer includes "{include}": take it off KNOWN in tools/check_layers.py')
    print(f"{len(found)} wrong-way includes, {len(found) - len(new)} of them known moves to make,"
          f" {len(new)} new, {len(fixed)} fixed but still listed")
    return 1 if new or fixed else 0


if __name__ == "__main__":
    sys.exit(main())
