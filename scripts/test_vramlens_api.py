#!/usr/bin/env python3
"""Tests of the Python API (`import vramlens`) against the real binary and the fixtures.

    PYTHONPATH=python VRAMLENS_BINARY=target/debug/vramlens python3 scripts/test_vramlens_api.py
        the package from the checkout, the binary from cargo (tests/python_api.rs)
    VENV/bin/python scripts/test_vramlens_api.py
        the package and binary a wheel installed (tests/wheel.rs)

The expected figures come from testdata/*.expected.json, which scripts/expected.py computes
with Python's own pickle module, independently of vramlens. Standard library only.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True

import vramlens  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA = os.path.join(ROOT, "testdata")


def fixture(name):
    return os.path.join(TESTDATA, name)


def expected(name):
    with open(fixture(name + ".expected.json")) as f:
        return json.load(f)


# Fields of expected.json that the summary JSON names differently.
RENAMED = {"peak_allocated_index": "peak_allocated_event", "peak_requested_index": "peak_requested_event"}


def assert_device_matches(test, got, want):
    """Every figure of the independent computation, compared with summary's."""
    for key, value in want.items():
        with test.subTest(device=want["device"], field=key):
            if key == "trace":
                for tkey, tvalue in value.items():
                    test.assertEqual(got["trace"][tkey], tvalue, tkey)
            elif key == "ooms":
                test.assertEqual([{k: o[k] for k in ("index", "size", "device_free")}
                                  for o in got["ooms"]], value)
            else:
                test.assertEqual(got[RENAMED.get(key, key)], value)


def has_subcommand(name):
    out = subprocess.run([vramlens.find_binary(), "--help"], capture_output=True,
                         text=True, check=True).stdout
    commands = out.split("Commands:", 1)[-1].split("Options:", 1)[0]
    return any(line.split()[:1] == [name] for line in commands.splitlines())


