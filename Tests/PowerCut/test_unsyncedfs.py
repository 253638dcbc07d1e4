#!/usr/bin/python3
"""Tests of unsyncedfs.py. Run as root with /usr/bin/python3 (Debian's, with python3-fusepy):

    /usr/bin/python3 -m unittest discover -s Tests/PowerCut -v      or      Tests/PowerCut/run.sh

Each test mounts a fresh backing directory in a temporary directory and unmounts it in its cleanup; every wait is
bounded, and every process a test starts is stopped by its pid.
"""

import ctypes
import errno
import json
import mmap
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FS = os.path.join(HERE, 'unsyncedfs.py')
PY = sys.executable
sys.path.insert(0, HERE)
import unsyncedfs  # noqa: E402  (the client side only: control())

TMP_PREFIX = 'unsyncedfs-test-'


# With POWERCUT_REQUIRED=1 (CI sets it) a test that cannot mount FUSE fails, naming why, instead of skipping.
REQUIRED = os.environ.get('POWERCUT_REQUIRED') == '1'


def fuse_unusable_reason():
    if os.geteuid() != 0:
        return 'not root'
    if not os.path.exists('/dev/fuse'):
        return 'no /dev/fuse'
    try:
        import fusepy  # noqa: F401
    except ImportError:
        return 'python3-fusepy is not installed'
    return None


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mounted(path):
    return unsyncedfs._mount_entry(os.path.realpath(path)) is not None


def read(path):
    with open(path, 'rb') as f:
        return f.read()


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError('timed out after %.1f s waiting for %s' % (timeout, what))


# The SQLite writer: one transaction per row; prints each row's number once its COMMIT has returned ("acked").
WRITER = r'''
import os, sqlite3, sys
path, sync, first, count, checkpoint = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
con = sqlite3.connect(path, isolation_level=None)
assert con.execute('PRAGMA journal_mode=WAL').fetchone()[0] == 'wal'
con.execute('PRAGMA synchronous=%s' % sync)
con.execute('PRAGMA wal_autocheckpoint=%d' % checkpoint)
con.execute('CREATE TABLE IF NOT EXISTS t (i INTEGER PRIMARY KEY, v BLOB NOT NULL)')
for i in range(first, first + count):
    con.execute('BEGIN IMMEDIATE')
    con.execute('INSERT INTO t VALUES (?, ?)', (i, os.urandom(300)))
    con.execute('COMMIT')
    sys.stdout.write('%d\n' % i)
    sys.stdout.flush()
con.close()
'''


@unittest.skipIf(fuse_unusable_reason() and not REQUIRED, 'FUSE unusable here: %s' % fuse_unusable_reason())
class MountedTest(unittest.TestCase):
    """Mounts BACKING at MNT in setUp (after prepare(BACKING)), unmounts in cleanup."""

    def prepare(self, backing):
        pass

    def setUp(self):
        if REQUIRED and fuse_unusable_reason():
            self.fail('POWERCUT_REQUIRED=1, and FUSE cannot be used here: %s' % fuse_unusable_reason())
        self.tmp = tempfile.mkdtemp(prefix=TMP_PREFIX)
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.backing = os.path.join(self.tmp, 'backing')
        self.mnt = os.path.join(self.tmp, 'mnt')
        os.mkdir(self.backing)
        os.mkdir(self.mnt)
        self.prepare(self.backing)
        self.children = []
        self.logpath = os.path.join(self.tmp, 'fs.log')
        with open(self.logpath, 'wb') as log:
            self.proc = subprocess.Popen([PY, FS, 'mount', self.backing, self.mnt, '--foreground'],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.addCleanup(self.unmount)

        def up():
            if self.proc.poll() is not None:
                raise AssertionError('the filesystem exited: ' + read(self.logpath).decode())
            if not os.path.ismount(self.mnt):
                return False
            try:
                return unsyncedfs.control(self.mnt, 'status')['ok']
            except OSError:
                return False
        wait_until(up, 10, 'the mount')

    def unmount(self):
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait(10)
        r = subprocess.run([PY, FS, 'unmount', self.mnt, '--timeout', '10'], capture_output=True, text=True,
                           timeout=30)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if mounted(self.mnt):
            subprocess.run(['umount', '-l', self.mnt], timeout=10)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertFalse(mounted(self.mnt), 'mount left behind')
        self.assertEqual(self.proc.returncode, 0, read(self.logpath).decode())

    # ---- helpers --------------------------------------------------------------------------------------------

    def p(self, rel):
        return os.path.join(self.mnt, rel)

    def cli(self, *args, ok=True):
        r = subprocess.run([PY, FS] + list(args), capture_output=True, text=True, timeout=60)
        if not ok and not r.stdout:
            self.assertNotEqual(r.returncode, 0)
            return None   # refused by the CLI's own argument parser
        reply = json.loads(r.stdout)
        if ok:
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertTrue(reply['ok'], reply)
        return reply

    def cut(self, *args):
        return self.cli('cut', self.mnt, *args)

    def status(self):
        return self.cli('status', self.mnt)

    def write_durable(self, rel, data):
        """Creates rel with data, fsyncs it and its directory: all durable."""
        fd = os.open(self.p(rel), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(self.p(rel)))

    def pwrite(self, rel, data, offset, fsync=False):
        fd = os.open(self.p(rel), os.O_RDWR)
        try:
            os.pwrite(fd, data, offset)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)


