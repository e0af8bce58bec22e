#!/usr/bin/env python3
"""Builds the wheel, installs it into a fresh virtual environment and runs what a PyTorch
user runs after `pip install vramlens`: the vramlens command, `python -m vramlens.capture`
and the Python API (scripts/test_vramlens_api.py against the installed package).

    python3 scripts/test_wheel.py [--profile dev] [--reference BINARY]

--profile is passed to scripts/build_wheel.sh (dev reuses the debug build). --reference is
a vramlens binary built from the same source (tests/wheel.rs gives cargo's) whose output
the installed command must match byte for byte. Needs maturin (pip install maturin==1.16.0);
installs nothing outside a temporary folder and uses no network. Standard library only.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "testdata", "sample.pickle")


def cargo_version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        text = f.read()
    package = text.split("[package]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version\s*=\s*"([^"]+)"', package, re.M).group(1)


def clean_env(**extra):
    """The environment of a user's shell: no checkout on the import path, no override."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VRAMLENS_BINARY", "VIRTUAL_ENV")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def run(args, cwd, env=None, want=0):
    p = subprocess.run(args, cwd=cwd, env=env or clean_env(), capture_output=True, text=True)
    if p.returncode != want:
        sys.exit(f"test_wheel: {' '.join(map(str, args))} exited with {p.returncode} "
                 f"(expected {want})\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    return p.stdout


def check(cond, what):
    if not cond:
        sys.exit(f"test_wheel: FAILED: {what}")
    print(f"ok  {what}")


def check_wheel_contents(wheel, version):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"vramlens-{version}.dist-info/METADATA").decode()
        exe = z.getinfo(f"vramlens-{version}.data/scripts/vramlens")
    for name in ("vramlens/__init__.py", "vramlens/__main__.py", "vramlens/capture.py"):
        check(name in names, f"the wheel holds {name}")
    check(exe.external_attr >> 16 & 0o111, "the wheel's vramlens binary is executable")
    headers = dict(line.split(": ", 1) for line in meta.split("\n\n", 1)[0].splitlines()
                   if ": " in line and not line.startswith("Classifier"))
    check(headers.get("Name") == "vramlens", "METADATA Name: vramlens")
    check(headers.get("Version") == version, f"METADATA Version: {version} (Cargo.toml)")
    check(headers.get("Requires-Python") == ">=3.9", "METADATA Requires-Python: >=3.9")
    check(headers.get("License-Expression") == "MIT OR Apache-2.0",
          "METADATA License-Expression: MIT OR Apache-2.0")
    check("\n# vramlens\n" in meta, "METADATA carries the README")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="release")
    ap.add_argument("--reference", help="a vramlens binary built from the same source")
    a = ap.parse_args()
    version = cargo_version()
    with tempfile.TemporaryDirectory(prefix="vramlens-wheel-test-") as tmp:
        dist = os.path.join(tmp, "dist")
        run([os.path.join(ROOT, "scripts", "build_wheel.sh"), "--profile", a.profile,
             "--out", dist], cwd=ROOT, env=dict(os.environ))
        wheels = glob.glob(os.path.join(dist, "*.whl"))
        check(len(wheels) == 1, f"one wheel built: {[os.path.basename(w) for w in wheels]}")
        wheel = wheels[0]
        check(os.path.basename(wheel).startswith(f"vramlens-{version}-py3-none-"),
              f"wheel name {os.path.basename(wheel)}")
        check_wheel_contents(wheel, version)

        venv = os.path.join(tmp, "venv")
        run([sys.executable, "-m", "venv", venv], cwd=tmp)
        bindir = os.path.join(venv, "Scripts" if os.name == "nt" else "bin")
        py = os.path.join(bindir, "python")
        run([py, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
             "--disable-pip-version-check", wheel], cwd=tmp)
        exe = os.path.join(bindir, "vramlens")

        # The command, as `vramlens ...` from the environment's bin/.
        check(run([exe, "--version"], cwd=ROOT).strip() == f"vramlens {version}",
              f"vramlens --version says {version}")
        text = run([exe, "summary", "testdata/sample.pickle"], cwd=ROOT)
        check("  reserved             138.0 MiB\n" in text
              and "  peak requested       446.6 MiB at event 71," in text,
              "vramlens summary testdata/sample.pickle: reserved 138.0 MiB, peak requested 446.6 MiB")
        if a.reference:
            ref = run([a.reference, "summary", "testdata/sample.pickle"], cwd=ROOT)
            check(text == ref, "the installed command prints what cargo's binary prints")
        err = run([exe, "summary", "testdata/bad/wrong_type.pickle"], cwd=ROOT, want=2)
        check(err == "", "a bad file: status 2, nothing on stdout")
        check(run([py, "-m", "vramlens", "summary", "testdata/sample.pickle"], cwd=ROOT) == text,
              "python -m vramlens summary prints the same")

        # The capture helper.
        usage = run([py, "-m", "vramlens.capture", "--help"], cwd=tmp)
        check(usage.startswith("usage: python -m vramlens.capture [-h] [--out OUT]"),
              "python -m vramlens.capture --help")

        # The Python API finds the installed package and the binary beside it, not PATH's.
        where = run([py, "-c", "import vramlens; print(vramlens.__file__); "
                     "print(vramlens.find_binary())"], cwd=tmp).splitlines()
        check(os.path.realpath(where[0]).startswith(os.path.realpath(venv) + os.sep),
              f"import vramlens loads the installed package ({where[0]})")
        check(os.path.realpath(where[1]) == os.path.realpath(exe),
              f"vramlens.find_binary() is the environment's ({where[1]})")
        api = subprocess.run([py, os.path.join(ROOT, "scripts", "test_vramlens_api.py"),
                              "SummaryTest", "ErrorTest", "ModuleTest"],
                             cwd=tmp, env=clean_env(), capture_output=True, text=True)
        ran = re.search(r"^Ran (\d+) tests? ", api.stderr, re.M)
        check(api.returncode == 0 and ran and int(ran.group(1)) >= 10
              and "skipped" not in api.stderr,
              "scripts/test_vramlens_api.py SummaryTest ErrorTest ModuleTest pass against the "
              f"installed package:\n{api.stderr.strip()}")
        s = run([py, "-c", "import json, vramlens; d = vramlens.summary("
                 f"{SAMPLE!r})['devices'][0]; print(json.dumps(d, sort_keys=True))"], cwd=tmp)
        check('"peak_requested_bytes": 468296708' in s and '"reserved_bytes": 144703488' in s,
              "vramlens.summary('testdata/sample.pickle'): peak 468296708, reserved 144703488")

        # `pip install --target DIR`: the binary lands in DIR/bin, beside the package.
        target = os.path.join(tmp, "target")
        run([py, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
             "--disable-pip-version-check", "--target", target, wheel], cwd=tmp)
        where = run([sys.executable, "-c", "import vramlens; print(vramlens.find_binary()); "
                     f"print(vramlens.summary({SAMPLE!r})['devices'][0]['reserved_bytes'])"],
                    cwd=tmp, env=clean_env(PYTHONPATH=target)).splitlines()
        check(os.path.realpath(where[0]) == os.path.realpath(os.path.join(target, "bin", "vramlens"))
              and where[1] == "144703488",
              "pip install --target: the package finds DIR/bin/vramlens")
    print("test_wheel: all checks passed")


if __name__ == "__main__":
    main()
