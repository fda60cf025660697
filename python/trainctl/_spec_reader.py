"""Reading a composed job.yaml into a trainctl.v1.JobSpec (trainctl.jobspec's
reader): the limits, SpecError, the field helpers (enum names, "did you
mean", byte quantities) and _Reader, which walks the document against the
proto's descriptors and collects every problem with its position.

Private: import the public names (SpecError, parse_byte_quantity, the
limits) from trainctl.jobspec. Pure functions; thread-safe.
"""

import collections
import math
import re

import yaml
from google.protobuf.descriptor import FieldDescriptor

# Limits that keep hostile input harmless (common/jobspec/job_spec.h,
# spec_fields.h); the file's size and the error count are jobspec's.
MAX_SEQUENCE_LENGTH = 64
MAX_STRING_BYTES = 4096

# Messages whose YAML form names the chosen oneof member with this key.
_DISCRIMINATORS = {
    "trainctl.v1.ModelSpec": "name",
    "trainctl.v1.DatasetSpec": "format",
}

_NULL_TAG = "tag:yaml.org,2002:null"
_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"

_INT_TYPES = (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_NOT_FINITE = re.compile(r"[+-]?(inf|infinity|nan)", re.IGNORECASE)

# The label of errors in an override (the CLI says "--set").
OVERRIDE_LABEL = "override"


class SpecError(collections.namedtuple("SpecError", "file line column field message")):
    """One problem with a job spec; line and column are 1-based, 0 without a position."""

    def __str__(self):
        out = ""
        if self.file:
            out += self.file + ":"
            if self.line > 0:
                out += "%d:%d:" % (self.line, self.column)
            out += " "
        if self.field:
            out += self.field + ": "
        return out + self.message


def _is_null(node):
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG and not node.style


def _node_kind(node):
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if _is_null(node):
        return "nothing"
    return "a scalar"


def _lookup(mapping, key):
    for k, v in mapping.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return None


def _enum_prefix(enum_type):
    zero = enum_type.values[0].name
    return zero[:len(zero) - len("UNSPECIFIED")]


def _enum_choices(enum_type):
    prefix = _enum_prefix(enum_type)
    return [v.name[len(prefix):].lower() for v in enum_type.values[1:]]


def _edit_distance(a, b):
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
        prev = cur
    return prev[len(b)]


def _did_you_mean(got, candidates):
    """"; did you mean 'x'?" when one candidate is close enough, else ""."""
    best, best_distance = "", None
    for c in candidates:
        d = _edit_distance(got.lower(), c)
        if best_distance is None or d < best_distance:
            best, best_distance = c, d
    if not best or best_distance == 0:
        return ""
    close = best_distance <= 2 or best_distance * 3 <= len(got) or (got and best.startswith(got.lower()))
    return "; did you mean '%s'?" % best if close else ""


def _quote(s):
    return "'%s...'" % s[:37] if len(s) > 40 else "'%s'" % s


# Byte suffixes of job.yaml quantities (common/jobspec/spec_fields.h's
# ParseByteQuantity), the first that ends the text wins.
_BYTE_SUFFIXES = (("Ki", 1024.0), ("Mi", 1048576.0), ("Gi", 1073741824.0), ("Ti", 1099511627776.0),
                  ("k", 1e3), ("K", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12))


def _is_byte_quantity_field(field):
    """Fields written as a byte quantity in job.yaml (resources.memory)."""
    return (field.containing_type is not None and field.containing_type.full_name == "trainctl.v1.ResourceSpec"
            and field.name == "memory" and not _is_repeated(field))


def parse_byte_quantity(text):
    """"512Mi" -> 536870912, as Kubernetes writes quantities: plain bytes, or
    an integer or decimal number with Ki Mi Gi Ti (powers of 1024) or K M G T
    (powers of 1000; k too). None for anything else, a negative value, or
    one past 2**63 - 1 bytes."""
    number, factor = text, 1.0
    for suffix, f in _BYTE_SUFFIXES:
        if text.endswith(suffix):
            number, factor = text[:-len(suffix)], f
            break
    if not number or any(c not in "0123456789." for c in number):
        return None
    if factor == 1.0 and "." not in number:
        value = int(number)
        return value if value < 1 << 63 else None
    try:
        value = float(number)
    except ValueError:
        return None
    if not math.isfinite(value) or value * factor >= 9223372036854775808.0:
        return None
    return int(math.floor(value * factor))


def _is_map_field(field):
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _is_repeated(field):
    return field.label == FieldDescriptor.LABEL_REPEATED


class _Reader:
    """Reads a composed job.yaml into a JobSpec, collecting every problem."""

    def __init__(self, file, override_paths, errors):
        self.file = file
        self.override_paths = override_paths
        self.errors = errors

    def error(self, node, path, message):
        mark = node.start_mark if node is not None else None
        for o in self.override_paths:
            # The overridden value and what is under it, or a key that only
            # the override created (it has no place in the file).
            if (path == o or path.startswith(o + ".") or path.startswith(o + "[")
                    or (mark is None and o.startswith(path + "."))):
                self.errors.append(SpecError(OVERRIDE_LABEL, 0, 0, path, message))
                return
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        self.errors.append(SpecError(self.file, line, column, path, message))

    @staticmethod
    def join(path, key):
        return key if not path else path + "." + key

    def read_message(self, node, path, msg):
        if _is_null(node):
            return  # `training:` with nothing under it: all defaults.
        if not isinstance(node, yaml.MappingNode):
            self.error(node, path, "must be a mapping, got %s" % _node_kind(node))
            return
        disc = _DISCRIMINATORS.get(msg.DESCRIPTOR.full_name)
        target = msg
        if disc is not None:
            target = self.select_oneof_member(node, path, msg, disc)
            if target is None:
                return
        desc = target.DESCRIPTOR
        known = ([disc] if disc else []) + [f.name for f in desc.fields]
        seen = {}
        for key, value in self.named_entries(node, path):
            k = key.value
            child = self.join(path, k)
            if k in seen:
                self.error(key, child, "duplicate key (first at line %d)" % (seen[k].line + 1))
                continue
            seen[k] = key.start_mark
            if disc is not None and k == disc:
                continue
            field = desc.fields_by_name.get(k)
            if field is None:
                where = " in " + path if path else ""
                hint = _did_you_mean(k, known) or self.nested_hint(desc, k)
                self.error(key, child, "unknown key%s%s" % (where, hint))
                continue
            self.read_field(value, child, target, field)

    def named_entries(self, node, path):
        """(key, value) of a mapping whose key is a plain name; any other key is an error."""
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode) or _is_null(key):
                self.error(key, path, "keys must be plain names, got %s" % _node_kind(key))
                continue
            yield key, value

    @staticmethod
    def nested_hint(desc, key):
        """"; did you mean 'optimizer.lr'?" when ``key`` is a field one level down."""
        for f in desc.fields:
            sub = f.message_type
            if sub is None or sub.full_name in _DISCRIMINATORS or sub.GetOptions().map_entry:
                continue
            if key in sub.fields_by_name:
                return "; did you mean '%s.%s'?" % (f.name, key)
        return ""

    def select_oneof_member(self, node, path, msg, disc):
        """Sets and returns the oneof member node[disc] names; None on error."""
        choices = [f.name for f in msg.DESCRIPTOR.fields]
        disc_path = self.join(path, disc)
        value = _lookup(node, disc)
        if value is None:
            self.error(node, disc_path, "required: one of " + ", ".join(choices))
            return None
        if not isinstance(value, yaml.ScalarNode) or _is_null(value):
            self.error(value, disc_path, "must be one of %s, got %s" % (", ".join(choices), _node_kind(value)))
            return None
        member = msg.DESCRIPTOR.fields_by_name.get(value.value)
        if member is None or member.message_type is None:
            self.error(value, disc_path, "must be one of %s, got %s%s" % (
                ", ".join(choices), _quote(value.value), _did_you_mean(value.value, choices)))
            return None
        target = getattr(msg, member.name)
        target.SetInParent()
        return target

    def read_field(self, value, path, msg, field):
        if _is_map_field(field):
            self.read_string_map(value, path, msg, field)
        elif _is_repeated(field):
            if self.open_collection(value, path, yaml.SequenceNode, "a list"):
                for i, element in enumerate(value.value):
                    self.read_scalar(element, "%s[%d]" % (path, i), msg, field)
        elif field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            sub = getattr(msg, field.name)
            sub.SetInParent()
            self.read_message(value, path, sub)
        else:
            self.read_scalar(value, path, msg, field)

    def open_collection(self, value, path, node_type, shape):
        """A list or mapping of at most MAX_SEQUENCE_LENGTH entries; False when
        there is nothing to read (null, or an error)."""
        if _is_null(value):
            return False
        if not isinstance(value, node_type):
            self.error(value, path, "must be %s, got %s" % (shape, _node_kind(value)))
            return False
        if len(value.value) > MAX_SEQUENCE_LENGTH:
            self.error(value, path, "at most %d entries, got %d" % (MAX_SEQUENCE_LENGTH, len(value.value)))
            return False
        return True

    def read_string_map(self, value, path, msg, field):
        """A map<string, string> field (command.env) from a mapping of scalars."""
        if not self.open_collection(value, path, yaml.MappingNode, "a mapping of NAME: value"):
            return
        target = getattr(msg, field.name)
        seen = set()
        for k, v in self.named_entries(value, path):
            child = "%s.%s" % (path, k.value)
            if k.value in seen:
                self.error(k, child, "duplicate key")
                continue
            seen.add(k.value)
            if not isinstance(v, yaml.ScalarNode) or _is_null(v):
                self.error(v, child, "must be a string, got %s" % _node_kind(v))
                continue
            if len(v.value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES or \
                    len(k.value.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
                self.error(v, child, "at most %d bytes" % MAX_STRING_BYTES)
                continue
            target[k.value] = v.value

    @staticmethod
    def expected(field):
        if field.cpp_type in _INT_TYPES:
            return "an integer"
        return {FieldDescriptor.CPPTYPE_DOUBLE: "a number", FieldDescriptor.CPPTYPE_BOOL: "true or false",
                FieldDescriptor.CPPTYPE_ENUM: "one of"}.get(field.cpp_type, "a string")

    def type_error(self, node, path, field, extra=""):
        quoted = "the string " if node.style else ""
        self.error(node, path, "must be %s, got %s%s%s" % (self.expected(field), quoted, _quote(node.value), extra))

    def read_scalar(self, node, path, msg, field):
        """Converts one scalar into ``field`` (appending when repeated)."""
        if _is_null(node):
            self.error(node, path, "missing value")
            return
        if not isinstance(node, yaml.ScalarNode):
            if field.cpp_type == FieldDescriptor.CPPTYPE_ENUM:
                what = "one of " + ", ".join(_enum_choices(field.enum_type))
            else:
                what = self.expected(field)
            self.error(node, path, "must be %s, got %s" % (what, _node_kind(node)))
            return
        # A quoted scalar ("5" rather than 5) is a string whatever it looks like.
        text, quoted = node.value, bool(node.style)
        cpp = field.cpp_type
        if cpp in _INT_TYPES:
            value = self.integer(node, path, field, text, quoted)
        elif cpp == FieldDescriptor.CPPTYPE_DOUBLE:
            value = None
            if quoted or not (_DECIMAL.fullmatch(text) or _NOT_FINITE.fullmatch(text)):
                self.type_error(node, path, field)
            elif not math.isfinite(float(text)):
                self.type_error(node, path, field, " (must be finite)")
            else:
                value = float(text)
        elif cpp == FieldDescriptor.CPPTYPE_BOOL:
            value = None
            if not quoted and text in ("true", "True", "TRUE"):
                value = True
            elif not quoted and text in ("false", "False", "FALSE"):
                value = False
            else:
                self.type_error(node, path, field)
        elif cpp == FieldDescriptor.CPPTYPE_ENUM:
            value = self.enum(node, path, field, text)
        elif cpp == FieldDescriptor.CPPTYPE_STRING:
            value = None
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > MAX_STRING_BYTES:
                self.error(node, path, "at most %d bytes, got %d" % (MAX_STRING_BYTES, size))
            else:
                value = text
        else:
            self.error(node, path, "not supported in job.yaml")
            value = None
        if value is None:
            return
        if _is_repeated(field):
            getattr(msg, field.name).append(value)
        else:
            setattr(msg, field.name, value)

    def integer(self, node, path, field, text, quoted):
        if _is_byte_quantity_field(field):
            # `memory: 4Gi` (quoted or not), as common/jobspec reads it.
            value = parse_byte_quantity(text)
            if value is None:
                self.error(node, path, "must be a byte quantity (bytes, or a number with Ki, Mi, Gi, Ti, K, M, G "
                                       "or T: 512Mi, 4Gi), got %s" % _quote(text))
            return value
        if field.cpp_type == FieldDescriptor.CPPTYPE_UINT64:
            if quoted or text.startswith("-") or not _INTEGER.fullmatch(text) or int(text) >= 1 << 64:
                self.type_error(node, path, field, " (must not be negative)" if text.startswith("-") else "")
                return None
            return int(text)
        if quoted or not _INTEGER.fullmatch(text) or not -(1 << 63) <= int(text) < 1 << 63:
            extra = ""
            if not quoted and _DECIMAL.fullmatch(text) and float(text) == math.floor(float(text)) \
                    and math.isfinite(float(text)):
                extra = " (out of range)"
            self.type_error(node, path, field, extra)
            return None
        value = int(text)
        if field.cpp_type == FieldDescriptor.CPPTYPE_INT32 and not -(1 << 31) <= value < 1 << 31:
            self.type_error(node, path, field, " (out of range)")
            return None
        return value

    def enum(self, node, path, field, text):
        enum_type = field.enum_type
        choices = _enum_choices(enum_type)
        value = enum_type.values_by_name.get(_enum_prefix(enum_type) + text.upper())
        if value is None or value.number == 0:
            self.error(node, path, "must be one of %s, got %s%s" % (
                ", ".join(choices), _quote(text), _did_you_mean(text, choices)))
            return None
        return value.number