class DataTest(MountedTest):
    def test_unsynced_write_is_gone_after_a_cut(self):
        self.write_durable('f', b'a' * 5000)
        self.pwrite('f', b'b' * 100, 10)                       # not synced
        with open(self.p('f'), 'ab') as f:                      # appended, not synced
            f.write(b'c' * 3000)
        self.assertEqual(read(self.p('f')), b'a' * 10 + b'b' * 100 + b'a' * 4890 + b'c' * 3000)
        st = self.status()
        self.assertEqual(st['files']['/f']['unsynced_bytes'], 3100)
        reply = self.cut()
        self.assertEqual(reply['files'][0]['dropped_bytes'], 3100)
        self.assertEqual(read(self.p('f')), b'a' * 5000)
        self.assertEqual(os.stat(self.p('f')).st_size, 5000)

    def test_fsynced_write_stays(self):
        self.write_durable('f', b'a' * 5000)
        self.pwrite('f', b'b' * 100, 10, fsync=True)
        os.truncate(self.p('f'), 4000)
        fd = os.open(self.p('f'), os.O_RDWR)
        os.fdatasync(fd)                                        # fdatasync counts as fsync
        os.close(fd)
        self.pwrite('f', b'z' * 50, 0)                          # this one is not synced
        self.cut()
        self.assertEqual(read(self.p('f')), b'a' * 10 + b'b' * 100 + b'a' * 3890)
        self.assertEqual(self.status()['files'], {})

    def test_a_cut_is_repeatable_and_the_mount_stays_usable(self):
        self.write_durable('f', b'1')
        for i in range(3):
            self.pwrite('f', b'x', 0)
            self.cut('--seed', str(i))
            self.assertEqual(read(self.p('f')), b'1')
        self.pwrite('f', b'2', 0, fsync=True)
        self.cut()
        self.assertEqual(read(self.p('f')), b'2')
        self.assertEqual(self.status()['cuts'], 4)

    def test_fallocate_and_truncate_are_undone(self):
        self.write_durable('f', b'q' * 1000)
        fd = os.open(self.p('f'), os.O_RDWR)
        os.posix_fallocate(fd, 0, 1 << 20)
        os.ftruncate(fd, 10)
        os.close(fd)
        self.assertEqual(os.stat(self.p('f')).st_size, 10)
        self.cut()
        self.assertEqual(read(self.p('f')), b'q' * 1000)

    def test_unlinked_open_file_keeps_working(self):
        self.write_durable('f', b'abc')
        fd = os.open(self.p('f'), os.O_RDWR)
        try:
            os.unlink(self.p('f'))
            os.pwrite(fd, b'XYZ', 0)
            os.fsync(fd)
            self.assertEqual(os.pread(fd, 3, 0), b'XYZ')
            self.assertEqual(os.fstat(fd).st_nlink, 0)
        finally:
            os.close(fd)
        self.cut()  # the unlink was never made durable: the file comes back, with its synced content
        self.assertEqual(read(self.p('f')), b'XYZ')

    def test_o_dsync_writes_are_durable(self):
        self.write_durable('f', b'')
        fd = os.open(self.p('f'), os.O_WRONLY | os.O_DSYNC)
        os.write(fd, b'synced by O_DSYNC')                  # the kernel sends FUSE an fsync after each write
        os.close(fd)
        self.cut()
        self.assertEqual(read(self.p('f')), b'synced by O_DSYNC')


    def test_sync_command_makes_everything_durable(self):
        self.write_durable('f', b'1')
        self.pwrite('f', b'2', 0)
        os.mkdir(self.p('d'))
        with open(self.p('d/g'), 'wb') as f:
            f.write(b'g')
        self.assertEqual(self.cli('sync', self.mnt)['synced_bytes'], 2)
        st = self.status()
        self.assertEqual((st['files'], st['unsynced_dirs'], st['unsynced_bytes']), ({}, [], 0))
        self.cut()
        self.assertEqual((read(self.p('f')), read(self.p('d/g'))), (b'2', b'g'))


