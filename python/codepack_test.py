"""trainctl.codepack against the cases of common/codepack/code_pack_test.cc:
the same trees must give the same file lists (read back with GNU tar) and
the same refusals. Standard library only. (client_test.py checks that the
C++ CLI and this packer give the same archive, digest for digest.)"""
import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trainctl import codepack  # noqa: E402


class CodePackTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="codepack_test")
        self.src = os.path.join(self.tmp, "src")
        os.makedirs(self.src)
        self.n = 0

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def write(self, rel, data, mode=0o644, base=None):
        path = os.path.join(base or self.src, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(data)
        os.chmod(path, mode)

    def pack(self, **kw):
        self.n += 1
        archive = os.path.join(self.tmp, "code%d.tar" % self.n)
        return codepack.pack_directory(self.src, archive, **kw)

    def names(self, **kw):
        """The names `tar tf` lists (as code_pack_test.cc's TarList)."""
        packed = self.pack(**kw)
        out = subprocess.run(["tar", "tf", packed.path], capture_output=True, text=True, check=True)
        return out.stdout.splitlines()

    def test_round_trip_keeps_tree_modes_empty_files_and_directories(self):
        self.write("train.py", "print('hi')\n")
        self.write("run.sh", "#!/bin/sh\necho run\n", 0o755)
        self.write("pkg/sub/deep.txt", "x" * 5000)
        self.write("pkg/empty", "")
        os.makedirs(os.path.join(self.src, "pkg/nothing"))
        packed = self.pack()
        self.assertEqual(packed.size_bytes, os.path.getsize(packed.path))
        self.assertEqual(packed.files, 4)
        self.assertEqual(subprocess.run(["tar", "tf", packed.path], capture_output=True, text=True,
                                        check=True).stdout.splitlines(),
                         ["pkg/", "pkg/empty", "pkg/nothing/", "pkg/sub/", "pkg/sub/deep.txt", "run.sh", "train.py"])
        out = os.path.join(self.tmp, "out")
        os.makedirs(out)
        subprocess.run(["tar", "xf", packed.path, "-C", out], check=True)
        with open(os.path.join(out, "pkg/sub/deep.txt")) as f:
            self.assertEqual(f.read(), "x" * 5000)
        self.assertEqual(os.stat(os.path.join(out, "run.sh")).st_mode & 0o777, 0o755)
        with tarfile.open(packed.path) as t:
            members = {m.name: m for m in t.getmembers()}
        self.assertEqual(members["train.py"].mode, 0o644)
        self.assertEqual((members["train.py"].mtime, members["train.py"].uid, members["train.py"].uname), (0, 0, ""))
        self.assertEqual(members["run.sh"].mode, 0o755)

    def test_same_tree_same_digest_whatever_the_mtimes_and_creation_order(self):
        self.write("b.py", "b")
        self.write("a/x.py", "x")
        self.write("a/y.py", "y")
        first, again = self.pack(), self.pack()
        self.assertEqual(first.digest, again.digest)
        # a/ and three files (a header each, one data block each), the end marker.
        self.assertEqual(first.size_bytes, 4 * 512 + 3 * 512 + 1024)
        other = os.path.join(self.tmp, "other")
        self.write("a/y.py", "y", base=other)
        self.write("a/x.py", "x", base=other)
        self.write("b.py", "b", base=other)
        os.utime(os.path.join(other, "b.py"), (1000, 1000))
        self.src = other
        self.assertEqual(self.pack().digest, first.digest)
        self.write("b.py", "c")
        self.assertNotEqual(self.pack().digest, first.digest)

    def test_always_skips_git_pycache_and_pyc(self):
        self.write(".git/HEAD", "ref")
        self.write("sub/.git", "gitdir: elsewhere")
        self.write("__pycache__/m.cpython-311.pyc", "c")
        self.write("m.pyc", "c")
        self.write("m.py", "m")
        self.assertEqual(self.names(), ["m.py", "sub/"])

    def test_gitignore_comments_negation_and_wildcards(self):
        self.write(".gitignore", "# a comment\n\n*.log\n!keep.log\ndata?.bin\nckpt[0-9]\n")
        for name in ("a.log", "keep.log", "deep/b.log", "data1.bin", "data12.bin", "ckpt3", "ckptx", "# a comment"):
            self.write(name, "")
        self.assertEqual(self.names(), ["# a comment", ".gitignore", "ckptx", "data12.bin", "deep/", "keep.log"])

    def test_trailing_slash_matches_directories_only(self):
        self.write(".gitignore", "build/\n")
        self.write("build/out.o", "")
        self.write("src/build/gen.o", "")
        self.write("tools/build", "a file named build")
        self.assertEqual(self.names(), [".gitignore", "src/", "tools/", "tools/build"])

    def test_slash_anchors_to_the_ignore_files_directory(self):
        self.write(".gitignore", "/top.txt\nconf/local.yaml\n")
        for name in ("top.txt", "sub/top.txt", "conf/local.yaml", "sub/conf/local.yaml"):
            self.write(name, "")
        self.assertEqual(self.names(), [".gitignore", "conf/", "sub/", "sub/conf/", "sub/conf/local.yaml",
                                        "sub/top.txt"])

    def test_double_star_matches_any_depth(self):
        self.write(".gitignore", "**/cache\nlogs/**\na/**/z.txt\n")
        for name in ("cache/x", "p/q/cache/x", "logs/1/2.txt", "a/z.txt", "a/b/c/z.txt", "a/b/y.txt"):
            self.write(name, "")
        self.assertEqual(self.names(), [".gitignore", "a/", "a/b/", "a/b/c/", "a/b/y.txt", "logs/", "p/", "p/q/"])

    def test_nested_ignore_files_rule_their_subtree_and_trainctlignore_too(self):
        self.write(".trainctlignore", "datasets/\n")
        self.write("datasets/big.bin", "")
        self.write("sub/.gitignore", "*.tmp\n!keep.tmp\n")
        self.write("sub/a.tmp", "")
        self.write("sub/keep.tmp", "")
        self.write("top.tmp", "")
        self.assertEqual(self.names(), [".trainctlignore", "sub/", "sub/.gitignore", "sub/keep.tmp", "top.tmp"])

    def test_fnmatch_brackets_escapes_and_trailing_spaces_as_glibc(self):
        # [^...] negates as glibc's fnmatch does (Python's fnmatch would not),
        # "\*" is a literal star, an escaped trailing space stays.
        self.write(".gitignore", "v[^0-9]\n\\*star\nsp\\ \n\\!bang\nr[a-c]\n")
        for name in ("v1", "vx", "*star", "xstar", "sp ", "sp", "!bang", "rb", "rd"):
            self.write(name, "")
        self.assertEqual(self.names(), [".gitignore", "rd", "sp", "v1", "xstar"])

    def test_component_patterns_match_as_libc_fnmatch(self):
        # code_pack.cc matches each component with fnmatch(3, FNM_PATHNAME):
        # the Python translation against libc itself.
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        fnm_pathname = 1
        patterns = ["*.log", "data?.bin", "ckpt[0-9]", "v[^0-9]", "v[!0-9]", "[]x]", "[!]x]", "a\\*b", "\\?",
                    "x[a-c-]", "[", "a[", "*", "?*", "[.]*", "\\[x]", "**", "a]b", "[a\\]]", "é*"]
        names = ["a.log", ".log", "data1.bin", "data12.bin", "ckpt3", "ckptx", "v1", "vx", "]", "x", "a*b", "ab",
                 "?", "a", "x-", "xb", "[", "a[", ".hidden", "[x]", "a]b", "\\", "éa", "", "v]"]
        for pattern in patterns:
            rx = codepack._glob_regex(pattern)
            for name in names:
                want = libc.fnmatch(pattern.encode(), name.encode(), fnm_pathname) == 0
                self.assertEqual(bool(rx.match(name)), want, "pattern %r name %r" % (pattern, name))

    def test_symlink_inside_is_packed_as_what_it_names(self):
        self.write("real/data.txt", "data")
        os.symlink("real/data.txt", os.path.join(self.src, "link.txt"))
        os.symlink("real", os.path.join(self.src, "linkdir"))
        self.assertEqual(self.names(), ["link.txt", "linkdir/", "linkdir/data.txt", "real/", "real/data.txt"])
        with tarfile.open(os.path.join(self.tmp, "code%d.tar" % self.n)) as t:
            self.assertTrue(t.getmember("link.txt").isfile())
            self.assertEqual(t.extractfile("link.txt").read(), b"data")

    def test_symlink_outside_is_refused_naming_link_and_target(self):
        self.write("secret.txt", "s", base=self.tmp)
        os.symlink("../secret.txt", os.path.join(self.src, "escape"))
        with self.assertRaises(ValueError) as cm:
            self.pack()
        self.assertIn(self.src + "/escape -> ../secret.txt", str(cm.exception))
        self.assertIn("outside", str(cm.exception))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "code%d.tar" % self.n)))
        self.write(".trainctlignore", "escape\n")
        self.assertEqual(self.names(), [".trainctlignore"])

    def test_symlink_loop_and_dangling_link_are_refused(self):
        os.symlink(".", os.path.join(self.src, "self"))
        with self.assertRaisesRegex(ValueError, "loop"):
            self.pack()
        os.remove(os.path.join(self.src, "self"))
        os.symlink("missing", os.path.join(self.src, "dangling"))
        with self.assertRaisesRegex(ValueError, "dangling -> missing"):
            self.pack()

    def test_fifo_is_refused_naming_it(self):
        os.mkfifo(os.path.join(self.src, "pipe"))
        with self.assertRaisesRegex(ValueError, "pipe: a FIFO cannot be packed"):
            self.pack()

    def test_over_the_limit_names_the_limit_and_the_biggest_files(self):
        self.write("small.txt", "s" * 10)
        self.write("a.bin", "a" * 3000)
        self.write("b/c.bin", "c" * 5000)
        self.write("d.bin", "d" * 4000)
        with self.assertRaises(ValueError) as cm:
            self.pack(max_bytes=4096)
        message = str(cm.exception)
        self.assertIn("limit of 4 KiB", message)
        self.assertIn("b/c.bin (4.9 KiB), d.bin (3.9 KiB), a.bin (2.9 KiB)", message)
        self.assertNotIn("small.txt", message)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "code%d.tar" % self.n)))

    def test_long_names_use_the_prefix_and_too_long_is_refused(self):
        d = "p" * 60 + "/" + "q" * 60
        name = "n" * 90
        self.write(d + "/" + name, "long")
        self.assertEqual(self.names(), ["p" * 60 + "/", d + "/", d + "/" + name])
        too_long = "e" * 90 + "/" + "f" * 90 + "/" + "g" * 90
        self.write(too_long, "x")
        with self.assertRaisesRegex(ValueError, too_long + ": the path is too long"):
            self.pack()

    def test_not_a_directory_is_refused(self):
        self.write("file", "", base=self.tmp)
        with self.assertRaisesRegex(ValueError, "not a directory"):
            codepack.pack_directory(os.path.join(self.tmp, "file"), os.path.join(self.tmp, "x.tar"))
        with self.assertRaises(ValueError):
            codepack.pack_directory(os.path.join(self.tmp, "missing"), os.path.join(self.tmp, "x.tar"))

    def test_an_existing_archive_path_is_never_overwritten(self):
        self.write("a.py", "a")
        existing = os.path.join(self.tmp, "there.tar")
        self.write("there.tar", "keep", base=self.tmp)
        with self.assertRaises(FileExistsError):
            codepack.pack_directory(self.src, existing)
        with open(existing) as f:
            self.assertEqual(f.read(), "keep")


if __name__ == "__main__":
    unittest.main()
