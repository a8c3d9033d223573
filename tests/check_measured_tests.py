"""Run by the test TestScheduling.EveryMeasuredTestIsATestOfThisBuild.

Usage: check_measured_tests.py CTEST LIST_FILE BUILD_DIR
Every test tests/measured_tests.cmake lists must be a test of this build and carry the ctest
properties the list gives it: COST its seconds, PROCESSORS 2 at 1.3 cores or more, else 1. ctest
applies the list from an include file, where an unknown name is skipped without a word: a renamed
test would quietly lose its place in the order, or start sharing the cores again. This check is
what says so.
"""
import json
import re
import subprocess
import sys

ctest, list_file, build_dir = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(list_file, encoding="utf-8").read()
body = re.search(r"set\(TIDAL_MEASURED_TESTS(.*?)\n\)", text, re.S)
if not body:
    sys.exit(f"{list_file}: no set(TIDAL_MEASURED_TESTS ...) list")
listed = {}
for entry in re.findall(r'"([^"]*)"', body.group(1)):
    fields = entry.split()
    if len(fields) != 3:
        sys.exit(f'{list_file}: "{entry}": expected "NAME SECONDS CORES"')
    name, seconds, cores = fields[0], float(fields[1]), float(fields[2])
    if name in listed:
        sys.exit(f"{list_file}: {name} is listed twice")
    listed[name] = (seconds, 2 if cores >= 1.3 else 1)

shown = json.loads(subprocess.run([ctest, "--show-only=json-v1"], check=True, cwd=build_dir,
                                  capture_output=True, text=True).stdout)
properties = {t["name"]: {p["name"]: p["value"] for p in t.get("properties", [])}
              for t in shown["tests"]}

problems = []
for name, (seconds, processors) in listed.items():
    if name not in properties:
        problems.append(f"{name}: listed in {list_file} but no test of this build has that name")
        continue
    got = properties[name]
    if float(got.get("COST", 0)) != seconds:
        problems.append(f"{name}: COST {got.get('COST')}, expected {seconds:g}")
    if got.get("PROCESSORS", 1) != processors:
        problems.append(f"{name}: PROCESSORS {got.get('PROCESSORS', 1)}, expected {processors}")
for problem in problems:
    print(problem, file=sys.stderr)
alone = sum(1 for _, p in listed.values() if p == 2)
print(f"{len(listed)} measured tests listed ({alone} run alone), {len(properties)} tests in the"
      f" build, {len(problems)} problems")
sys.exit(1 if problems else 0)
