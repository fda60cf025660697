"""A directory as one code archive, as ``trainctl submit`` packs it
(common/codepack/code_pack.cc; docs/command-jobs.md, "Code travels with the
job"): a deterministic POSIX ustar tar (sorted names, mtime 0, uid/gid 0,
modes 0644/0755 by the owner's execute bit) of the same files the C++ packer
selects. Skipped: ``.git`` (directory or file), ``__pycache__/``, ``*.pyc``
and whatever ``.gitignore``/``.trainctlignore`` files (each for its own
subtree, git's syntax and precedence) exclude. A symlink is packed as what it
names when that lies inside the directory and refused naming link and target
when it points outside; sockets, FIFOs and devices are refused.

Standard library only. Errors: ValueError with the C++ packer's message.
"""

import hashlib
import os
import re
import stat

BLOCK = 512
DEFAULT_MAX_BYTES = 64 << 20
_IGNORE_FILES = (".gitignore", ".trainctlignore")


def format_bytes(n):
    """common/format_bytes.h's FormatBytes: "10 bytes", "4 KiB", "4.9 KiB"."""
    if n < 1024:
        return "%d bytes" % n
    v, unit = float(n), -1
    units = ("KiB", "MiB", "GiB", "TiB", "PiB")
    while v >= 1024 and unit < 4:
        v /= 1024
        unit += 1
    if v == int(v):
        return "%d %s" % (int(v), units[unit])
    return "%.1f %s" % (v, units[unit])


# --- ignore files -------------------------------------------------------------


