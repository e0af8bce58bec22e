"""vramlens from Python: the reports of the vramlens command as Python objects.

    import vramlens
    s = vramlens.summary("snapshot.pickle")
    s["devices"][0]["peak_allocated_bytes"]
    vramlens.top("snapshot.pickle", at="peak", by="callsite")
    vramlens.oom("oom_snapshot.pickle", log="train.log")["analyses"][0]["verdicts"]
    vramlens.budget(["run.pickle"], gpus=["h100", "a100-40gb"])
    vramlens.report("snapshot.pickle")      # shows inline in a notebook

Each call runs the vramlens binary that came with this package with `--json` and returns
the parsed JSON documented in docs/json.md (dicts, lists, ints, strings). The snapshot is
read by vramlens' own data-only reader in another process: nothing in the file is ever
unpickled or run in this interpreter. A file vramlens refuses raises VramlensError with
its one-line message.

A parameter that takes several values (`paths`, `gpus`, `nvml`, `alloc_conf`) takes a list
or tuple of them, or one value alone (`gpus="h100"` is `gpus=["h100"]`); any other type
raises TypeError. `oom()` of several snapshots returns a list of dicts, one per file in
the order given; of one (or of a log alone), a dict.

The binary is looked up in this order: the VRAMLENS_BINARY environment variable; the
scripts folder beside the package (`pip install --target DIR` puts it in DIR/bin); the
interpreter's scripts folder (a virtual environment's bin/, where pip puts it); the user
scripts folder (`pip install --user`); then PATH.

The capture helper is the submodule vramlens.capture (`python -m vramlens.capture`).
"""

import json
import os
import shutil
import subprocess
import sysconfig

__all__ = ["VramlensError", "Report", "summary", "top", "oom", "diff", "check", "budget",
           "reconcile", "export", "report", "find_binary"]

_EXE = "vramlens" + (sysconfig.get_config_var("EXE") or "")


class VramlensError(Exception):
    """vramlens refused the input: `message` is its one-line error (file, place, what was
    expected), `returncode` its exit status and `stderr` all it printed."""

    def __init__(self, message, returncode, stderr=""):
        super().__init__(message)
        self.message = message
        self.returncode = returncode
        self.stderr = stderr


def _user_scripts():
    try:
        scheme = sysconfig.get_preferred_scheme("user")  # Python 3.10+
    except AttributeError:
        scheme = "nt_user" if os.name == "nt" else "posix_user"
    try:
        return sysconfig.get_path("scripts", scheme)
    except KeyError:
        return None


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(os.path.dirname(here), "bin", _EXE)
    yield os.path.join(sysconfig.get_path("scripts"), _EXE)
    user = _user_scripts()
    if user:
        yield os.path.join(user, _EXE)


def find_binary():
    """The path of the vramlens executable this package runs (see the module docstring);
    FileNotFoundError when there is none."""
    override = os.environ.get("VRAMLENS_BINARY")
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise FileNotFoundError(f"VRAMLENS_BINARY={override} is not an executable file")
    for path in _candidates():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which("vramlens")
    if found:
        return found
    raise FileNotFoundError(
        "the vramlens executable was not found beside the package, in "
        f"{sysconfig.get_path('scripts')} or on PATH; reinstall with `pip install vramlens` "
        "or set VRAMLENS_BINARY")


def _error_message(stderr, returncode):
    for line in stderr.splitlines():
        line = line.strip()
        if line:
            for prefix in ("vramlens: error: ", "error: "):
                if line.startswith(prefix):
                    return line[len(prefix):]
            return line
    return f"vramlens exited with status {returncode} and printed no error"