class NamespaceTest(MountedTest):
    def prepare(self, backing):
        with open(os.path.join(backing, 'old'), 'wb') as f:
            f.write(b'durable')
        os.mkdir(os.path.join(backing, 'd'))

    def test_backing_content_at_mount_is_durable(self):
        self.cut()
        self.assertEqual(read(self.p('old')), b'durable')
        self.assertTrue(os.path.isdir(self.p('d')))
        self.assertNotIn('.unsyncedfs', os.listdir(self.mnt))

    def test_rename_without_directory_fsync_is_undone(self):
        os.rename(self.p('old'), self.p('new'))
        reply = self.cut()
        self.assertEqual(reply['removed'], ['/new'])
        self.assertEqual(reply['restored'], ['/old'])
        self.assertEqual(sorted(os.listdir(self.mnt)), ['d', 'old'])
        self.assertEqual(read(self.p('old')), b'durable')

    def test_rename_with_directory_fsync_stays(self):
        os.rename(self.p('old'), self.p('new'))
        fsync_dir(self.mnt)
        self.cut()
        self.assertEqual(sorted(os.listdir(self.mnt)), ['d', 'new'])
        self.assertEqual(read(self.p('new')), b'durable')

    def test_create_without_directory_fsync_is_undone_even_if_the_file_was_fsynced(self):
        fd = os.open(self.p('fresh'), os.O_RDWR | os.O_CREAT, 0o600)
        os.write(fd, b'data')
        os.fsync(fd)
        os.close(fd)
        fsync_dir(self.p('d'))  # another directory's fsync does not help
        self.assertIn('/', self.status()['unsynced_dirs'])
        reply = self.cut()
        self.assertEqual(reply['removed'], ['/fresh'])
        self.assertFalse(os.path.exists(self.p('fresh')))
        # and once the directory is synced, the entry (with the file's synced data) is durable
        fd = os.open(self.p('fresh'), os.O_RDWR | os.O_CREAT, 0o600)
        os.write(fd, b'data')
        os.fsync(fd)
        os.close(fd)
        fsync_dir(self.mnt)
        self.assertEqual(self.status()['unsynced_dirs'], [])
        self.cut()
        self.assertEqual(read(self.p('fresh')), b'data')
        self.assertEqual(os.stat(self.p('fresh')).st_mode & 0o777, 0o600)

    def test_directory_fsync_without_file_fsync_keeps_an_empty_file(self):
        with open(self.p('fresh'), 'wb') as f:
            f.write(b'never synced')
        fsync_dir(self.mnt)
        self.cut()
        self.assertEqual(read(self.p('fresh')), b'')

    def test_unlink_mkdir_rmdir_symlink_link_are_undone(self):
        os.unlink(self.p('old'))
        os.rmdir(self.p('d'))
        os.mkdir(self.p('e'))
        os.symlink('old', self.p('s'))
        self.write_durable('e/inner', b'in e')  # e's entry in / is still not durable
        self.cut()
        self.assertEqual(sorted(os.listdir(self.mnt)), ['d', 'old'])
        self.assertEqual(read(self.p('old')), b'durable')
        os.link(self.p('old'), self.p('hard'))
        os.symlink('old', self.p('s'))
        os.mkfifo(self.p('fifo'))
        os.mkdir(self.p('e'))
        self.write_durable('e/inner', b'in e')
        fsync_dir(self.mnt)
        self.cut()
        self.assertEqual(sorted(os.listdir(self.mnt)), ['d', 'e', 'fifo', 'hard', 'old', 's'])
        self.assertTrue(stat.S_ISFIFO(os.lstat(self.p('fifo')).st_mode))
        self.assertEqual(os.stat(self.p('hard')).st_ino, os.stat(self.p('old')).st_ino)
        self.assertEqual(os.stat(self.p('old')).st_nlink, 2)
        self.assertEqual(os.readlink(self.p('s')), 'old')
        self.assertEqual(read(self.p('e/inner')), b'in e')

    def test_directory_rename_over_directories(self):
        os.mkdir(self.p('d/sub'))
        self.write_durable('d/sub/f', b'deep')
        fsync_dir(self.p('d'))
        os.rename(self.p('d'), self.p('d2'))   # not synced: d comes back with its synced content
        self.cut()
        self.assertEqual(sorted(os.listdir(self.mnt)), ['d', 'old'])
        self.assertEqual(read(self.p('d/sub/f')), b'deep')


