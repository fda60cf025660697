"""job.yaml -> trainctl.v1.JobSpec for the Python client, and back.

The same reading as the CLI's (common/jobspec: yaml_reader.cc,
set_overrides.cc, JobSpecToYaml in spec_serialization.cc), ported so that a
Python program needs no C++: a YAML key is a proto field name, an enum value
its lower-case name without the prefix (``adam``, ``cross_entropy``), and
``model`` and ``data.train``/``data.eval`` name their kind with a key
(``model: {name: mlp, ...}``, ``train: {format: synthetic, ...}``).
Overrides (``{"training.epochs": 2}``, the CLI's ``--set``) are applied to
the document before it is read, so they are checked like values in the file.

This module checks the shape of the document (unknown keys with a "did you
mean", types, enum names, list and string limits) and reports every problem
with its position, before anything is sent. Ranges and cross-field rules
(``lr`` > 0, ``world_size`` within the elastic bounds, ...) and the defaults
are the coordinator's: it validates every submitted JobSpec with the CLI's
rules and answers INVALID_ARGUMENT naming each bad field (without a line
number, as for any gRPC client), then stores the spec with every default
filled in.

Needs PyYAML (Debian: python3-yaml) and the generated stubs; no gRPC.
Pure functions; thread-safe.
"""

import yaml
from google.protobuf.descriptor import FieldDescriptor

from trainctl._spec_reader import (MAX_SEQUENCE_LENGTH, MAX_STRING_BYTES, OVERRIDE_LABEL, SpecError, _Reader,
                                   _DISCRIMINATORS, _MAP_TAG, _NULL_TAG, _STR_TAG, _enum_prefix, _is_map_field,
                                   _is_null, _is_repeated, _lookup, _node_kind, parse_byte_quantity)
from trainctl.v1 import job_pb2

__all__ = ["MAX_JOB_YAML_BYTES", "MAX_REPORTED_ERRORS", "MAX_SEQUENCE_LENGTH", "MAX_STRING_BYTES", "OVERRIDE_LABEL",
           "SpecError", "SpecErrors", "parse_job_yaml", "parse_job_file", "parse_job_dict", "spec_to_yaml",
           "parse_byte_quantity"]

# Limits that keep hostile input harmless (common/jobspec/job_spec.h,
# spec_fields.h).
MAX_JOB_YAML_BYTES = 1 << 20
MAX_REPORTED_ERRORS = 50


class SpecErrors(ValueError):
    """A job spec that cannot be read: ``errors`` holds every problem, in
    document order; str() is one per line."""

    def __init__(self, errors):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = list(errors)


def parse_job_yaml(text, file="job.yaml", overrides=None):
    """Reads job.yaml text (and ``overrides``: {"key.path": value}) into a
    JobSpec, defaults left to the coordinator. ``file`` only labels errors.
    Raises SpecErrors."""
    overrides = _override_nodes(overrides or {})
    problem = _pre_check(text)
    root = None
    if problem is None:
        root, problem = _load_document(text, bool(overrides))
    if problem is not None:
        line, column, message = problem
        raise SpecErrors([SpecError(file, line, column, "", message)])
    errors = []
    paths = _apply_overrides(root, overrides, errors)
    spec = job_pb2.JobSpec()
    reader = _Reader(file, paths, errors)
    reader.read_message(root, "", spec)
    if errors:
        errors.sort(key=_position_key)
        if len(errors) > MAX_REPORTED_ERRORS:
            more = len(errors) - MAX_REPORTED_ERRORS
            errors = errors[:MAX_REPORTED_ERRORS] + [SpecError(file, 0, 0, "", "... and %d more errors" % more)]
        raise SpecErrors(errors)
    return spec