def _glob_regex(pattern):
    """fnmatch(3)'s pattern (flags FNM_PATHNAME, no FNM_NOESCAPE) as a regex
    over one path component: *, ?, [...] with ! or ^ negation, \\ escapes."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\" and i < n:
            out.append(re.escape(pattern[i]))
            i += 1
        elif c == "[":
            j = i
            if j < n and pattern[j] in "!^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            if j >= n:
                out.append("\\[")  # no closing ']': a literal '['
                continue
            body = pattern[i:j]
            i = j + 1
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            items, k = [], 0
            while k < len(body):
                if body[k] == "\\" and k + 1 < len(body):
                    items.append(re.escape(body[k + 1]))
                    k += 2
                elif k + 2 < len(body) and body[k + 1] == "-":
                    items.append("%s-%s" % (re.escape(body[k]), re.escape(body[k + 2])))
                    k += 3
                else:
                    items.append(re.escape(body[k]))
                    k += 1
            out.append("[%s%s]" % ("^/" if negate else "", "".join(items)))
        else:
            out.append(re.escape(c))
    return re.compile("".join(out) + r"\Z", re.DOTALL)


class _Rule:
    __slots__ = ("components", "negated", "dir_only", "anchored")

    def __init__(self, components, negated, dir_only, anchored):
        self.components = components  # "**" or a compiled component pattern
        self.negated = negated
        self.dir_only = dir_only
        self.anchored = anchored


def parse_ignore(text):
    """One .gitignore/.trainctlignore (code_pack.cc's ParseIgnore)."""
    rules = []
    for line in text.split("\n"):
        if line.endswith("\r"):
            line = line[:-1]
        # Trailing spaces are ignored unless escaped (git's rule).
        while line.endswith(" ") and not (len(line) >= 2 and line[-2] == "\\"):
            line = line[:-1]
        if not line or line[0] == "#":
            continue
        negated = False
        if line[0] == "!":
            negated = True
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = False
        if line.endswith("/"):
            dir_only = True
            line = line.rstrip("/")
        anchored = "/" in line
        line = line.lstrip("/")
        if not line:
            continue
        parts = [p for p in line.split("/") if p]
        rules.append(_Rule([p if p == "**" else _glob_regex(p) for p in parts], negated, dir_only, anchored))
    return rules


def _match_components(pattern, pi, path, si):
    if pi == len(pattern):
        return si == len(path)
    if pattern[pi] == "**":
        # Zero or more whole components; one or more when it ends the pattern.
        min_skip = 1 if pi + 1 == len(pattern) else 0
        return any(_match_components(pattern, pi + 1, path, si + skip)
                   for skip in range(min_skip, len(path) - si + 1))
    if si == len(path) or not pattern[pi].match(path[si]):
        return False
    return _match_components(pattern, pi + 1, path, si + 1)


def _rule_matches(rule, rel, is_dir):
    if rule.dir_only and not is_dir:
        return False
    if rule.anchored:
        return _match_components(rule.components, 0, rel, 0)
    first = rule.components[0]
    if first == "**":  # code_pack.cc hands "**" to fnmatch: '*' twice
        return "/" not in rel[-1]
    return bool(first.match(rel[-1]))


def _ignored(ignores, rel_path, is_dir):
    """Every ignore file of an ancestor, the deepest last; the last matching
    rule decides (git's precedence)."""
    ignored = False
    for base, rules in ignores:
        below = rel_path
        if base:
            if not (rel_path.startswith(base) and len(rel_path) > len(base) and rel_path[len(base)] == "/"):
                continue
            below = rel_path[len(base) + 1:]
        rel = below.split("/")
        for rule in rules:
            if _rule_matches(rule, rel, is_dir):
                ignored = not rule.negated
    return ignored


def _always_skipped(name, is_dir):
    if name == ".git":
        return True  # a directory, or a worktree's ".git" file
    if is_dir and name == "__pycache__":
        return True
    return not is_dir and name.endswith(".pyc")


# --- the walk -------------------------------------------------------------------


class Entry:
    """One archive member: ``name`` relative to the root ('/'-separated),
    ``source`` the path read (through in-tree links)."""

    __slots__ = ("name", "source", "is_dir", "executable", "size")

    def __init__(self, name, source, is_dir, executable=False, size=0):
        self.name, self.source, self.is_dir, self.executable, self.size = name, source, is_dir, executable, size


def _strerror(e):
    return os.strerror(e.errno) if e.errno else str(e)


class _Walker:
    def __init__(self, root, root_real):
        self.root, self.root_real = root, root_real
        self.entries = []

    def walk(self, dir_path, rel, ignores, ancestors):
        try:
            st = os.stat(dir_path)
        except OSError as e:
            raise ValueError("%s: %s" % (dir_path, _strerror(e))) from None
        if (st.st_dev, st.st_ino) in ancestors:
            raise ValueError("%s: a symlink loop (the directory contains itself); remove the link or ignore it"
                             % dir_path)
        ancestors = ancestors | {(st.st_dev, st.st_ino)}
        ignores = list(ignores)
        for ignore_name in _IGNORE_FILES:
            path = dir_path + "/" + ignore_name
            try:
                if not stat.S_ISREG(os.stat(path).st_mode):
                    continue
            except OSError:
                continue
            try:
                with open(path, "rb") as f:
                    text = f.read().decode("utf-8", "surrogateescape")
            except OSError:
                raise ValueError("%s: cannot read" % path) from None
            ignores.append((rel, parse_ignore(text)))
        try:
            names = sorted(os.listdir(dir_path), key=os.fsencode)
        except OSError as e:
            raise ValueError("%s: %s" % (dir_path, _strerror(e))) from None
        for name in names:
            path = dir_path + "/" + name
            child_rel = rel + "/" + name if rel else name
            try:
                st = os.lstat(path)
            except OSError as e:
                raise ValueError("%s: %s" % (path, _strerror(e))) from None
            if stat.S_ISLNK(st.st_mode):
                # An ignored link is never followed (git sees a link as a file).
                if _always_skipped(name, False) or _ignored(ignores, child_rel, False):
                    continue
                st = self._follow_link(path)
            is_dir = stat.S_ISDIR(st.st_mode)
            if _always_skipped(name, is_dir) or _ignored(ignores, child_rel, is_dir):
                continue
            if is_dir:
                self.entries.append(Entry(child_rel, path, True))
                self.walk(path, child_rel, ignores, ancestors)
            elif stat.S_ISREG(st.st_mode):
                self.entries.append(Entry(child_rel, path, False, bool(st.st_mode & stat.S_IXUSR), st.st_size))
            else:
                kind = "socket" if stat.S_ISSOCK(st.st_mode) else "FIFO" if stat.S_ISFIFO(st.st_mode) else "device"
                raise ValueError("%s: a %s cannot be packed; remove it or list it in .trainctlignore" % (path, kind))

    def _follow_link(self, path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        try:
            resolved = os.path.realpath(path, strict=True)
        except OSError as e:
            raise ValueError("symlink %s -> %s: %s; remove it or list it in .trainctlignore"
                             % (path, target, _strerror(e))) from None
        inside = self.root_real + "/" if self.root_real != "/" else "/"
        if resolved != self.root_real and not resolved.startswith(inside):
            raise ValueError(
                "symlink %s -> %s points outside %s (%s): only links inside the packed directory are followed; "
                "copy the target in, list the link in .trainctlignore, or submit with upload=False and a shared "
                "directory" % (path, target, self.root, resolved))
        try:
            return os.stat(resolved)
        except OSError as e:
            raise ValueError("%s: %s" % (path, _strerror(e))) from None


def walk(directory):
    """The entries PackDirectory would pack from ``directory``, sorted by name."""
    directory = os.fspath(directory)
    try:
        st = os.stat(directory)
    except OSError as e:
        raise ValueError("%s: %s" % (directory, _strerror(e))) from None
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError("%s: not a directory" % directory)
    walker = _Walker(directory, os.path.realpath(directory))
    walker.walk(directory, "", [], frozenset())
    walker.entries.sort(key=lambda e: os.fsencode(e.name))
    return walker.entries


# --- ustar --------------------------------------------------------------------


def _padded(size):
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _octal(value, width):
    return ("%0*o" % (width - 1, value)).encode() + b"\0"


def _split_name(name):
    if len(name) <= 100:
        return b"", name
    slash = name.find(b"/")
    while slash != -1:
        if slash <= 155 and len(name) - slash - 1 <= 100 and slash + 1 < len(name):
            return name[:slash], name[slash + 1:]
        slash = name.find(b"/", slash + 1)
    raise ValueError("%s: the path is too long for the archive (ustar holds up to 255 bytes, split at a '/' into at "
                     "most 155 + 100); shorten it or list it in .trainctlignore" % os.fsdecode(name))


def _header(e):
    prefix, name = _split_name(os.fsencode(e.name))
    if e.is_dir and len(name) < 100:
        name += b"/"
    h = bytearray(BLOCK)
    h[0:len(name)] = name
    h[100:108] = _octal(0o755 if e.is_dir or e.executable else 0o644, 8)
    h[108:116] = _octal(0, 8)
    h[116:124] = _octal(0, 8)
    h[124:136] = _octal(e.size, 12)
    h[136:148] = _octal(0, 12)
    h[156:157] = b"5" if e.is_dir else b"0"
    h[257:263] = b"ustar\0"
    h[263:265] = b"00"
    h[329:337] = _octal(0, 8)
    h[337:345] = _octal(0, 8)
    h[345:345 + len(prefix)] = prefix
    checksum = sum(h[:148]) + 8 * ord(" ") + sum(h[156:])
    h[148:156] = _octal(checksum, 7) + b" "
    return bytes(h)


class PackedCode:
    """An archive written to ``path``: ``digest`` ("sha256:<hex>"),
    ``size_bytes``, ``files`` (regular files in it)."""

    def __init__(self, path, digest, size_bytes, files):
        self.path, self.digest, self.size_bytes, self.files = path, digest, size_bytes, files


def pack_directory(directory, archive_path, max_bytes=DEFAULT_MAX_BYTES):
    """Packs ``directory`` into ``archive_path`` (a new file, removed again
    on failure). ValueError for what cannot be packed, naming it; over
    ``max_bytes`` the message names the limit and the three biggest files."""
    directory = os.fspath(directory)
    entries = walk(directory)
    files = [e for e in entries if not e.is_dir]
    total = 2 * BLOCK + sum(BLOCK + _padded(e.size) for e in entries)
    if total > max_bytes:
        biggest = sorted(files, key=lambda e: -e.size)[:3]
        raise ValueError(
            "%s: the code archive would be %s (%d files), over the limit of %s; the biggest files: %s. List what "
            "the job does not need in .trainctlignore (or .gitignore)"
            % (directory, format_bytes(total), len(files), format_bytes(max_bytes),
               ", ".join("%s (%s)" % (e.name, format_bytes(e.size)) for e in biggest)))
    sha = hashlib.sha256()
    out = open(archive_path, "xb")  # never over an existing file
    try:
        with out:
            def write(data):
                sha.update(data)
                out.write(data)

            for e in entries:
                write(_header(e))
                if e.is_dir:
                    continue
                try:
                    with open(e.source, "rb") as f:
                        left = e.size
                        while left > 0:
                            data = f.read(min(left, 1 << 20))
                            if not data:
                                break
                            write(data)
                            left -= len(data)
                        if left != 0 or f.read(1):
                            raise ValueError("%s: the file changed size while it was packed; try again" % e.source)
                except OSError as err:
                    raise ValueError("%s: %s" % (e.source, _strerror(err))) from None
                write(b"\0" * (_padded(e.size) - e.size))
            write(b"\0" * (2 * BLOCK))
    except BaseException:
        try:
            os.unlink(archive_path)
        except OSError:
            pass
        raise
    return PackedCode(archive_path, "sha256:" + sha.hexdigest(), total, len(files))
