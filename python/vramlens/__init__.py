"""vramlens from Python: the reports of the vramlens command as Python objects.

    import vramlens
    s = vramlens.summary("snapshot.pickle")
    s["devices"][0]["peak_allocated_bytes"]
    vramlens.top("snapshot.pickle", at="peak", by="callsite")

Each call runs the vramlens binary that came with this package with `--json` and returns
the parsed JSON documented in docs/json.md (dicts, lists, ints, strings). The snapshot is
read by vramlens' own data-only reader in another process: nothing in the file is ever
unpickled or run in this interpreter. A file vramlens refuses raises VramlensError with
its one-line message.

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

__all__ = ["VramlensError", "summary", "top", "find_binary"]

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


def _run_json(args):
    """Runs `vramlens ARGS` and returns its one JSON object."""
    proc = subprocess.run([find_binary(), *args], stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr = proc.stderr.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise VramlensError(_error_message(stderr, proc.returncode), proc.returncode, stderr)
    text = proc.stdout.decode("utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        lines = len(text.splitlines())
        raise VramlensError(f"expected one JSON object from vramlens, found {lines} lines "
                            f"({e.msg})", 2, stderr) from None


def _one_file(path):
    """PATH as vramlens reads it as one file: a folder is refused (the commands give one
    object per file there), and a file named `-` is passed as `./-` (vramlens reads `-` as
    standard input)."""
    p = os.fspath(path)
    if os.path.isdir(p):
        raise VramlensError(f"{p}: is a folder; expected one snapshot file (call the "
                            "function on each file of it)", 2)
    return os.path.join(".", p) if p == "-" else p


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

