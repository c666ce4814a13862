#!/usr/bin/env python3
"""Tests of tools/remote-cache/evict on synthetic cache folders.

Each case lays out a server folder with real protobuf-encoded ActionResult,
Tree and Action messages (encoded here, independently of the script's reader),
sets file times, runs the script as a user would (a subprocess with a fixed
--now), and checks what is left. After every run an independent checker
verifies the script's invariant: every action result left names only blobs
that are still present.

  python3 tests/remote-cache/evict_test.py [PATH/TO/evict]
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
EVICT = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "tools", "remote-cache", "evict")
NOW = 2_000_000_000.0
DAY = 86400.0


# --- Protobuf encoding (wire format), written for these tests only.

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_int(number, value):
    return varint(number << 3) + varint(value)


def digest(content):
    return field_bytes(1, hashlib.sha256(content).hexdigest().encode()) + field_int(2, len(content))


def action_result(files=(), trees=(), stdout=None, exit_code=0):
    """ActionResult with output_files (2), output_directories (3), exit_code (4), stdout_digest (6)."""
    msg = b""
    for i, content in enumerate(files):
        msg += field_bytes(2, field_bytes(1, f"out/f{i}".encode()) + field_bytes(2, digest(content)) + field_int(4, 1))
    for i, tree in enumerate(trees):
        msg += field_bytes(3, field_bytes(1, f"out/d{i}".encode()) + field_bytes(3, digest(tree)))
    if exit_code:
        msg += field_int(4, exit_code)
    if stdout is not None:
        msg += field_bytes(6, digest(stdout))
    return msg


def tree(files, child_files=()):
    """Tree{root = 1, children = 2} of Directory{files = 1: FileNode{name = 1, digest = 2}}."""
    def directory(contents):
        return b"".join(field_bytes(1, field_bytes(1, f"n{i}".encode()) + field_bytes(2, digest(c)))
                        for i, c in enumerate(contents))
    msg = field_bytes(1, directory(files))
    if child_files:
        msg += field_bytes(2, directory(child_files))
    return msg


def sha(content):
    return hashlib.sha256(content).hexdigest()


class Cache:
    """A server folder laid out as tools/remote-cache/server makes it."""

    def __init__(self, root):
        self.root = root
        for d in ("data/ac", "data/cas", "logs", "run"):
            os.makedirs(os.path.join(root, d), exist_ok=True)

    def put_cas(self, content, age_days):
        key = sha(content)
        self._write("cas", key, content, age_days)
        return key

    def put_ac(self, key, result, age_days):
        self._write("ac", key, result, age_days)
        return key

    def _write(self, kind, key, content, age_days):
        path = os.path.join(self.root, "data", kind, key)
        with open(path, "wb") as f:
            f.write(content)
        t = NOW - age_days * DAY
        os.utime(path, (t, t))

    def keys(self, kind):
        return set(os.listdir(os.path.join(self.root, "data", kind)))

    def evict(self, *args):
        return subprocess.run([sys.executable, EVICT, self.root, "--now", str(NOW), *args],
                              capture_output=True, text=True)

    def check_invariant(self, test):
        """Independent of the script: decode each remaining result with a tiny
        reader of our own and check that every blob it names is present."""
        present = self.keys("cas")
        for key in self.keys("ac"):
            with open(os.path.join(self.root, "data", "ac", key), "rb") as f:
                data = f.read()
            for h in hashes_in(data) - {EMPTY}:
                test.assertIn(h, present, f"ac/{key} names cas/{h}, which eviction deleted")
                with open(os.path.join(self.root, "data", "cas", h), "rb") as f:
                    blob = f.read()
                # Tree blobs name further blobs.
                for inner in hashes_in(blob) - {EMPTY}:
                    if inner != h:
                        test.assertIn(inner, present, f"tree cas/{h} names cas/{inner}, which eviction deleted")


# sha256 of no bytes: Bazel never uploads or fetches the empty blob, so a
# result may name it without the cache holding it.
EMPTY = hashlib.sha256(b"").hexdigest()


def hashes_in(data):
    """Every 64-hex string in a message that is preceded by a Digest hash tag.

    A digest's hash is field 1, a 64-byte string: tag 0x0a, length 0x40."""
    out = set()
    i = data.find(b"\x0a\x40")
    while i != -1:
        candidate = data[i + 2:i + 66]
        try:
            text = candidate.decode("ascii")
            int(text, 16)
            if len(text) == 64:
                out.add(text)
        except (UnicodeDecodeError, ValueError):
            pass
        i = data.find(b"\x0a\x40", i + 1)
    return out


class EvictTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.cache = Cache(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def run_ok(self, *args):
        r = self.cache.evict(*args)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        self.cache.check_invariant(self)
        return r

    def test_max_age_deletes_old_results_and_their_exclusive_blobs(self):
        c = self.cache
        shared = b"shared output" * 10
        old_only = b"only the old action wrote this"
        new_only = b"only the new action wrote this"
        old_ac = c.put_ac("a" * 64, action_result(files=[shared, old_only]), 40)
        new_ac = c.put_ac("b" * 64, action_result(files=[shared, new_only]), 1)
        k_shared = c.put_cas(shared, 40)
        k_old = c.put_cas(old_only, 40)
        k_new = c.put_cas(new_only, 1)
        orphan_old = c.put_cas(b"nobody names me", 3)
        orphan_fresh = c.put_cas(b"uploaded a moment ago", 0.001)
        r = self.run_ok("--max-age", "30d")
        self.assertEqual(c.keys("ac"), {new_ac})
        self.assertEqual(c.keys("cas"), {k_shared, k_new, orphan_fresh})
        self.assertNotIn(old_ac, c.keys("ac"))
        self.assertNotIn(k_old, c.keys("cas"))
        self.assertNotIn(orphan_old, c.keys("cas"))
        self.assertIn("deleted 1 of 2 action results and 2 of 5 blobs", r.stdout)

    def test_access_log_counts_as_use(self):
        c = self.cache
        out = b"read yesterday through the log"
        key = c.put_ac("c" * 64, action_result(files=[out]), 60)
        blob = c.put_cas(out, 60)
        stamp = "2033-05-17T03:33:20+00:00"  # NOW - 1 day is 2033-05-17T03:33:20Z.
        with open(os.path.join(c.root, "logs", "access.log"), "w") as f:
            f.write(f'{stamp} 127.0.0.1 "-" GET /ac/{key} 200 100 10\n')
            f.write(f'{stamp} 127.0.0.1 "-" GET /ac/{"d" * 64} 404 100 10\n')
        self.run_ok("--max-age", "30d")
        self.assertEqual(c.keys("ac"), {key})
        self.assertEqual(c.keys("cas"), {blob})

    def test_max_size_evicts_least_recently_used_until_it_fits(self):
        c = self.cache
        kept = []
        # Five results of 10 KiB outputs each, used 5, 4, 3, 2, 1 days ago.
        for i, age in enumerate([5, 4, 3, 2, 1]):
            content = bytes([i]) * 10240
            key = c.put_ac(f"{i:064x}", action_result(files=[content]), age)
            blob = c.put_cas(content, age)
            kept.append((key, blob))
        r = self.run_ok("--max-size", "25K")
        # Results are tiny; two 10 KiB outputs fit in 25 KiB, three do not.
        self.assertEqual(c.keys("ac"), {kept[3][0], kept[4][0]}, r.stdout)
        self.assertEqual(c.keys("cas"), {kept[3][1], kept[4][1]})
        total = sum(os.path.getsize(os.path.join(c.root, "data", k, n))
                    for k in ("ac", "cas") for n in c.keys(k))
        self.assertLessEqual(total, 25 * 1024)

    def test_max_size_keeps_results_used_within_grace_and_warns(self):
        c = self.cache
        content = b"z" * 10240
        fresh = c.put_ac("9" * 64, action_result(files=[content]), 0.001)
        blob = c.put_cas(content, 0.001)
        r = self.run_ok("--max-size", "1K")
        self.assertEqual(c.keys("ac"), {fresh})
        self.assertEqual(c.keys("cas"), {blob})
        self.assertIn("over --max-size", r.stderr)

    def test_tree_outputs_keep_their_files(self):
        c = self.cache
        f1, f2, f3 = b"file in root dir", b"file in child dir", b"stdout text"
        t = tree([f1], [f2])
        key = c.put_ac("e" * 64, action_result(trees=[t], stdout=f3), 2)
        blobs = {c.put_cas(x, 2) for x in (t, f1, f2, f3)}
        self.run_ok("--max-age", "30d")
        self.assertEqual(c.keys("ac"), {key})
        self.assertEqual(c.keys("cas"), blobs)

    def test_action_and_command_blobs_beside_a_result_are_kept(self):
        c = self.cache
        command = b"\x0a\x04echo"  # Command{arguments = 1: "echo"}.
        action = field_bytes(1, digest(command))
        ac_key = sha(action)
        c.put_ac(ac_key, action_result(), 2)
        c.put_cas(action, 2)
        cmd_key = c.put_cas(command, 2)
        self.run_ok("--max-age", "30d")
        self.assertEqual(c.keys("cas"), {ac_key, cmd_key})

    def test_dry_run_deletes_nothing_and_lists_what_it_would(self):
        c = self.cache
        old = c.put_ac("f" * 64, action_result(files=[b"x"]), 90)
        blob = c.put_cas(b"x", 90)
        r = self.run_ok("--max-age", "30d", "--dry-run")
        self.assertEqual(c.keys("ac"), {old})
        self.assertEqual(c.keys("cas"), {blob})
        self.assertIn(f"ac/{old}", r.stdout)
        self.assertIn(f"cas/{blob}", r.stdout)
        self.assertIn("would delete 1 of 1 action results and 1 of 1 blobs", r.stdout)

    def test_invalid_result_is_reported_not_fatal(self):
        c = self.cache
        c.put_ac("1" * 64, b"\xff\xff\xff", 1)
        c.put_cas(b"orphan", 2)
        r = self.run_ok("--max-age", "30d")
        self.assertIn("not a valid ActionResult", r.stderr)
        self.assertIn("1" * 64, r.stderr)
        self.assertEqual(c.keys("cas"), set())

    def test_stray_file_is_left_alone(self):
        c = self.cache
        stray = os.path.join(c.root, "data", "cas", "README")
        with open(stray, "w") as f:
            f.write("not a blob")
        r = self.run_ok("--max-size", "0")
        self.assertTrue(os.path.exists(stray))
        self.assertIn("not a cache entry", r.stderr)

    def test_usage_errors_are_clear(self):
        c = self.cache
        r = c.evict()
        self.assertEqual(r.returncode, 2)
        self.assertIn("give --max-age, --max-size or both", r.stderr)
        r = c.evict("--max-size", "lots")
        self.assertEqual(r.returncode, 2)
        self.assertIn("'lots' is not a size", r.stderr)
        r = subprocess.run([sys.executable, EVICT, os.path.join(c.root, "nope"), "--max-age", "1d"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("is not a cache server folder", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