class ModesTest(MountedTest):
    # Page-aligned writes of 3 pages: the kernel sends each as one FUSE write (a write that starts inside a page
    # and crosses its end comes as two: the rest of that page, then the remainder).
    CHUNK = 12288
    N = 24

    def chunks(self):
        return [bytes([65 + i]) * self.CHUNK for i in range(self.N)]

    def write_chunks(self, rel):
        self.write_durable(rel, b'')
        fd = os.open(self.p(rel), os.O_WRONLY)
        for i, c in enumerate(self.chunks()):
            os.pwrite(fd, c, i * self.CHUNK)
        os.close(fd)

    def test_prefix_keeps_a_prefix_of_each_files_writes(self):
        ks = []
        for seed in range(6):
            self.write_chunks('f')
            reply = self.cut('--mode', 'prefix', '--seed', str(seed))
            self.assertEqual(reply['seed'], seed)
            info = reply['files'][0]
            k = info['kept_ops']
            self.assertEqual(info['unsynced_ops'], self.N)
            self.assertEqual(read(self.p('f')), b''.join(self.chunks()[:k]))
            ks.append(k)
        self.assertTrue(any(0 < k < self.N for k in ks), ks)
        # same seed, same writes: same cut
        self.write_chunks('f')
        self.assertEqual(self.cut('--mode', 'prefix', '--seed', '3')['files'][0]['kept_ops'], ks[3])

    def test_torn_tears_the_last_kept_write_at_a_sector_boundary(self):
        torn_seen = {512: 0, 4096: 0}
        for sector in (512, 4096):
            for seed in range(8):
                self.write_chunks('f')
                reply = self.cut('--mode', 'torn', '--seed', str(seed), '--sector', str(sector))
                info = reply['files'][0]
                k = info['kept_ops']
                expected = b''.join(self.chunks()[:k])
                torn = info['torn']
                if torn:
                    torn_seen[sector] += 1
                    self.assertEqual(torn['offset'], (k - 1) * self.CHUNK)
                    self.assertEqual((torn['offset'] + torn['kept']) % sector, 0)
                    self.assertTrue(0 < torn['kept'] < self.CHUNK)
                    expected = expected[:torn['offset'] + torn['kept']]
                self.assertEqual(read(self.p('f')), expected, (sector, seed, k, torn))
        self.assertTrue(all(torn_seen.values()), torn_seen)

    def test_all_drops_every_unsynced_write(self):
        self.write_chunks('f')
        self.assertEqual(self.cut('--mode', 'all')['files'][0]['kept_ops'], 0)
        self.assertEqual(read(self.p('f')), b'')


