"""The test TestScheduling.EveryCpuBoundTestIsATestOfThisBuildAndRunsAlone.

Usage: check_cpu_bound_tests.py CTEST LIST_FILE (run in the build directory).
Every name tests/cpu_bound_tests.cmake lists must be a test of this build and carry PROCESSORS 2
(what keeps `ctest -j2` from running two of them side by side). ctest applies the list from an
include file, where an unknown name is skipped without a word: a renamed test would quietly
start sharing the cores again. This check is what says so.
"""
import json
import re
import subprocess
import sys

ctest, list_file = sys.argv[1], sys.argv[2]
text = open(list_file, encoding="utf-8").read()
body = re.search(r"set\(TIDAL_CPU_BOUND_TESTS(.*?)\n\)", text, re.S)
if not body:
    sys.exit(f"{list_file}: no set(TIDAL_CPU_BOUND_TESTS ...) list")
listed = [line.split("#")[0].strip() for line in body.group(1).splitlines()]
listed = [name for name in listed if name]
if len(listed) != len(set(listed)):
    sys.exit(f"{list_file}: a name is listed twice")

shown = json.loads(subprocess.run([ctest, "--show-only=json-v1"], check=True,
                                  capture_output=True, text=True).stdout)
processors = {}
for test in shown["tests"]:
    props = {p["name"]: p["value"] for p in test.get("properties", [])}
    processors[test["name"]] = props.get("PROCESSORS", 1)

problems = []
for name in listed:
    if name not in processors:
        problems.append(f"{name}: listed in {list_file} but no test of this build has that name")
    elif processors[name] != 2:
        problems.append(f"{name}: PROCESSORS {processors[name]}, expected 2")
for problem in problems:
    print(problem, file=sys.stderr)
print(f"{len(listed)} CPU-bound tests listed, {len(processors)} tests in the build,"
      f" {len(problems)} problems")
sys.exit(1 if problems else 0)
