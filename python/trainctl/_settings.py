"""Where the client finds its coordinator, token and CA (internal; the rule
is trainctl/client.py's docstring), and the JobSpec of ``trainctl submit
SCRIPT`` (script_job_spec). Both are importable from trainctl.client.
"""

import os

import yaml

from trainctl import jobspec
from trainctl._transport import _invalid
from trainctl.v1 import job_pb2

DEFAULT_COORDINATOR = "localhost:7070"


def config_file_path(environ=None):
    """$XDG_CONFIG_HOME (or $HOME/.config)/trainctl/config.yaml; "" without either."""
    environ = os.environ if environ is None else environ
    config_dir = environ.get("XDG_CONFIG_HOME", "")
    if not config_dir and environ.get("HOME"):
        config_dir = environ["HOME"] + "/.config"
    return config_dir + "/trainctl/config.yaml" if config_dir else ""


# Scalars as text, as yaml-cpp reads them (`token: 12345` is "12345").
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _is_null(node):
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null" and not node.style


def _config_value(key, environ):
    """One scalar key of the config file ("" when the file or key is absent);
    a malformed file is an INVALID_ARGUMENT naming path:line:col."""
    path = config_file_path(environ)
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return ""
    try:
        doc = yaml.compose(text, Loader=_YAML_LOADER)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = "%d:%d" % (mark.line + 1, mark.column + 1) if mark else "1:1"
        raise _invalid("%s:%s: %s" % (path, where, e.problem or e.context))
    if doc is None or _is_null(doc):
        return ""
    if not isinstance(doc, yaml.MappingNode):
        raise _invalid("%s: expected a mapping such as `coordinator: host:port`" % path)
    node = next((v for k, v in doc.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
    if node is None:
        return ""
    if not isinstance(node, yaml.ScalarNode) or _is_null(node) or not node.value:
        raise _invalid("%s:%d:%d: %s: %s" % (
            path, node.start_mark.line + 1, node.start_mark.column + 1, key,
            "expected host:port" if key == "coordinator" else "expected a string"))
    return node.value


def _setting(given, env_names, key, environ):
    """``given``, else the first non-empty $env_name, else the config file's ``key``, else ""."""
    if given:
        return given
    for name in env_names:
        if environ.get(name):
            return environ[name]
    return _config_value(key, environ)


def resolve_settings(address=None, token=None, ca=None, environ=None):
    """(address, token, ca_file) as the trainctl CLI resolves them (client/cli/cli.cc)."""
    environ = os.environ if environ is None else environ
    address = _setting(address, ("TRAINCTL_COORDINATOR", "TRAINCTL_ADDRESS"), "coordinator", environ)
    token = _setting(token, ("TRAINCTL_TOKEN",), "token", environ)
    ca = _setting(ca, ("TRAINCTL_CA",), "ca", environ)
    return address or DEFAULT_COORDINATOR, token, ca


# --- a script as a command job -----------------------------------------------


def _script_job_name(script):
    """The job's name from the program's, as the CLI makes it (client/cli/
    script_job.cc): "train_DDP.py" -> "train-ddp"; "script" when nothing is left."""
    name = ""
    for c in os.path.splitext(os.path.basename(script))[0]:
        if len(name) >= 40:
            break
        c = c.lower()
        if "a" <= c <= "z" or "0" <= c <= "9":
            name += c
        elif name and not name.endswith("-"):
            name += "-"
    return name.rstrip("-") or "script"


def _count(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid("%s: must be an integer >= 1, got %r" % (what, value))
    return value


def _text(value, what):
    """A str, or a number written out (argv and env are strings)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise _invalid("%s: must be a string, got %s %r" % (what, type(value).__name__, value))


def script_job_spec(script, args=(), *, nproc_per_node=1, nnodes=1, working_dir=".", python=None, env=None,
                    name=None, queue=None, max_restarts=None, priority=None, cpus=None, memory=None, pids=None,
                    wait_for_capacity=False, max_runtime_s=None, overrides=None):
    """The JobSpec ``trainctl submit --nproc-per-node N SCRIPT -- ARGS``
    sends (client/cli/script_job.cc's ScriptJobSpec), read back through the
    job.yaml reader so it is checked as any job.yaml is (INVALID_ARGUMENT,
    one line per problem). Client.submit_script submits it.

    script: the program, relative to ``working_dir`` or absolute; a .py file
        runs as ``PYTHON SCRIPT ARGS``, anything else as ``SCRIPT ARGS``.
    args: the program's arguments (a list; numbers are written out).
    nproc_per_node, nnodes: ranks per node and nodes, as torchrun's;
        world_size = nproc_per_node * nnodes; nnodes > 1 puts the job on
        exactly nnodes workers, nproc_per_node on each (scheduling.nodes).
    working_dir: where every rank starts (command.working_dir), made
        absolute here (the CLI uses the current directory). Workers must see
        it and the script there: a shared filesystem, or a worker on this host.
        (This builder sends nothing: Client.submit_script uploads the
        directory instead unless upload=False.)
    python: the interpreter of a .py script (--python; default "python3").
    env: extra environment for every rank (command.env), e.g. {"OMP_NUM_THREADS": 2}.
    name: the job's name (default: the script's, "train_ddp.py" -> "train-ddp").
    queue, max_restarts, priority: queue, restart.max_restarts, priority;
        max_restarts defaults to torchrun's 0, as the CLI's (not a job.yaml's 3).
    cpus, memory, pids: resources.* limits per rank (memory: bytes or "4Gi").
    wait_for_capacity: scheduling.wait_for_capacity (--wait-for-capacity).
    max_runtime_s: scheduling.max_runtime_s (--max-runtime): past it the job
        is stopped (checkpoint first) and ends TIMEOUT.
    overrides: more job.yaml paths to values, as submit()'s (--set).
    """
    script = _text(script, "script")
    if not script:
        raise _invalid("script: empty (expected a program such as train.py)")
    if isinstance(args, (str, bytes)):
        raise _invalid("args: must be a list of arguments, got the string %r (shlex.split() it)" % (args,))
    argv_tail = [_text(a, "args[%d]" % i) for i, a in enumerate(args)]
    spec = job_pb2.JobSpec(name=_script_job_name(script) if name is None else _text(name, "name"))
    spec.world_size = _count(nproc_per_node, "nproc_per_node") * _count(nnodes, "nnodes")
    if nnodes > 1:
        # torchrun's --nnodes: exactly nnodes workers, nproc_per_node ranks each (the CLI's rule).
        spec.scheduling.nodes = nnodes
    if script.endswith(".py"):
        spec.command.argv.append(_text(python, "python") if python is not None else "python3")
    spec.command.argv.append(script)
    spec.command.argv.extend(argv_tail)
    spec.command.working_dir = os.path.abspath(_text(working_dir, "working_dir"))
    for key, value in (env or {}).items():
        spec.command.env[_text(key, "env")] = _text(value, "env.%s" % key)
    if queue is not None:
        spec.queue = _text(queue, "queue")
    # Numbers through the job.yaml reader: its checks and "4Gi".
    sets = dict(overrides or {})
    # A script restarts as under torchrun: never, unless asked (the CLI's
    # rule; overrides, as --set, come last).
    if max_restarts is None and "restart.max_restarts" not in sets:
        max_restarts = 0
    for path, value in (("restart.max_restarts", max_restarts), ("priority", priority), ("resources.cpus", cpus),
                        ("resources.memory", memory), ("resources.pids", pids),
                        ("scheduling.max_runtime_s", max_runtime_s)):
        if value is not None:
            sets[path] = value
    if wait_for_capacity:
        sets["scheduling.wait_for_capacity"] = True
    return _checked(lambda: jobspec.parse_job_yaml(jobspec.spec_to_yaml(spec), script, sets))


# --- the client --------------------------------------------------------------


def _checked(parse):
    """parse(), with a job spec's errors as INVALID_ARGUMENT (one per line)."""
    try:
        return parse()
    except jobspec.SpecErrors as e:
        raise _invalid(str(e)) from None