class FaultTest(MountedTest):
    def test_fsync_eio_and_the_lost_writes_stay_lost(self):
        self.write_durable('f', b'a' * 8192)
        self.write_durable('other', b'o')
        self.cli('inject', self.mnt, 'fsync-eio', '--pattern', 'f', '--count', '1')
        fd = os.open(self.p('f'), os.O_RDWR)
        try:
            os.pwrite(fd, b'X' * 100, 0)
            with self.assertRaises(OSError) as caught:
                os.fsync(fd)
            self.assertEqual(caught.exception.errno, errno.EIO)
            self.assertEqual(os.pread(fd, 100, 0), b'X' * 100)   # the page cache still shows it
            os.pwrite(fd, b'Y' * 100, 4096)
            os.fsync(fd)                                          # succeeds, but does not write X
        finally:
            os.close(fd)
        self.pwrite('other', b'p', 0, fsync=True)                 # not matched by the pattern
        st = self.status()
        self.assertEqual(st['faults']['fsync_eio'], [{'pattern': 'f', 'remaining': 0, 'hits': 1}])
        self.assertEqual(st['files']['/f']['lost_bytes'], 100)
        self.cut()
        self.assertEqual(read(self.p('f')), b'a' * 4096 + b'Y' * 100 + b'a' * 3996)
        self.assertEqual(read(self.p('other')), b'p')

    def test_fsync_eio_all_until_cleared(self):
        self.write_durable('x.db-wal', b'')
        self.cli('inject', self.mnt, 'fsync-eio', '--pattern', '*-wal', '--count', 'all')
        for _ in range(3):
            with self.assertRaises(OSError):
                self.pwrite('x.db-wal', b'w', 0, fsync=True)
        self.cli('clear', self.mnt)
        self.pwrite('x.db-wal', b'v', 1, fsync=True)
        self.cut()
        self.assertEqual(read(self.p('x.db-wal')), b'\0v')   # byte 0's 'w' was lost three times

    def test_enospc_after_a_byte_budget(self):
        self.write_durable('f', b'')
        self.cli('inject', self.mnt, 'enospc', '--after-bytes', '10000')
        fd = os.open(self.p('f'), os.O_WRONLY)
        try:
            self.assertEqual(os.pwrite(fd, b'1' * 8192, 0), 8192)
            with self.assertRaises(OSError) as caught:
                os.pwrite(fd, b'2' * 4096, 8192)             # would pass the budget: refused whole
            self.assertEqual(caught.exception.errno, errno.ENOSPC)
            self.assertEqual(os.pwrite(fd, b'3' * 1808, 8192), 1808)    # exactly fills the budget
            with self.assertRaises(OSError):
                os.pwrite(fd, b'4', 10000)
            self.assertEqual(self.status()['faults']['enospc'], {'after_bytes': 10000, 'used': 10000, 'refused': 2})
            self.cli('clear', self.mnt)
            self.assertEqual(os.pwrite(fd, b'5' * 100, 10000), 100)
        finally:
            os.close(fd)
        self.assertEqual(read(self.p('f')), b'1' * 8192 + b'3' * 1808 + b'5' * 100)

    def test_bad_commands_are_refused(self):
        self.assertIsNone(self.cli('cut', self.mnt, '--mode', 'sideways', ok=False))
        reply = unsyncedfs.control(self.mnt, 'frobnicate')
        self.assertEqual(reply['errno'], 'EINVAL')
        reply = unsyncedfs.control(self.mnt, 'cut --mode sideways')
        self.assertFalse(reply['ok'])
        self.assertIn('sideways', reply['error'])
        with self.assertRaises(OSError) as caught:
            with open(self.p('.unsyncedfs-control'), 'w') as f:
                f.write('inject fsync-eio --count 0')
        self.assertEqual(caught.exception.errno, errno.EINVAL)