def walk_ints(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from walk_ints(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk_ints(v)
    elif isinstance(value, int) and not isinstance(value, bool):
        yield value


class SummaryTest(unittest.TestCase):
    def test_sample_figures_match_the_independent_computation(self):
        want = expected("sample.pickle")
        got = vramlens.summary(fixture("sample.pickle"))
        self.assertEqual(got["schema_version"], 2)
        self.assertEqual(got["source"]["path"], fixture("sample.pickle"))
        self.assertEqual(got["source"]["pickle_protocol"], want["pickle_protocol"])
        self.assertEqual(got["layout"]["root"], want["root"])
        self.assertEqual([d["device"] for d in got["devices"]], [0])
        assert_device_matches(self, got["devices"][0], want["devices"][0])
        # The figures the README shows for this file, in exact bytes.
        dev = got["devices"][0]
        self.assertEqual(dev["reserved_bytes"], 138 << 20)
        self.assertEqual(dev["peak_requested_bytes"], 468_296_708)
        self.assertEqual(dev["peak_requested_event"], 71)

    def test_device_selects_one_device(self):
        want = expected("multi_device.pickle")
        self.assertEqual([d["device"] for d in want["devices"]], [0, 2])
        every = vramlens.summary(pathlib.Path(fixture("multi_device.pickle")))
        self.assertEqual([d["device"] for d in every["devices"]], [0, 2])
        only = vramlens.summary(pathlib.Path(fixture("multi_device.pickle")), device=2)
        self.assertEqual([d["device"] for d in only["devices"]], [2])
        assert_device_matches(self, only["devices"][0], want["devices"][1])
        self.assertEqual(only["devices"][0], every["devices"][1])

    def test_path_starting_with_a_dash_is_a_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(fixture("sample.pickle"), os.path.join(tmp, "-sample.pickle"))
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                got = vramlens.summary("-sample.pickle")
            finally:
                os.chdir(cwd)
        self.assertEqual(got["source"]["path"], "-sample.pickle")
        self.assertEqual(got["devices"][0]["reserved_bytes"], 138 << 20)


    def test_a_file_named_dash_is_the_file_not_standard_input(self):
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(fixture("sample.pickle"), os.path.join(tmp, "-"))
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                got = vramlens.summary("-")
                top = vramlens.top("-")
            finally:
                os.chdir(cwd)
        self.assertEqual(got["source"]["path"], "./-")
        self.assertEqual(got["devices"][0]["reserved_bytes"], 138 << 20)
        self.assertIn("groups", top)


class ErrorTest(unittest.TestCase):
    def test_a_folder_raises_vramlens_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("a.pickle", "b.pickle"):
                shutil.copy(fixture("sample.pickle"), os.path.join(tmp, name))
            with self.assertRaises(vramlens.VramlensError) as cm:
                vramlens.summary(tmp)
            self.assertIn("is a folder; expected one snapshot file", str(cm.exception))
            self.assertEqual(cm.exception.returncode, 2)

    def test_bad_pickle_raises_with_the_one_line_message(self):
        path = fixture("bad/wrong_type.pickle")
        with self.assertRaises(vramlens.VramlensError) as cm:
            vramlens.summary(path)
        e = cm.exception
        self.assertEqual(str(e), f'{path}: device_traces[0][17].size: expected a non-negative '
                                 f'int, found str "4096"')
        self.assertEqual(e.message, str(e))
        self.assertEqual(e.returncode, 2)
        self.assertEqual(e.stderr, f"vramlens: error: {e.message}\n")

    def test_code_in_a_pickle_is_refused_not_run(self):
        path = fixture("bad/os_system.pickle")
        with self.assertRaises(vramlens.VramlensError) as cm:
            vramlens.summary(path)
        self.assertEqual(str(cm.exception), f"{path}: byte 2: not a data-only pickle: opcode "
                                            f"GLOBAL; vramlens never runs code from a file")

    def test_missing_file(self):
        with self.assertRaises(vramlens.VramlensError) as cm:
            vramlens.summary(fixture("no_such_file.pickle"))
        self.assertEqual(str(cm.exception), f"{fixture('no_such_file.pickle')}: no such file")

    def test_binary_override_that_is_not_a_file(self):
        old = os.environ.get("VRAMLENS_BINARY")
        os.environ["VRAMLENS_BINARY"] = os.path.join(TESTDATA, "no_such_binary")
        try:
            with self.assertRaises(FileNotFoundError) as cm:
                vramlens.summary(fixture("sample.pickle"))
        finally:
            if old is None:
                del os.environ["VRAMLENS_BINARY"]
            else:
                os.environ["VRAMLENS_BINARY"] = old
        self.assertIn("no_such_binary is not an executable file", str(cm.exception))

    def test_message_of_a_usage_error(self):
        self.assertEqual(vramlens._error_message(
            "error: unexpected argument '--bogus' found\n\n  tip: ...\n", 2),
            "unexpected argument '--bogus' found")
        self.assertEqual(vramlens._error_message("", -9),
                         "vramlens exited with status -9 and printed no error")


class ModuleTest(unittest.TestCase):
    """`python -m vramlens ARGS` runs the binary with ARGS."""

    def python_m(self, *args, **env):
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(vramlens.__file__)))
        full = dict(os.environ, PYTHONPATH=pkg_parent, PYTHONDONTWRITEBYTECODE="1", **env)
        return subprocess.run([sys.executable, "-m", "vramlens", *args], capture_output=True,
                              text=True, cwd=ROOT, env=full)

    def test_passes_arguments_and_status(self):
        ok = self.python_m("summary", "testdata/sample.pickle")
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn("  reserved             138.0 MiB\n", ok.stdout)
        bad = self.python_m("summary", "testdata/bad/wrong_type.pickle")
        self.assertEqual((bad.returncode, bad.stdout), (2, ""))
        self.assertEqual(bad.stderr, "vramlens: error: testdata/bad/wrong_type.pickle: "
                         'device_traces[0][17].size: expected a non-negative int, found str '
                         '"4096"\n')

    def test_missing_binary_is_a_one_line_error(self):
        missing = os.path.join(TESTDATA, "no_such_binary")
        r = self.python_m("--version", VRAMLENS_BINARY=missing)
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertEqual(r.stderr, f"vramlens: error: VRAMLENS_BINARY={missing} is not an "
                                   "executable file\n")


class TopTest(unittest.TestCase):
    def setUp(self):
        if not has_subcommand("top"):
            self.skipTest("this vramlens binary has no `top` subcommand")

    def test_top_at_peak_by_callsite(self):
        got = vramlens.top(fixture("sample.pickle"))
        direct = subprocess.run(
            [vramlens.find_binary(), "top", fixture("sample.pickle"), "--at", "peak", "--by",
             "callsite", "--json"], capture_output=True, text=True, check=True).stdout
        self.assertEqual(got, json.loads(direct))
        self.assertEqual(got["schema_version"], 2)
        # What was live at the peak adds up to the peak of the independent computation.
        self.assertEqual(expected("sample.pickle")["devices"][0]["peak_requested_bytes"],
                         got["total_bytes"])

    def test_top_bad_file_raises(self):
        with self.assertRaises(vramlens.VramlensError) as cm:
            vramlens.top(fixture("bad/wrong_type.pickle"))
        self.assertEqual(cm.exception.returncode, 2)
        self.assertIn("device_traces[0][17].size", str(cm.exception))