def parse_job_file(path, overrides=None):
    """Reads the job.yaml at ``path``; see parse_job_yaml."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_JOB_YAML_BYTES + 1)
    except OSError:
        raise SpecErrors([SpecError(str(path), 0, 0, "", "cannot read the file (no such file or no permission)")])
    if len(data) > MAX_JOB_YAML_BYTES:
        raise SpecErrors([SpecError(str(path), 1, 1, "", "the file is larger than %d bytes" % MAX_JOB_YAML_BYTES)])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecErrors([SpecError(str(path), 1, 1, "", "not valid YAML: not UTF-8 (%s)" % e.reason)])
    return parse_job_yaml(text, str(path), overrides)


def parse_job_dict(spec, overrides=None, label="<dict>"):
    """Reads a job.yaml given as a Python dict ({"name": ..., "model": {...}})."""
    return parse_job_yaml(yaml.safe_dump(spec, sort_keys=False), label, overrides)


def spec_to_yaml(spec):
    """Renders a JobSpec as job.yaml text (JobSpecToYaml): fields at their
    zero value ("default") are left out, so reading the text gives the same
    spec."""
    return yaml.safe_dump(_message_to_dict(spec), sort_keys=False, default_flow_style=None)


# --- reading -----------------------------------------------------------------


def _position_key(e):
    # File errors in document order, then override errors, then unpositioned.
    group = 0 if e.line > 0 else 1 if e.file == OVERRIDE_LABEL else 2
    return (group, e.line, e.column)


def _pre_check(text):
    """Too large or binary (common/jobspec/hostile_input.cc's checks that
    are not about yaml-cpp's own bugs)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_JOB_YAML_BYTES:
        return (1, 1, "the file is %d bytes; at most %d are read" % (size, MAX_JOB_YAML_BYTES))
    if "\0" in text:
        return (1, 1, "not a text file (it contains NUL bytes)")
    return None


def _load_document(text, have_overrides):
    """The one document of ``text`` as a MappingNode, or (None, problem)."""
    try:
        docs = []
        for doc in yaml.compose_all(text, Loader=_Loader):
            docs.append(doc)
            if len(docs) > 1:
                return None, (1, 1, "holds several YAML documents; a job.yaml holds one")
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        return None, (line, column, "not valid YAML: %s" % (e.problem or e.context))
    except yaml.YAMLError as e:
        return None, (1, 1, "not valid YAML: %s" % e)
    root = docs[0] if docs else None
    if root is None or _is_null(root):
        if not have_overrides:
            return None, (1, 1, "the file is empty; a job needs at least name, model and data.train")
        return _new_mapping(), None
    if not isinstance(root, yaml.MappingNode):
        return None, (root.start_mark.line + 1, root.start_mark.column + 1,
                      "must be a mapping of job fields, got %s" % _node_kind(root))
    return root, None


# The C loader when PyYAML has libyaml, else the pure Python one.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _new_mapping():
    return yaml.MappingNode(_MAP_TAG, [], None, None)


def _override_nodes(overrides):
    """{"a.b": value} -> [("a.b", node or None, error)]: a str is YAML text
    (as after the CLI's --set a.b=), anything else is written as YAML would."""
    out = []
    for key, value in overrides.items():
        text = value if isinstance(value, str) else yaml.safe_dump(value)
        try:
            node = yaml.compose(text, Loader=_Loader)
        except yaml.YAMLError as e:
            out.append((str(key), None, "value is not valid YAML: %s" % getattr(e, "problem", e)))
            continue
        if node is None:
            node = yaml.ScalarNode(_NULL_TAG, "", None, None)
        out.append((str(key), node, None))
    return out


def _apply_overrides(root, overrides, errors):
    """Sets each override on ``root`` (creating mappings on the way); returns the paths set."""
    paths = set()
    for path, node, problem in overrides:
        def fail(field, message):
            errors.append(SpecError(OVERRIDE_LABEL, 0, 0, field, message))
        if not path:
            fail("", "expected key.path, got ''")
            continue
        if problem:
            fail(path, problem)
            continue
        keys = path.split(".")
        if any(not k for k in keys):
            fail(path, "empty key in path")
            continue
        current = root
        ok = True
        for i, key in enumerate(keys[:-1]):
            child = _lookup(current, key)
            if child is None or _is_null(child):
                child = _new_mapping()
                _store(current, key, child)
            elif not isinstance(child, yaml.MappingNode):
                fail(path, "'%s' is not a mapping in the file" % ".".join(keys[:i + 1]))
                ok = False
                break
            current = child
        if not ok:
            continue
        _store(current, keys[-1], node)
        paths.add(path)
    return paths


def _store(mapping, key, value):
    for i, (k, _) in enumerate(mapping.value):
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            mapping.value[i] = (k, value)
            return
    mapping.value.append((yaml.ScalarNode(_STR_TAG, key, None, None), value))


# --- writing -----------------------------------------------------------------


def _set_field_names(msg):
    """Fields JobSpecToYaml writes: the set ones, and every non-map list."""
    present = {f.name for f, _ in msg.ListFields()}
    return [f for f in msg.DESCRIPTOR.fields
            if f.name in present or (_is_repeated(f) and not _is_map_field(f))]


def _value_to_yaml(msg, field):
    value = getattr(msg, field.name)
    if _is_map_field(field):
        return {k: value[k] for k in sorted(value)}
    if _is_repeated(field):
        return list(value)
    if field.cpp_type == FieldDescriptor.CPPTYPE_ENUM:
        prefix = _enum_prefix(field.enum_type)
        return field.enum_type.values_by_number[value].name[len(prefix):].lower()
    if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
        return _message_to_dict(value)
    return value


def _message_to_dict(msg):
    out = {}
    disc = _DISCRIMINATORS.get(msg.DESCRIPTOR.full_name)
    if disc is not None:
        kind = msg.WhichOneof(msg.DESCRIPTOR.oneofs[0].name)
        if kind is not None:
            out[disc] = kind
            member = getattr(msg, kind)
            for f in _set_field_names(member):
                out[f.name] = _value_to_yaml(member, f)
        return out
    for f in _set_field_names(msg):
        out[f.name] = _value_to_yaml(msg, f)
    return out