class HandlesAndCacheTest(MountedTest):
    def test_cut_waits_for_open_files_then_refuses(self):
        self.write_durable('f', b'x')
        fd = os.open(self.p('f'), os.O_RDWR)
        try:
            reply = self.cli('cut', self.mnt, '--wait', '0.2', ok=False)
            self.assertEqual(reply['errno'], 'EBUSY')
            self.assertIn('/f', reply['error'])
        finally:
            os.close(fd)
        self.cut('--wait', '2')

    def test_forced_cut_makes_open_handles_stale(self):
        self.write_durable('f', b'x')
        fd = os.open(self.p('f'), os.O_RDWR)
        try:
            os.pwrite(fd, b'y', 0)
            reply = self.cut('--force')
            self.assertEqual(reply['stale_handles'], 1)
            with self.assertRaises(OSError) as caught:
                os.pwrite(fd, b'z', 0)
            self.assertEqual(caught.exception.errno, errno.EIO)
        finally:
            os.close(fd)
        self.assertEqual(read(self.p('f')), b'x')

    def test_no_stale_page_cache_after_a_cut(self):
        self.write_durable('same', b'A' * 8192)
        self.write_durable('grow', b'B' * 100)
        self.write_durable('mapped', b'C' * 4096)
        self.pwrite('same', b'a' * 8192, 0)                      # same size: only the open-time flush helps
        self.assertEqual(read(self.p('same')), b'a' * 8192)      # now in the kernel's page cache
        with open(self.p('grow'), 'ab') as f:
            f.write(b'b' * 5000)
        self.assertEqual(len(read(self.p('grow'))), 5100)
        with open(self.p('mapped'), 'r+b') as f:                 # a shared writable mapping, as SQLite's -shm
            m = mmap.mmap(f.fileno(), 4096)
            m[:5] = b'mmap!'      # no msync: msync is an fsync (the kernel sends FUSE one)
            m.close()
        self.assertEqual(read(self.p('mapped'))[:5], b'mmap!')
        self.assertEqual(self.status()['files']['/mapped']['unsynced_bytes'], 4096)
        os.rename(self.p('grow'), self.p('grown'))
        self.cut()
        self.assertEqual(read(self.p('same')), b'A' * 8192)
        self.assertEqual(os.stat(self.p('grow')).st_size, 100)
        self.assertEqual(read(self.p('grow')), b'B' * 100)
        self.assertFalse(os.path.exists(self.p('grown')))
        self.assertEqual(read(self.p('mapped')), b'C' * 4096)
        with open(self.p('mapped'), 'rb') as f:
            m = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)
            self.assertEqual(m[:5], b'CCCCC')
            m.close()