def _run(args, ok=(0,)):
    """Runs `vramlens ARGS`; its standard output, or VramlensError for any exit status
    not in `ok`."""
    proc = subprocess.run([find_binary(), *args], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr = proc.stderr.decode("utf-8", "replace")
    if proc.returncode not in ok:
        raise VramlensError(_error_message(stderr, proc.returncode), proc.returncode, stderr)
    return proc.stdout.decode("utf-8")


def _run_json(args, ok=(0,)):
    """Runs `vramlens ARGS` and returns its one JSON object."""
    objects = _run_json_all(args, ok)
    if len(objects) != 1:
        raise VramlensError(f"expected one JSON object from vramlens, found {len(objects)}",
                            2)
    return objects[0]


def _run_json_all(args, ok=(0,)):
    """Runs `vramlens ARGS` and returns every JSON object it printed, in order (a command
    given several files prints one object per file)."""
    text = _run(args, ok)
    decoder = json.JSONDecoder()
    objects, at = [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return objects
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as e:
            raise VramlensError(f"expected JSON objects from vramlens, found text that is not "
                                f"JSON at line {e.lineno} ({e.msg})", 2) from None
        objects.append(value)


def _one_file(path):
    """PATH as vramlens reads it as one file: a folder is refused (the commands give one
    object per file there), and a file named `-` is passed as `./-` (vramlens reads `-` as
    standard input)."""
    p = os.fspath(path)
    if os.path.isdir(p):
        raise VramlensError(f"{p}: is a folder; expected one snapshot file (call the "
                            "function on each file of it)", 2)
    return os.path.join(".", p) if p == "-" else p


def _values(name, values, kinds, what):
    """A parameter that takes several values: a list or tuple of them, or one alone (a
    string is one value, never its characters); None is none. Each value must be one of
    `kinds` (`what` says which in words); anything else is a TypeError naming the
    parameter."""
    if values is None:
        return []
    if isinstance(values, kinds) and not isinstance(values, bool):
        values = [values]
    elif not isinstance(values, (list, tuple)):
        raise TypeError(f"{name}: expected {what} or a list of them, found "
                        f"{type(values).__name__}")
    for v in values:
        if not isinstance(v, kinds) or isinstance(v, bool):
            raise TypeError(f"{name}: expected a list of {what}s, found an item of type "
                            f"{type(v).__name__}")
    return list(values)


# A file's path; a value given on the command line (a GPU name or size, a setting).
_PATH = ((str, bytes, os.PathLike), "path")
_VALUE = ((str, os.PathLike, int, float), "string")


def _paths(paths, name="paths"):
    """One path or several, as strings (a file named `-` as `./-`)."""
    return [os.path.join(".", p) if p == "-" else p
            for p in map(os.fsdecode, _values(name, paths, *_PATH))]


def _opt(args, flag, value):
    if value is not None:
        args += [flag, str(value)]


def _opts(args, flag, values, name):
    for v in _values(name, values, *_VALUE):
        args += [flag, os.fspath(v) if isinstance(v, os.PathLike) else str(v)]


def summary(path, device=None):
    """`vramlens summary PATH --json [--device N]`: one snapshot's per-device totals, peaks,
    trace coverage, OOM events, allocator settings and warnings, as a dict (schema in
    docs/json.md)."""
    args = ["summary", "--json"]
    if device is not None:
        args += ["--device", str(int(device))]
    return _run_json([*args, "--", _one_file(path)])


def top(path, at="peak", by="callsite"):
    """`vramlens top PATH --at AT --by BY --json`: what was live at a moment (`peak`, `oom`,
    `event:N`, `time:T`), grouped (`callsite`, ...), as a dict (schema in docs/json.md)."""
    return _run_json(["top", "--at", str(at), "--by", str(by), "--json", "--",
                      _one_file(path)])



def oom(paths=None, log=None, device_total=None, device=None):
    """`vramlens oom [PATH...] [--log FILE] [--device-total SIZE] --json`: each OOM's request,
    what was live and free, and the verdicts with their evidence, as a dict; of several
    snapshots, a list of such dicts, one per file in the order given. `paths` may be
    omitted when a `log` with the OOM message is given; `device_total` is a byte count or
    a size such as "80GiB"."""
    args = ["oom", "--json"]
    _opt(args, "--log", os.fspath(log) if log is not None else None)
    _opt(args, "--device-total", device_total)
    _opt(args, "--device", None if device is None else int(device))
    files = _paths(paths)
    objects = _run_json_all([*args, "--", *files])
    if len(files) > 1:
        return objects
    if len(objects) != 1:
        raise VramlensError(f"expected one JSON object from vramlens, found {len(objects)}",
                            2)
    return objects[0]


def diff(base, new, at="peak", by="callsite", device=None):
    """`vramlens diff BASE NEW --at AT --by BY --json`: what changed between two snapshots
    at a moment, by group, as a dict."""
    args = ["diff", "--json", "--at", str(at), "--by", str(by)]
    _opt(args, "--device", None if device is None else int(device))
    return _run_json([*args, "--", _one_file(base), _one_file(new)])


def check(path, max_peak=None, baseline=None, tolerance=None, metric=None, device=None):
    """`vramlens check PATH --json`: the gate's result as a dict; `result["passed"]` is
    False when the peak is over `max_peak` (a byte count or a size such as "20GiB") or over
    the `baseline` snapshot's peak by more than `tolerance` percent. A failed check is a
    result, not an exception."""
    args = ["check", "--json"]
    _opt(args, "--max-peak", max_peak)
    _opt(args, "--baseline", os.fspath(baseline) if baseline is not None else None)
    _opt(args, "--tolerance", tolerance)
    _opt(args, "--metric", metric)
    _opt(args, "--device", None if device is None else int(device))
    return _run_json([*args, "--", _one_file(path)], ok=(0, 1))


def budget(paths, gpus=None, headroom=None, vary=None, sizes=None, target=None, nvml=None,
           log=None, device=None):
    """`vramlens budget PATH... --json`: what each run needs at its peak, part by part,
    which GPUs take it with the headroom (percent), and for a series (`vary` "batch" or
    "seq", `sizes` a dict of path to size) the fit and the budget at `target`, as a dict."""
    args = ["budget", "--json"]
    _opts(args, "--gpu", gpus, "gpus")
    _opt(args, "--headroom", headroom)
    _opt(args, "--vary", vary)
    if sizes is not None and not isinstance(sizes, dict):
        raise TypeError(f"sizes: expected a dict of path to size, found "
                        f"{type(sizes).__name__}")
    for path, size in (sizes or {}).items():
        args += ["--size", f"{os.fspath(path)}={size}"]
    _opt(args, "--target", target)
    _opts(args, "--nvml", _paths(nvml, "nvml"), "nvml")
    _opt(args, "--log", os.fspath(log) if log is not None else None)
    _opt(args, "--device", None if device is None else int(device))
    return _run_json([*args, "--", *_paths(paths)])


def simulate(path, gpus=None, alloc_conf=None, outside=None, torch=None, min_capacity=True,
             nvml=None, log=None, device=None):
    """`vramlens simulate PATH --json`: the recorded requests replayed through a model of
    the caching allocator (first checked against the recording), on other GPUs (`gpus`:
    names or sizes) and under other settings (`alloc_conf`: PYTORCH_CUDA_ALLOC_CONF
    strings), as a dict."""
    args = ["simulate", "--json"]
    _opts(args, "--gpu", gpus, "gpus")
    _opts(args, "--alloc-conf", alloc_conf, "alloc_conf")
    _opt(args, "--outside", outside)
    _opt(args, "--torch", torch)
    if not min_capacity:
        args.append("--no-min-capacity")
    _opts(args, "--nvml", _paths(nvml, "nvml"), "nvml")
    _opt(args, "--log", os.fspath(log) if log is not None else None)
    _opt(args, "--device", None if device is None else int(device))
    return _run_json([*args, "--", _one_file(path)])


def reconcile(path, nvml, trace=None, utc_offset=None, gpu=None, device=None):
    """`vramlens reconcile PATH --nvml LOG... --json`: PyTorch's figures against the
    device's readings (nvidia-smi CSV or NVML lines) at the peak, each OOM and the end,
    as a dict."""
    args = ["reconcile", "--json"]
    _opts(args, "--nvml", _paths(nvml, "nvml"), "nvml")
    _opt(args, "--trace", os.fspath(trace) if trace is not None else None)
    _opt(args, "--utc-offset", utc_offset)
    _opt(args, "--gpu", gpu)
    _opt(args, "--device", None if device is None else int(device))
    return _run_json([*args, "--", _one_file(path)])


def export(paths, output, format="parquet", events=False, force=False):
    """`vramlens export PATH... -o OUTPUT`: the tables (Parquet or JSON Lines, see
    docs/export.md) written under `output`; returns `output`. Nothing is overwritten
    unless `force`."""
    args = ["export", "-o", os.fspath(output), "--format", str(format)]
    if events:
        args.append("--events")
    if force:
        args.append("--force")
    _run([*args, "--", *_paths(paths)])
    return output


class Report:
    """A report page: `html` is its text, `path` the file it was written to. In a
    notebook it shows inline (in a frame of its own, so its style and script stay
    apart from the notebook's)."""

    def __init__(self, path, html):
        self.path = path
        self.html = html

    def _repr_html_(self):
        import html as _html
        return ('<iframe srcdoc="' + _html.escape(self.html, quote=True) +
                '" style="width:100%;height:900px;border:1px solid #ddd" '
                'sandbox="allow-scripts"></iframe>')

    def __repr__(self):
        return f"Report({self.path!r}, {len(self.html)} characters)"


def report(paths, output=None, nvml=None, trace=None, log=None, device_total=None,
           device=None, force=False, redact=False):
    """`vramlens report PATH... -o OUTPUT`: the self-contained HTML report, as a Report
    (shown inline by a notebook). Without `output` it is written to a temporary file that
    is removed once read. `redact=True` is `--redact`: what the page shows of the
    snapshots' strings is redacted by the rules of `vramlens redact` (docs/redaction.md),
    every number kept."""
    import tempfile
    args = ["report"]
    if redact:
        args.append("--redact")
    _opts(args, "--nvml", _paths(nvml, "nvml"), "nvml")
    _opt(args, "--trace", os.fspath(trace) if trace is not None else None)
    _opt(args, "--log", os.fspath(log) if log is not None else None)
    _opt(args, "--device-total", device_total)
    _opt(args, "--device", None if device is None else int(device))
    if force:
        args.append("--force")
    if output is not None:
        _run([*args, "-o", os.fspath(output), "--", *_paths(paths)])
        with open(output, encoding="utf-8") as f:
            return Report(os.fspath(output), f.read())
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "report.html")
        _run([*args, "-o", page, "--", *_paths(paths)])
        with open(page, encoding="utf-8") as f:
            return Report(None, f.read())