def direct(*args, ok=(0,)):
    """The command's own JSON, run without the API."""
    proc = subprocess.run([vramlens.find_binary(), *args], capture_output=True, text=True)
    assert proc.returncode in ok, proc.stderr
    return json.loads(proc.stdout)


class CommandsTest(unittest.TestCase):
    """Every command with --json has a function that returns what the command prints."""

    def setUp(self):
        for name in ("oom", "diff", "check", "budget", "reconcile", "export", "report",
                     "simulate"):
            if not has_subcommand(name):
                self.skipTest(f"this vramlens binary has no `{name}` subcommand")

    def test_oom_with_its_log(self):
        snap, log = fixture("gpu/oom/oom_snapshot.pickle"), fixture("gpu/oom/oom.log")
        got = vramlens.oom(snap, log=log)
        self.assertEqual(got, direct("oom", snap, "--log", log, "--json"))
        self.assertEqual(got["analyses"][0]["verdicts"][0]["cause"], "leak")
        # A log alone.
        alone = vramlens.oom(log=log)
        self.assertIsNone(alone["path"])
        self.assertEqual(alone["messages"][0]["requested_bytes"], 134217728)

    def test_oom_of_several_files_is_a_list_in_their_order(self):
        # vramlens prints one object per file: a list of them, each what the file alone
        # gives.
        first, second = fixture("gpu/oom/oom_snapshot.pickle"), fixture("sample.pickle")
        got = vramlens.oom([first, second])
        self.assertIsInstance(got, list)
        self.assertEqual(got, [vramlens.oom(first), vramlens.oom(second)])
        self.assertEqual(got[0]["analyses"][0]["verdicts"][0]["cause"], "leak")
        # One file in a list is one file: a dict.
        self.assertEqual(vramlens.oom([first]), vramlens.oom(first))

    def test_a_string_where_a_list_is_expected_is_one_value(self):
        sample = fixture("sample.pickle")
        by_list = vramlens.budget(sample, gpus=["h100"])
        self.assertEqual(vramlens.budget(sample, gpus="h100"), by_list)
        self.assertEqual(vramlens.budget([sample], gpus=("h100",)), by_list)
        self.assertEqual([f["gpu"]["name"] for f in by_list["fits"]], ["H100 80GB"])
        snap = fixture("allocator/oom_retry.pickle")
        self.assertEqual(
            vramlens.simulate(snap, alloc_conf="expandable_segments:True", outside=0),
            vramlens.simulate(snap, alloc_conf=["expandable_segments:True"], outside=0))
        snap, nvml = fixture("gpu/oom/oom_snapshot.pickle"), fixture("gpu/oom/nvml.jsonl")
        self.assertEqual(vramlens.reconcile(snap, nvml=[nvml]),
                         vramlens.reconcile(snap, nvml=pathlib.Path(nvml)))

    def test_other_types_where_a_list_is_expected_raise_type_error(self):
        sample = fixture("sample.pickle")
        for call, name in [
            (lambda: vramlens.budget(sample, gpus={"h100"}), "gpus"),
            (lambda: vramlens.budget(sample, gpus={"h100": 1}), "gpus"),
            (lambda: vramlens.budget(sample, gpus=[None]), "gpus"),
            (lambda: vramlens.budget(sample, nvml=3), "nvml"),
            (lambda: vramlens.budget(sample, sizes=["a"]), "sizes"),
            (lambda: vramlens.budget(7), "paths"),
            (lambda: vramlens.simulate(sample, alloc_conf=True), "alloc_conf"),
            (lambda: vramlens.oom({sample}), "paths"),
        ]:
            with self.subTest(name=name):
                with self.assertRaises(TypeError) as e:
                    call()
                self.assertTrue(str(e.exception).startswith(name + ": expected "),
                                str(e.exception))

    def test_diff_of_a_file_with_itself_changes_nothing(self):
        got = vramlens.diff(fixture("sample.pickle"), fixture("sample.pickle"))
        self.assertEqual(got, direct("diff", fixture("sample.pickle"),
                                     fixture("sample.pickle"), "--json"))
        self.assertTrue(all(g["delta_bytes"] == 0 for g in got["groups"]))

    def test_check_passes_at_the_peak_and_fails_a_byte_below(self):
        peak = expected("sample.pickle")["devices"][0]["peak_allocated_bytes"]
        self.assertTrue(vramlens.check(fixture("sample.pickle"), max_peak=peak)["passed"])
        failed = vramlens.check(fixture("sample.pickle"), max_peak=peak - 1)
        self.assertFalse(failed["passed"])
        self.assertEqual(failed, direct("check", fixture("sample.pickle"), "--max-peak",
                                        str(peak - 1), "--json", ok=(1,)))

    def test_simulate_returns_the_commands_json(self):
        snap = fixture("allocator/oom_retry.pickle")
        got = vramlens.simulate(snap, alloc_conf=["expandable_segments:True"], outside=0)
        self.assertEqual(got, direct("simulate", snap, "--alloc-conf",
                                     "expandable_segments:True", "--outside", "0", "--json"))
        # Worked out by hand in scripts/gen_allocator_fixtures.py: the recorded OOM again
        # at 120 MiB, and expandable segments let it through.
        scenarios = got["devices"][0]["scenarios"]
        self.assertEqual(scenarios[0]["capacity_bytes"], 120 << 20)
        self.assertEqual(scenarios[0]["first_oom"]["cause"], "fragmentation")
        self.assertIsNone(scenarios[1]["first_oom"])

    def test_budget_and_reconcile_return_the_commands_json(self):
        got = vramlens.budget(fixture("sample.pickle"), gpus=["h100"])
        self.assertEqual(got, direct("budget", fixture("sample.pickle"), "--gpu", "h100",
                                     "--json"))
        snap, nvml = fixture("gpu/oom/oom_snapshot.pickle"), fixture("gpu/oom/nvml.jsonl")
        got = vramlens.reconcile(snap, nvml=nvml)
        self.assertEqual(got, direct("reconcile", snap, "--nvml", nvml, "--json"))

    def test_export_writes_the_tables(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "tables")
            self.assertEqual(vramlens.export(fixture("sample.pickle"), out, format="jsonl"), out)
            written = sorted(p.relative_to(out).parts[0]
                             for p in pathlib.Path(out).rglob("*.jsonl"))
            self.assertIn("lifetimes", written)
            # Again into the same dataset: its own rows replaced, not added.
            files = sorted(str(p) for p in pathlib.Path(out).rglob("*.jsonl"))
            vramlens.export(fixture("sample.pickle"), out, format="jsonl")
            self.assertEqual(sorted(str(p) for p in pathlib.Path(out).rglob("*.jsonl")), files)
            # A folder holding what export did not write is refused.
            pathlib.Path(out, "notes.txt").write_text("mine")
            with self.assertRaises(vramlens.VramlensError):
                vramlens.export(fixture("sample.pickle"), out, format="jsonl")

    def test_report_shows_inline_in_a_notebook(self):
        r = vramlens.report(fixture("sample.pickle"))
        self.assertTrue(r.html.startswith("<!DOCTYPE html>"))
        peak = expected("sample.pickle")["devices"][0]["peak_requested_bytes"]
        self.assertIn(f'data-peak-requested-bytes="{peak}"', r.html)
        shown = r._repr_html_()
        self.assertTrue(shown.startswith('<iframe srcdoc="&lt;!DOCTYPE html&gt;'), shown[:80])
        self.assertNotIn("<script>", shown)
        with tempfile.TemporaryDirectory() as tmp:
            page = os.path.join(tmp, "r.html")
            kept = vramlens.report(fixture("sample.pickle"), output=page)
            self.assertEqual(kept.path, page)
            self.assertEqual(kept.html, r.html)

    def test_report_redacts_on_request(self):
        # The sample's frames live under /home/alice (testdata/README.md): the plain page
        # shows the folder, the redacted one neither the folder nor the name, and the same
        # peak.
        plain = vramlens.report(fixture("sample.pickle"))
        redacted = vramlens.report(fixture("sample.pickle"), redact=True)
        self.assertIn("/home/alice/", plain.html)
        self.assertNotIn("/home/", redacted.html)
        self.assertNotIn("alice", redacted.html)
        peak = expected("sample.pickle")["devices"][0]["peak_requested_bytes"]
        self.assertIn(f'data-peak-requested-bytes="{peak}"', redacted.html)


if __name__ == "__main__":
    unittest.main()