class SQLiteTest(MountedTest):
    """The proof the filesystem catches a missing fsync: kill -9 an SQLite writer in WAL mode, cut, reopen."""

    def prepare(self, backing):
        # The database, its table and 10 rows exist before the mount: durable.
        con = sqlite3.connect(os.path.join(backing, 'db.sqlite'), isolation_level=None)
        con.execute('PRAGMA journal_mode=WAL')
        con.execute('CREATE TABLE t (i INTEGER PRIMARY KEY, v BLOB NOT NULL)')
        for i in range(10):
            con.execute('INSERT INTO t VALUES (?, ?)', (i, b'x'))
        con.close()

    def run_writer_and_kill(self, sync, acks_before_kill, checkpoint=1000, first=10):
        """Starts the writer, lets it ack some commits, kills it with SIGKILL mid-run; returns the acked rows."""
        child = subprocess.Popen([PY, '-c', WRITER, self.p('db.sqlite'), sync, str(first), '1000000', str(checkpoint)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.children.append(child)
        acked = []
        deadline = time.monotonic() + 30
        while len(acked) < acks_before_kill:
            line = child.stdout.readline()
            if not line:
                self.fail('the writer stopped: ' + child.stderr.read().decode())
            acked.append(int(line))
            self.assertLess(time.monotonic(), deadline, 'the writer is too slow')
        os.kill(child.pid, signal.SIGKILL)
        rest = child.stdout.read()   # acks written before the kill are in the pipe
        child.wait(10)
        child.stderr.close()
        child.stdout.close()
        acked += [int(x) for x in rest.split()]
        return acked

    def rows(self):
        con = sqlite3.connect(self.p('db.sqlite'), isolation_level=None)
        try:
            check = con.execute('PRAGMA integrity_check').fetchone()[0]
            rows = [r[0] for r in con.execute('SELECT i FROM t ORDER BY i')]
        finally:
            con.close()
        return check, rows

    def test_synchronous_full_loses_no_acknowledged_commit(self):
        # Three rounds of the fault suite's loop: run the writer, kill -9 it, cut, reopen, check, run again.
        acked_so_far = set(range(10))
        notes = []
        for round_ in range(3):
            started = time.monotonic()
            acked = self.run_writer_and_kill('FULL', 300, checkpoint=50, first=1000 * (round_ + 1))
            elapsed = time.monotonic() - started
            reply = self.cut('--mode', 'torn', '--seed', str(7 + round_))   # the worst a disk may do to unsynced data
            check, rows = self.rows()
            self.assertEqual(check, 'ok')
            acked_so_far |= set(acked)
            self.assertLessEqual(acked_so_far, set(rows), 'acknowledged commits lost in round %d' % round_)
            self.assertLessEqual(len(rows), len(acked_so_far) + round_ + 1)  # plus at most one in flight per kill
            dropped = ', '.join('%s %d/%d' % (f['path'], f['kept_ops'], f['unsynced_ops'])
                                for f in reply['files']) or 'nothing'
            notes.append('%d acked in %.2f s, cut seed %d kept %s' % (len(acked), elapsed, reply['seed'], dropped))
        sys.stderr.write('[FULL: %s; %d rows, none lost] ' % ('; '.join(notes), len(rows)))

    def test_synchronous_off_loses_acknowledged_commits(self):
        acked = self.run_writer_and_kill('OFF', 300)
        self.assertGreater(self.status()['files']['/db.sqlite-wal']['unsynced_bytes'], 0)
        self.cut('--mode', 'all')
        check, rows = self.rows()
        self.assertEqual(check, 'ok')
        self.assertEqual(rows, list(range(10)))       # only what was durable before: all 300 acked commits lost
        sys.stderr.write('[OFF, mode all: %d commits acked, all lost] ' % len(acked))

    def test_synchronous_off_prefix_cut_keeps_a_prefix_of_the_commits(self):
        durable = self.run_writer_and_kill('FULL', 20)               # leaves a WAL whose directory entry is synced
        acked = self.run_writer_and_kill('OFF', 300, first=1000)    # appends to that WAL, never syncs
        reply = self.cut('--mode', 'prefix', '--seed', '1')
        wal = [f for f in reply['files'] if f['path'] == '/db.sqlite-wal'][0]
        check, rows = self.rows()
        self.assertEqual(check, 'ok')
        self.assertTrue(set(range(10)) | set(durable) <= set(rows))
        kept = [r for r in rows if r >= 1000]
        self.assertEqual(kept, acked[:len(kept)])                    # the commits that survive are a prefix
        if wal['kept_ops'] < wal['unsynced_ops']:
            self.assertLess(len(kept), len(acked))                   # and what the cut dropped is lost
        sys.stderr.write('[OFF, mode prefix seed 1: %d of %d WAL writes kept, %d of %d acked commits survive] '
                         % (wal['kept_ops'], wal['unsynced_ops'], len(kept), len(acked)))

    def test_every_sqlite_commit_on_the_mount_is_durable_and_its_cost_is_printed(self):
        """200 WAL commits with synchronous=FULL: each went through the filesystem's fsync (nothing of the database
        is unsynced afterwards, and a cut loses none), and what a commit costs there and on tmpfs is printed for
        Tests/PowerCut/README.md (a figure, not a check)."""
        def per_commit_ms(directory, n=200):
            path = os.path.join(directory, 'bench.sqlite')
            con = sqlite3.connect(path, isolation_level=None)
            con.execute('PRAGMA journal_mode=WAL')
            con.execute('PRAGMA synchronous=FULL')
            con.execute('CREATE TABLE b (i INTEGER PRIMARY KEY, v BLOB)')
            times = []
            for i in range(n):
                t = time.perf_counter()
                con.execute('BEGIN IMMEDIATE')
                con.execute('INSERT INTO b VALUES (?, ?)', (i, os.urandom(300)))
                con.execute('COMMIT')
                times.append(time.perf_counter() - t)
            con.close()
            times.sort()
            return times[n // 2] * 1000, times[n * 99 // 100] * 1000
        shm = tempfile.mkdtemp(prefix=TMP_PREFIX, dir='/dev/shm' if os.path.isdir('/dev/shm') else None)
        try:
            tmpfs = per_commit_ms(shm)
        finally:
            shutil.rmtree(shm, True)
        mounted = per_commit_ms(self.mnt)
        unsynced = {name: f for name, f in self.status()['files'].items() if name.startswith('/bench.sqlite')}
        self.assertEqual({name: f['unsynced_bytes'] for name, f in unsynced.items() if f['unsynced_bytes']}, {},
                         'a commit returned with bytes the filesystem had not been asked to fsync')
        self.cut('--mode', 'all')
        con = sqlite3.connect(self.p('bench.sqlite'))
        try:
            self.assertEqual(con.execute('SELECT count(*) FROM b').fetchone()[0], 200, 'the cut lost a commit')
        finally:
            con.close()
        sys.stderr.write('[SQLite WAL FULL commit p50/p99: mount %.3f/%.3f ms, tmpfs %.3f/%.3f ms] '
                         % (mounted + tmpfs))


class CLITest(unittest.TestCase):
    """mount without --foreground daemonizes; unmount waits for that process to exit."""

    @unittest.skipIf(fuse_unusable_reason() and not REQUIRED, 'FUSE unusable here')
    def test_background_mount_and_unmount(self):
        PR_SET_CHILD_SUBREAPER = 36  # the daemonized filesystem becomes our child when its parent exits: reap it
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        tmp = tempfile.mkdtemp(prefix=TMP_PREFIX)
        self.addCleanup(shutil.rmtree, tmp, True)
        backing, mnt = os.path.join(tmp, 'b'), os.path.join(tmp, 'm')
        os.mkdir(backing)
        os.mkdir(mnt)
        r = subprocess.run([PY, FS, 'mount', backing, mnt], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        pid = json.loads(r.stdout)['pid']

        def cleanup():
            if mounted(mnt):
                subprocess.run(['umount', '-l', mnt], timeout=10)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        self.addCleanup(cleanup)
        self.assertTrue(os.path.ismount(mnt))
        r2 = subprocess.run([PY, FS, 'mount', backing, mnt], capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r2.returncode, 0)  # already mounted
        with open(os.path.join(mnt, 'f'), 'wb') as f:
            f.write(b'kept by a clean unmount')
        r = subprocess.run([PY, FS, 'unmount', mnt], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(json.loads(r.stdout)['pid'], pid)
        self.assertFalse(mounted(mnt))
        wait_until(lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, 10, 'the filesystem process to exit')
        self.assertEqual(read(os.path.join(backing, 'f')), b'kept by a clean unmount')
        self.assertEqual(os.listdir(os.path.join(backing, '.unsyncedfs')), ['mount.log'])


def tearDownModule():
    with open('/proc/self/mounts') as f:
        left = [line for line in f if TMP_PREFIX in line]
    if left:
        raise AssertionError('mounts left behind: %s' % left)


if __name__ == '__main__':
    unittest.main()
