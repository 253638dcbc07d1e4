#!/usr/bin/python3
"""unsyncedfs: a FUSE passthrough filesystem that forgets unsynced writes on a simulated power cut.

The mount serves a backing directory. Every write, truncate and fallocate of a file since its last successful
fsync/fdatasync is kept in a per-file log; the content as of the last fsync (the "durable image") is a separate file
that each fsync brings up to date by applying the log. Directory entries are durable only once their directory has
been fsynced. A cut (`unsyncedfs.py cut MOUNTPOINT`) throws away what is not durable and leaves the backing
directory holding exactly what a disk would hold after the power came back.

See README.md next to this file for the model, its limits, the CLI and the control protocol.

Usage:
    unsyncedfs.py mount BACKING MOUNTPOINT [--foreground] [--log FILE] [--allow-other]
    unsyncedfs.py cut MOUNTPOINT [--mode all|prefix|torn] [--seed N] [--sector 512|4096] [--wait SEC] [--force]
    unsyncedfs.py inject MOUNTPOINT fsync-eio [--pattern GLOB] [--count N|all]
    unsyncedfs.py inject MOUNTPOINT enospc --after-bytes N
    unsyncedfs.py clear MOUNTPOINT
    unsyncedfs.py sync MOUNTPOINT
    unsyncedfs.py status MOUNTPOINT
    unsyncedfs.py unmount MOUNTPOINT [--timeout SEC] [--lazy]
"""

import argparse
import ctypes
import errno
import fnmatch
import json
import os
import random
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback

CONTROL_NAME = '.unsyncedfs-control'  # the control file, at the root of the mount (not listed by readdir)
STATE_NAME = '.unsyncedfs'            # the state directory, at the root of the backing directory (hidden)
STATE_SUBDIRS = ('i', 'd', 'h', 'stage', 'old')  # keep-alive links, durable images, unlinked open files, cut work
HIDDEN_PREFIX = '.fuse_hidden'        # libfuse renames an open file it unlinks to such a name until its release
CONTROL_INO = 1 << 62                 # st_ino reported for the control file
CTL_FH_BASE = 1 << 48                 # file handles of the control file are numbered from here
MODES = ('all', 'prefix', 'torn')
SECTORS = (512, 4096)


def _err(code, message=None):
    return OSError(code, message or os.strerror(code))


def _pwrite_all(fd, data, offset):
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_libc.fallocate.restype = ctypes.c_int
FALLOC_FL_KEEP_SIZE = 0x01


def _fallocate(fd, mode, offset, length):
    if _libc.fallocate(fd, mode, offset, length) != 0:
        code = ctypes.get_errno()
        raise _err(code)


def _copy_file(src, dst):
    """Copies src's content to a new file dst (reflink or copy_file_range when the filesystem can)."""
    with open(src, 'rb') as fin, open(dst, 'wb') as fout:
        try:
            import fcntl
            fcntl.ioctl(fout.fileno(), 0x40049409, fin.fileno())  # FICLONE
            return
        except OSError:
            pass
        try:
            while os.copy_file_range(fin.fileno(), fout.fileno(), 1 << 30) > 0:
                pass
            return
        except OSError:
            fin.seek(0)
            fout.seek(0)
            fout.truncate()
        shutil.copyfileobj(fin, fout, 1 << 20)


class Inode:
    """A regular file or a directory of the model; `id` is ours, `ino` the backing st_ino while it is live."""

    def __init__(self, ident, kind, st):
        self.id = ident
        self.kind = kind            # 'file' or 'dir'
        self.ino = st.st_ino
        self.mode = st.st_mode
        self.uid = st.st_uid
        self.gid = st.st_gid
        # files
        self.log = []               # unsynced ops since the last fsync: ('w', off, data) ('t', size) ('f', mode, off, len)
        self.log_bytes = 0
        self.image = None           # None: no image, the live content is durable; 'empty': durable content is empty
        self.lost_bytes = 0         # bytes of writes dropped by failed fsyncs (never durable)
        self.lost_ops = 0
        self.opens = 0
        self.durable_refs = 0       # entries naming it in durable directory listings
        self.name = None            # a path it had, for faults and reports
        # directories
        self.listing = {}           # durable entries: name -> ('file', id) | ('dir', id) | ('symlink', target)
        #                                                       | ('special', mode, rdev)


class Handle:
    def __init__(self, fd, ident, path, flags):
        self.fd = fd
        self.id = ident
        self.path = path
        self.flags = flags
        self.stale = False


class ControlHandle:
    def __init__(self):
        self.reply = b''
        self.cursor = 0
        self.lock = threading.Lock()


class CommandError(Exception):
    def __init__(self, message, code=errno.EINVAL):
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise CommandError(message)

    def exit(self, status=0, message=None):
        raise CommandError(message or 'usage error')


def command_parser(prog='unsyncedfs.py', with_mountpoint=False):
    """The command grammar, shared by the CLI and the control file (which takes it without MOUNTPOINT)."""
    cls = argparse.ArgumentParser if with_mountpoint else _Parser
    p = cls(prog=prog, description='unsyncedfs: forget unsynced writes on a simulated power cut')
    sub = p.add_subparsers(dest='command', required=True)

    def mp(sp):
        if with_mountpoint:
            sp.add_argument('mountpoint')
        return sp

    if with_mountpoint:
        m = sub.add_parser('mount', help='mount BACKING at MOUNTPOINT')
        m.add_argument('backing')
        m.add_argument('mountpoint')
        m.add_argument('--foreground', action='store_true', help='serve in this process until unmounted')
        m.add_argument('--log', help='log file (default BACKING/.unsyncedfs/mount.log when not --foreground)')
        m.add_argument('--allow-other', action='store_true', help='let other users use the mount')
        m.add_argument('--timeout', type=float, default=15.0, help='seconds to wait for the mount to come up')
        u = sub.add_parser('unmount', help='unmount and wait for the filesystem process to exit')
        u.add_argument('mountpoint')
        u.add_argument('--timeout', type=float, default=10.0)
        u.add_argument('--lazy', action='store_true', help='umount -l when the mount is busy')

    c = mp(sub.add_parser('cut', help='simulate a power cut'))
    c.add_argument('--mode', choices=MODES, default='all')
    c.add_argument('--seed', type=int)
    c.add_argument('--sector', type=int, choices=SECTORS, default=512)
    c.add_argument('--wait', type=float, default=5.0, help='seconds to wait for open files to be closed')
    c.add_argument('--force', action='store_true', help='cut even with open files; their handles go stale (EIO)')

    i = mp(sub.add_parser('inject', help='inject a fault'))
    isub = i.add_subparsers(dest='fault', required=True)
    fe = isub.add_parser('fsync-eio', help='fail the next fsyncs of matching files with EIO')
    fe.add_argument('--pattern', default='*', help='glob on the path (from the mount root) or the file name')
    fe.add_argument('--count', default='1', help='how many fsyncs fail, or "all" (default 1)')
    en = isub.add_parser('enospc', help='fail writes with ENOSPC once N more bytes have been written')
    en.add_argument('--after-bytes', type=int, required=True)

    mp(sub.add_parser('clear', help='remove every injected fault'))
    mp(sub.add_parser('sync', help='make everything durable now, as sync(2) would'))
    mp(sub.add_parser('status', help='unsynced bytes per file, faults, cuts (JSON)'))
    return p


class UnsyncedFS:
    """The model. Every method that touches the model runs under self._mutex."""

    def __init__(self, backing, mountpoint):
        self.root = os.path.realpath(backing)
        self.mountpoint = os.path.abspath(mountpoint)
        self.state = os.path.join(self.root, STATE_NAME)
        self._mutex = threading.RLock()
        self.next_id = 1
        self.next_fh = 1
        self.handles = {}
        self.ctl_handles = {}
        self.next_ctl = CTL_FH_BASE
        self.cuts = 0
        self.last_cut = None
        self.eio_faults = []        # [{'pattern', 'remaining' (None = all), 'hits'}]
        self.enospc = None          # {'after_bytes', 'used'}
        self.started = time.time()
        self._init_state()

    # ---- logging -------------------------------------------------------------------------------------------

    def log(self, message):
        sys.stderr.write('%s unsyncedfs[%d]: %s\n' % (time.strftime('%H:%M:%S'), os.getpid(), message))
        sys.stderr.flush()

    # ---- state: everything in the backing directory is durable -------------------------------------------

    def _init_state(self):
        os.makedirs(self.state, 0o700, exist_ok=True)
        for sub in STATE_SUBDIRS:
            path = os.path.join(self.state, sub)
            if os.path.lexists(path):
                shutil.rmtree(path)
        for sub in ('i', 'd', 'h'):
            os.mkdir(os.path.join(self.state, sub), 0o700)
        self.hidden = {}            # libfuse's .fuse_hidden* name of an unlinked open file -> its backing path
        self.next_hidden = 1
        self.inodes = {}
        self.by_ino = {}
        root_st = os.lstat(self.root)
        self.dev = root_st.st_dev
        self.root_id = self._new_inode('dir', root_st).id
        self.inodes[self.root_id].name = '/'
        stack = [('/', self.root, self.root_id)]
        while stack:
            rel, path, did = stack.pop()
            listing = {}
            for name in sorted(os.listdir(path)):
                if path == self.root and name == STATE_NAME:
                    continue
                p = os.path.join(path, name)
                entry = self._entry_for(p, os.lstat(p), rel.rstrip('/') + '/' + name)
                listing[name] = entry
                if entry[0] == 'dir':
                    stack.append((rel.rstrip('/') + '/' + name, p, entry[1]))
            self._set_listing(did, listing)

    def _keep(self, ident):
        return os.path.join(self.state, 'i', str(ident))

    def _image(self, ident):
        return os.path.join(self.state, 'd', str(ident))

    def _new_inode(self, kind, st):
        ino = Inode(self.next_id, kind, st)
        self.next_id += 1
        self.inodes[ino.id] = ino
        self.by_ino[st.st_ino] = ino.id
        return ino

    def _register_file(self, path, st, new, rel=None):
        if st.st_dev != self.dev:
            raise _err(errno.EXDEV, 'another filesystem is mounted inside the backing directory')
        ino = self._new_inode('file', st)
        os.link(path, self._keep(ino.id))
        ino.image = 'empty' if new else None
        ino.name = rel
        return ino

    def _entry_for(self, path, st, rel=None, register=True):
        """The durable-listing entry for a live directory entry (registering files and dirs not yet known)."""
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            ident = self.by_ino.get(st.st_ino)
            if ident is None:
                if not register:
                    return None
                if stat.S_ISREG(st.st_mode):
                    ident = self._register_file(path, st, new=False, rel=rel).id
                else:
                    ident = self._new_inode('dir', st).id
                    self.inodes[ident].name = rel
            return ('file' if stat.S_ISREG(st.st_mode) else 'dir', ident)
        if stat.S_ISLNK(st.st_mode):
            return ('symlink', os.readlink(path))
        return ('special', st.st_mode, st.st_rdev)

    def _set_listing(self, did, listing):
        d = self.inodes[did]
        old = d.listing
        for entry in listing.values():
            if entry[0] == 'file':
                self.inodes[entry[1]].durable_refs += 1
        released = []
        for entry in old.values():
            if entry[0] == 'file' and entry[1] in self.inodes:
                self.inodes[entry[1]].durable_refs -= 1
                released.append(entry[1])
        d.listing = listing
        for ident in released:
            self._maybe_gc(ident)

    def _maybe_gc(self, ident):
        """Forgets a file no live name, durable entry or open handle refers to."""
        ino = self.inodes.get(ident)
        if ino is None or ino.kind != 'file' or ino.opens or ino.durable_refs > 0:
            return
        try:
            if os.lstat(self._keep(ident)).st_nlink > 1:
                return
            os.unlink(self._keep(ident))
        except FileNotFoundError:
            pass
        if ino.image == 'file':
            try:
                os.unlink(self._image(ident))
            except FileNotFoundError:
                pass
        del self.inodes[ident]
        if self.by_ino.get(ino.ino) == ident:
            del self.by_ino[ino.ino]

    # ---- paths ------------------------------------------------------------------------------------------------

    def _bp(self, path):
        if path is None:
            raise _err(errno.ENOENT)
        hidden = self.hidden.get(path)
        if hidden is not None:
            return hidden
        first = path[1:].split('/', 1)[0]
        if first in (STATE_NAME, CONTROL_NAME):
            raise _err(errno.ENOENT)
        return self.root if path == '/' else self.root + path

    def _bp_new(self, path):
        first = path[1:].split('/', 1)[0]
        if first in (STATE_NAME, CONTROL_NAME) or os.path.basename(path).startswith(HIDDEN_PREFIX):
            raise _err(errno.EPERM, 'reserved name')
        return self._bp(path)

    def _file_id(self, bp, st, rel):
        ident = self.by_ino.get(st.st_ino)
        if ident is None or self.inodes[ident].kind != 'file':
            ident = self._register_file(bp, st, new=False, rel=rel).id
        return ident

    def _handle(self, fi):
        h = self.handles.get(fi.fh)
        if h is None:
            raise _err(errno.EBADF)
        if h.stale:
            raise _err(errno.EIO, 'handle opened before a forced cut')
        return h

    def _chown_to_caller(self, bp):
        if os.geteuid() != 0:
            return
        try:
            uid, gid, _pid = _fusepy.fuse_get_context()
        except Exception:
            return
        if uid or gid:
            os.lchown(bp, uid, gid)

    # ---- file data ------------------------------------------------------------------------------------------

    def _ensure_image(self, ino):
        """Before the first unsynced change after a mount or cut, the live content is the durable one: copy it."""
        if ino.image is None:
            _copy_file(self._keep(ino.id), self._image(ino.id))
            ino.image = 'file'

    def _apply(self, ino, ops):
        """Applies ops to the durable image (creating it when it is still the implicit empty file)."""
        if ino.image is None:
            if ops:
                raise AssertionError('unsynced ops without a durable image')
            return
        path = self._image(ino.id)
        if ino.image == 'empty':
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))
            ino.image = 'file'
        if not ops:
            return
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            for op in ops:
                if op[0] == 'w':
                    _pwrite_all(fd, op[2], op[1])
                elif op[0] == 't':
                    os.ftruncate(fd, op[1])
                else:
                    _fallocate(fd, op[1], op[2], op[3])
        finally:
            os.close(fd)

    def _record(self, ino, op, nbytes=0):
        ino.log.append(op)
        ino.log_bytes += nbytes

    def _check_enospc(self, n):
        if self.enospc is not None:
            if self.enospc['used'] + n > self.enospc['after_bytes']:
                self.enospc['refused'] += 1
                raise _err(errno.ENOSPC)

    def _charge(self, n):
        if self.enospc is not None:
            self.enospc['used'] += n

    def _fsync_fault(self, path):
        base = os.path.basename(path or '')
        for fault in self.eio_faults:
            if fault['remaining'] == 0:
                continue
            if fnmatch.fnmatchcase(path or '', fault['pattern']) or fnmatch.fnmatchcase(base, fault['pattern']):
                if fault['remaining'] is not None:
                    fault['remaining'] -= 1
                fault['hits'] += 1
                return True
        return False

    # ---- FUSE operations (called with the mutex held) ------------------------------------------------------------

    def op_getattr(self, path, fh=None):
        st = None
        if fh and fh.fh >= CTL_FH_BASE:
            path = '/' + CONTROL_NAME
        elif fh:
            h = self.handles.get(fh.fh)
            if h is not None and not h.stale:
                st = os.fstat(h.fd)
        if st is None:
            if path == '/' + CONTROL_NAME:
                now = int(time.time() * 1e9)
                return {'st_mode': stat.S_IFREG | 0o600, 'st_nlink': 1, 'st_size': 0, 'st_ino': CONTROL_INO,
                        'st_atime': now, 'st_mtime': now, 'st_ctime': now}
            st = os.lstat(self._bp(path))
        nlink = st.st_nlink
        if stat.S_ISREG(st.st_mode) and self.by_ino.get(st.st_ino) is not None:
            nlink -= 1  # the keep-alive link in the state directory
        return {'st_mode': st.st_mode, 'st_ino': st.st_ino, 'st_nlink': nlink, 'st_uid': st.st_uid,
                'st_gid': st.st_gid, 'st_size': st.st_size, 'st_rdev': st.st_rdev, 'st_blocks': st.st_blocks,
                'st_blksize': st.st_blksize, 'st_atime': st.st_atime_ns, 'st_mtime': st.st_mtime_ns,
                'st_ctime': st.st_ctime_ns}

    def op_readlink(self, path):
        return os.readlink(self._bp(path))

    def op_readdir(self, path, fh):
        bp = self._bp(path)
        names = os.listdir(bp)
        if bp == self.root:
            names = [n for n in names if n != STATE_NAME]
        return ['.', '..'] + names

    def op_opendir(self, path):
        self._bp(path)
        return 0

    def op_releasedir(self, path, fh):
        return 0

    def op_fsyncdir(self, path, datasync, fh):
        bp = self._bp(path)
        st = os.lstat(bp)
        did = self.by_ino.get(st.st_ino)
        if did is None or self.inodes[did].kind != 'dir':
            did = self._new_inode('dir', st).id
        rel = path.rstrip('/')
        listing = {}
        for name in os.listdir(bp):
            if bp == self.root and name == STATE_NAME:
                continue
            p = os.path.join(bp, name)
            try:
                listing[name] = self._entry_for(p, os.lstat(p), rel + '/' + name)
            except FileNotFoundError:
                continue
        self._set_listing(did, listing)
        return 0

    def op_mkdir(self, path, mode):
        bp = self._bp_new(path)
        os.mkdir(bp, mode)
        self._chown_to_caller(bp)
        st = os.lstat(bp)
        ino = self._new_inode('dir', st)
        ino.name = path
        return 0

    def op_rmdir(self, path):
        bp = self._bp(path)
        st = os.lstat(bp)
        os.rmdir(bp)
        self._forget_dir_ino(st.st_ino)
        return 0

    def _forget_dir_ino(self, st_ino):
        ident = self.by_ino.get(st_ino)
        if ident is not None and self.inodes[ident].kind == 'dir':
            del self.by_ino[st_ino]  # the dir record stays: durable listings may still name it

    def op_unlink(self, path):
        bp = self._bp(path)
        st = os.lstat(bp)
        os.unlink(bp)
        self.hidden.pop(path, None)
        if stat.S_ISREG(st.st_mode):
            ident = self.by_ino.get(st.st_ino)
            if ident is not None:
                self._maybe_gc(ident)
        return 0

    def op_rename(self, old, new):
        if os.path.basename(new).startswith(HIDDEN_PREFIX):
            # libfuse unlinking an open file: its name goes now (as for unlink); the file lives on, out of the tree,
            # until the last handle is released and libfuse unlinks the hidden name.
            bold = self._bp(old)
            dst = os.path.join(self.state, 'h', str(self.next_hidden))
            self.next_hidden += 1
            os.rename(bold, dst)
            self.hidden[new] = dst
            return 0
        bold, bnew = self._bp(old), self._bp_new(new)
        try:
            replaced = os.lstat(bnew)
        except FileNotFoundError:
            replaced = None
        moved = os.lstat(bold)
        os.rename(bold, bnew)
        ident = self.by_ino.get(moved.st_ino)
        if ident is not None:
            self.inodes[ident].name = new
        if replaced is not None and replaced.st_ino != moved.st_ino:
            if stat.S_ISREG(replaced.st_mode):
                rid = self.by_ino.get(replaced.st_ino)
                if rid is not None:
                    self._maybe_gc(rid)
            elif stat.S_ISDIR(replaced.st_mode):
                self._forget_dir_ino(replaced.st_ino)
        return 0

    def op_link(self, target, source):
        bsrc, bdst = self._bp(source), self._bp_new(target)
        os.link(bsrc, bdst)
        st = os.lstat(bdst)
        if stat.S_ISREG(st.st_mode):
            self._file_id(bdst, st, target)
        return 0

    def op_symlink(self, target, source):
        bdst = self._bp_new(target)
        os.symlink(source, bdst)
        self._chown_to_caller(bdst)
        return 0

    def op_mknod(self, path, mode, dev):
        bp = self._bp_new(path)
        if stat.S_ISREG(mode):
            fd = os.open(bp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, stat.S_IMODE(mode))
            try:
                self._chown_to_caller(bp)
                self._register_file(bp, os.fstat(fd), new=True, rel=path)
            finally:
                os.close(fd)
        elif stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            os.mknod(bp, mode, dev)
            self._chown_to_caller(bp)
        else:
            raise _err(errno.EPERM, 'device nodes are not supported')
        return 0

    def op_chmod(self, path, mode):
        bp = self._bp(path)
        os.chmod(bp, stat.S_IMODE(mode))
        st = os.lstat(bp)
        ident = self.by_ino.get(st.st_ino)
        if ident is not None:
            self.inodes[ident].mode = st.st_mode
        return 0

    def op_chown(self, path, uid, gid):
        bp = self._bp(path)
        os.lchown(bp, uid, gid)
        st = os.lstat(bp)
        ident = self.by_ino.get(st.st_ino)
        if ident is not None:
            self.inodes[ident].uid, self.inodes[ident].gid = st.st_uid, st.st_gid
        return 0

    def op_utimens(self, path, times=None):
        bp = self._bp(path)
        if times:
            os.utime(bp, ns=(int(times[0]), int(times[1])), follow_symlinks=False)
        else:
            os.utime(bp, follow_symlinks=False)
        return 0

    def op_statfs(self, path):
        sv = os.statvfs(self.root)
        return {key: getattr(sv, key) for key in ('f_bsize', 'f_frsize', 'f_blocks', 'f_bfree', 'f_bavail',
                                                   'f_files', 'f_ffree', 'f_favail', 'f_flag', 'f_namemax')}

    def _new_handle(self, fd, ident, path, flags):
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = Handle(fd, ident, path, flags)
        ino = self.inodes[ident]
        ino.opens += 1
        ino.name = path
        return fh

    def op_open(self, path, fi):
        bp = self._bp(path)
        flags = fi.flags
        writable = (flags & os.O_ACCMODE) != os.O_RDONLY
        fd = os.open(bp, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _err(errno.EINVAL, 'not a regular file')
            ident = self._file_id(bp, st, path)
            if writable and flags & os.O_TRUNC and st.st_size:
                ino = self.inodes[ident]
                self._ensure_image(ino)
                os.ftruncate(fd, 0)
                self._record(ino, ('t', 0))
        except BaseException:
            os.close(fd)
            raise
        fi.fh = self._new_handle(fd, ident, path, flags)
        fi.direct_io = 0
        fi.keep_cache = 0  # the kernel drops this file's cached pages at every open
        return 0

    def op_create(self, path, mode, fi):
        bp = self._bp_new(path)
        try:
            fd = os.open(bp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, stat.S_IMODE(mode))
        except FileExistsError:
            if fi.flags & os.O_EXCL:
                raise
            return self.op_open(path, fi)
        try:
            self._chown_to_caller(bp)
            st = os.fstat(fd)
            ident = self._register_file(bp, st, new=True, rel=path).id
        except BaseException:
            os.close(fd)
            raise
        fi.fh = self._new_handle(fd, ident, path, fi.flags)
        fi.direct_io = 0
        fi.keep_cache = 0
        return 0

    def op_read(self, path, size, offset, fi):
        return os.pread(self._handle(fi).fd, size, offset)

    def op_write(self, path, data, offset, fi):
        h = self._handle(fi)
        self._check_enospc(len(data))
        ino = self.inodes[h.id]
        self._ensure_image(ino)
        n = os.pwrite(h.fd, data, offset)
        if n:
            self._record(ino, ('w', offset, data if n == len(data) else data[:n]), n)
            self._charge(n)
        return n

    def op_truncate(self, path, length, fh=None):
        if fh:
            h = self._handle(fh)
            ino = self.inodes[h.id]
            self._ensure_image(ino)
            os.ftruncate(h.fd, length)
        else:
            bp = self._bp(path)
            st = os.lstat(bp)
            if not stat.S_ISREG(st.st_mode):
                raise _err(errno.EINVAL)
            ino = self.inodes[self._file_id(bp, st, path)]
            self._ensure_image(ino)
            os.truncate(bp, length)
        self._record(ino, ('t', length))
        return 0

    def op_fallocate(self, path, mode, offset, length, fi):
        if mode & ~FALLOC_FL_KEEP_SIZE:
            raise _err(errno.EOPNOTSUPP, 'only fallocate modes 0 and FALLOC_FL_KEEP_SIZE are supported')
        h = self._handle(fi)
        self._check_enospc(length)
        ino = self.inodes[h.id]
        self._ensure_image(ino)
        _fallocate(h.fd, mode, offset, length)
        self._record(ino, ('f', mode, offset, length))
        self._charge(length)
        return 0

    def op_flush(self, path, fi):
        return 0

    def op_fsync(self, path, datasync, fi):
        h = self._handle(fi)
        ino = self.inodes[h.id]
        if path is not None:
            h.path = path
        if self._fsync_fault(h.path):
            # As on Linux after a failed writeback: the pages are marked clean, so these writes never reach the disk
            # and a later successful fsync does not write them either. The live view still shows them.
            ino.lost_bytes += ino.log_bytes
            ino.lost_ops += len(ino.log)
            self.log('fsync of %s fails with EIO (injected); %d unsynced bytes are lost'
                     % (h.path, ino.log_bytes))
            ino.log, ino.log_bytes = [], 0
            raise _err(errno.EIO)
        self._apply(ino, ino.log)
        ino.log, ino.log_bytes = [], 0
        return 0

    def op_release(self, path, fi):
        h = self.handles.pop(fi.fh, None)
        if h is None or h.stale:
            return 0
        os.close(h.fd)
        ino = self.inodes.get(h.id)
        if ino is not None:
            ino.opens -= 1
            self._maybe_gc(h.id)
        return 0

    # ---- the control file -------------------------------------------------------------------------------------

    def ctl_open(self, fi):
        with self._mutex:
            fh = self.next_ctl
            self.next_ctl += 1
            self.ctl_handles[fh] = ControlHandle()
        fi.fh = fh
        fi.direct_io = 1
        fi.keep_cache = 0
        return 0

    def ctl_write(self, data, fi):
        c = self.ctl_handles.get(fi.fh)
        if c is None:
            raise _err(errno.EBADF)
        with c.lock:
            line = data.decode('utf-8', 'replace').strip()
            code = 0
            try:
                reply = self.execute(line)
            except CommandError as e:
                reply = {'ok': False, 'error': str(e), 'errno': errno.errorcode.get(e.code, str(e.code))}
                code = e.code
            except Exception as e:  # report, never crash the mount
                self.log('command %r failed: %s' % (line, traceback.format_exc()))
                reply = {'ok': False, 'error': '%s: %s' % (type(e).__name__, e), 'errno': 'EIO'}
                code = errno.EIO
            c.reply = (json.dumps(reply, sort_keys=True) + '\n').encode()
            c.cursor = 0
        if code:
            raise _err(code)
        return len(data)

    def ctl_read(self, size, fi):
        c = self.ctl_handles.get(fi.fh)
        if c is None:
            raise _err(errno.EBADF)
        with c.lock:
            chunk = c.reply[c.cursor:c.cursor + size]
            c.cursor += len(chunk)
            return chunk

    def ctl_release(self, fi):
        self.ctl_handles.pop(fi.fh, None)
        return 0

    def execute(self, line):
        try:
            words = shlex.split(line)
        except ValueError as e:
            raise CommandError(str(e))
        if not words:
            raise CommandError('empty command')
        args = command_parser().parse_args(words)
        if args.command == 'status':
            with self._mutex:
                return self.status()
        if args.command == 'cut':
            return self.cut(args.mode, args.seed, args.sector, args.wait, args.force)
        if args.command == 'inject':
            with self._mutex:
                if args.fault == 'fsync-eio':
                    if args.count == 'all':
                        count = None
                    else:
                        try:
                            count = int(args.count)
                        except ValueError:
                            raise CommandError('--count takes a number or "all"')
                        if count < 1:
                            raise CommandError('--count must be at least 1')
                    self.eio_faults.append({'pattern': args.pattern, 'remaining': count, 'hits': 0})
                else:
                    if args.after_bytes < 0:
                        raise CommandError('--after-bytes must be >= 0')
                    self.enospc = {'after_bytes': args.after_bytes, 'used': 0, 'refused': 0}
                self.log('inject %s' % line)
                return {'ok': True, 'faults': self._faults()}
        if args.command == 'clear':
            with self._mutex:
                self.eio_faults, self.enospc = [], None
                self.log('faults cleared')
                return {'ok': True, 'faults': self._faults()}
        if args.command == 'sync':
            with self._mutex:
                return self.sync_all()
        raise CommandError('unknown command %r' % args.command)

    def _faults(self):
        return {'fsync_eio': [dict(f) for f in self.eio_faults],
                'enospc': dict(self.enospc) if self.enospc else None}

    # ---- status ------------------------------------------------------------------------------------------------

    def _walk_live(self):
        """Yields (relpath, backing path, lstat) for every live entry, parents first."""
        stack = [('', self.root)]
        while stack:
            rel, path = stack.pop()
            for name in sorted(os.listdir(path)):
                if path == self.root and name == STATE_NAME:
                    continue
                p = os.path.join(path, name)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    continue
                yield rel + '/' + name, p, st
                if stat.S_ISDIR(st.st_mode):
                    stack.append((rel + '/' + name, p))

    def _live_names(self):
        names = {}
        for rel, _p, st in self._walk_live():
            if stat.S_ISREG(st.st_mode):
                ident = self.by_ino.get(st.st_ino)
                if ident is not None:
                    names.setdefault(ident, rel)
        return names

    def _unsynced_dirs(self):
        out = []
        dirs = [('/', self.root)] + [(rel, p) for rel, p, st in self._walk_live() if stat.S_ISDIR(st.st_mode)]
        for rel, p in dirs:
            st = os.lstat(p)
            did = self.by_ino.get(st.st_ino)
            if did is None:
                out.append(rel)
                continue
            live = {}
            for name in os.listdir(p):
                if p == self.root and name == STATE_NAME:
                    continue
                q = os.path.join(p, name)
                try:
                    live[name] = self._entry_for(q, os.lstat(q), register=False)
                except FileNotFoundError:
                    continue
            if live != self.inodes[did].listing:
                out.append(rel)
        return out

    def status(self):
        names = self._live_names()
        files = {}
        total = 0
        for ino in self.inodes.values():
            if ino.kind != 'file' or not (ino.log or ino.lost_bytes):
                continue
            name = names.get(ino.id) or '(unlinked #%d, was %s)' % (ino.id, ino.name)
            files[name] = {'unsynced_bytes': ino.log_bytes, 'unsynced_ops': len(ino.log),
                           'lost_bytes': ino.lost_bytes}
            total += ino.log_bytes
        return {'ok': True, 'pid': os.getpid(), 'backing': self.root, 'mountpoint': self.mountpoint,
                'cuts': self.cuts, 'last_cut': self.last_cut, 'faults': self._faults(),
                'open_handles': sum(1 for h in self.handles.values() if not h.stale), 'files': files, 'unsynced_bytes': total,
                'unsynced_dirs': self._unsynced_dirs(), 'uptime_s': round(time.time() - self.started, 3)}

    def sync_all(self):
        synced = 0
        for ino in list(self.inodes.values()):
            if ino.kind == 'file' and ino.log:
                synced += ino.log_bytes
                self._apply(ino, ino.log)
                ino.log, ino.log_bytes = [], 0
        for rel, p, st in [('/', self.root, os.lstat(self.root))] + list(self._walk_live()):
            if stat.S_ISDIR(st.st_mode):
                self.op_fsyncdir(rel, 0, None)
        self.log('sync: %d bytes made durable' % synced)
        return {'ok': True, 'synced_bytes': synced}

    # ---- the power cut ---------------------------------------------------------------------------------------

    def cut(self, mode, seed, sector, wait, force):
        if seed is None:
            seed = int.from_bytes(os.urandom(4), 'little')
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            with self._mutex:
                busy = sorted({h.path or '?' for h in self.handles.values() if not h.stale})
                if not busy or force:
                    return self._cut_locked(mode, seed, sector, busy)
            if time.monotonic() >= deadline:
                raise CommandError('files are still open: %s (stop the processes using the mount, or cut --force)'
                                   % ', '.join(busy[:10]), errno.EBUSY)
            time.sleep(0.01)

    def _durable_plan(self):
        """The durable tree: [(relpath, entry)], parents before children."""
        plan = []
        visited = {self.root_id}
        stack = [('', self.root_id)]
        while stack:
            rel, did = stack.pop()
            for name, entry in sorted(self.inodes[did].listing.items()):
                p = rel + '/' + name
                if entry[0] == 'dir':
                    if entry[1] in visited or entry[1] not in self.inodes:
                        continue  # per-directory durability can put a directory in two places; keep the first
                    visited.add(entry[1])
                    stack.append((p, entry[1]))
                plan.append((p, entry))
        return plan

    def _cut_locked(self, mode, seed, sector, busy):
        started = time.monotonic()
        stale = 0
        for h in self.handles.values():
            if not h.stale:
                os.close(h.fd)
                h.stale = True
                stale += 1
        live_paths = {rel for rel, _p, _st in self._walk_live()}
        plan = self._durable_plan()
        durable_paths = {p for p, _e in plan}

        # File contents: the durable image plus the kept prefix of the unsynced log.
        sources = {}
        reports = []
        first_path = {}
        for p, entry in plan:
            if entry[0] == 'file':
                first_path.setdefault(entry[1], p)
        for ident, p in sorted(first_path.items()):
            ino = self.inodes[ident]
            if ino.image is None:
                sources[ident] = self._keep(ident)
                continue
            log = ino.log
            n = len(log)
            rng = random.Random('%d/%s' % (seed, p))
            k = 0 if mode == 'all' or n == 0 else rng.randint(0, n)
            ops = list(log[:k])
            torn = None
            if mode == 'torn' and k > 0 and ops[-1][0] == 'w':
                off, data = ops[-1][1], ops[-1][2]
                first = (off // sector + 1) * sector
                if first < off + len(data):
                    count = (off + len(data) - 1 - first) // sector + 1
                    boundary = first + rng.randrange(count) * sector
                    ops[-1] = ('w', off, data[:boundary - off])
                    torn = {'offset': off, 'length': len(data), 'kept': boundary - off}
            self._apply(ino, ops)
            img = self._image(ident)
            kst = os.lstat(self._keep(ident))
            os.chmod(img, stat.S_IMODE(kst.st_mode))
            os.chown(img, kst.st_uid, kst.st_gid)
            sources[ident] = img
            if n or ino.lost_bytes:
                kept_bytes = sum(len(op[2]) for op in ops if op[0] == 'w')
                reports.append({'path': p, 'unsynced_ops': n, 'kept_ops': k, 'kept_bytes': kept_bytes,
                                'dropped_bytes': ino.log_bytes - kept_bytes, 'torn': torn,
                                'lost_bytes': ino.lost_bytes})

        # The durable namespace, built beside the live tree, then swapped in.
        stage = os.path.join(self.state, 'stage')
        old = os.path.join(self.state, 'old')
        os.mkdir(stage, 0o700)
        for p, entry in plan:
            dst = stage + p
            kind = entry[0]
            if kind == 'dir':
                d = self.inodes[entry[1]]
                os.mkdir(dst)
                os.chmod(dst, stat.S_IMODE(d.mode))
                os.lchown(dst, d.uid, d.gid)
            elif kind == 'file':
                os.link(sources[entry[1]], dst)
            elif kind == 'symlink':
                os.symlink(entry[1], dst)
            else:
                os.mknod(dst, entry[1], entry[2])
        os.mkdir(old, 0o700)
        for name in os.listdir(self.root):
            if name != STATE_NAME:
                os.rename(os.path.join(self.root, name), os.path.join(old, name))
        for name in os.listdir(stage):
            os.rename(os.path.join(stage, name), os.path.join(self.root, name))
        self.handles = {fh: h for fh, h in self.handles.items() if h.stale}
        self._init_state()  # removes old, stage, the images and keep-alive links; all that is left is durable

        self.cuts += 1
        self.last_cut = {'cut': self.cuts, 'mode': mode, 'seed': seed, 'sector': sector, 'files': reports,
                         'removed': sorted(live_paths - durable_paths)[:200],
                         'restored': sorted(durable_paths - live_paths)[:200],
                         'stale_handles': stale, 'open_at_cut': busy[:50],
                         'elapsed_ms': round((time.monotonic() - started) * 1000, 2)}
        self.log('cut #%d mode=%s seed=%d sector=%d: %d file(s) with unsynced data, %d path(s) removed, '
                 '%d restored' % (self.cuts, mode, seed, sector, len(reports), len(live_paths - durable_paths),
                                  len(durable_paths - live_paths)))
        return dict({'ok': True}, **self.last_cut)


# ---- the FUSE side (fusepy: libfuse 2's high-level, path-based API) -------------------------------------------

_fusepy = None

FUSE_OPS = ('getattr', 'readlink', 'mknod', 'mkdir', 'unlink', 'rmdir', 'symlink', 'rename', 'link', 'chmod',
            'chown', 'truncate', 'open', 'read', 'write', 'statfs', 'flush', 'release', 'fsync', 'opendir',
            'readdir', 'releasedir', 'fsyncdir', 'create', 'utimens', 'fallocate')
# Not provided on purpose: lock and flock (the kernel then keeps POSIX and flock locks itself, which is what SQLite
# and lockstepd's journal.lock need on one machine), xattrs, access (the kernel checks default_permissions).
CTL_OPS = ('read', 'write', 'release', 'flush', 'fsync', 'truncate', 'getattr', 'fallocate')


def _load_fusepy():
    global _fusepy
    if _fusepy is not None:
        return _fusepy
    try:
        import fusepy as mod          # Debian's python3-fusepy
    except ImportError:
        import fuse as mod            # pip's fusepy
    if not any(f[0] == 'fallocate' for f in mod.fuse_operations._fields_):
        # fusepy 3.0.1 stops its struct at ioctl; libfuse 2.9 goes on with poll, write_buf, read_buf, flock and
        # fallocate. Extend it so that fallocate can be served (flock stays NULL: the kernel does flock locally).
        class fuse_operations(ctypes.Structure):
            _fields_ = list(mod.fuse_operations._fields_) + [
                ('poll', ctypes.c_void_p),
                ('write_buf', ctypes.c_void_p),
                ('read_buf', ctypes.c_void_p),
                ('flock', ctypes.c_void_p),
                ('fallocate', ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int, mod.c_off_t,
                                               mod.c_off_t, ctypes.POINTER(mod.fuse_file_info))),
            ]
        mod.fuse_operations = fuse_operations
    _fusepy = mod
    return mod


class FuseOps:
    """fusepy's operations object: registers the ops named in FUSE_OPS and forwards each to the model."""
    use_ns = True
    flag_nullpath_ok = 1  # an op on an open handle whose path libfuse cannot name still reaches us (path None)

    def __init__(self, model):
        self.m = model
        self.trace = os.environ.get('UNSYNCEDFS_TRACE') == '1'

    def __call__(self, op, *args):
        m = self.m
        if self.trace:
            shown = [a if isinstance(a, (str, int)) or a is None else
                     ('<%d bytes>' % len(a) if isinstance(a, bytes) else '<fi %s>' % getattr(a, 'fh', '?'))
                     for a in args]
            m.log('op %s %s' % (op, ' '.join(map(str, shown))))
        try:
            if op in CTL_OPS:
                fi = self._fi(op, args)
                if fi and fi.fh >= CTL_FH_BASE:
                    if op == 'read':
                        return m.ctl_read(args[1], fi)
                    if op == 'write':
                        return m.ctl_write(args[1], fi)
                    if op == 'release':
                        return m.ctl_release(fi)
                    if op == 'getattr':
                        return m.op_getattr(args[0], fi)
                    return 0
            if op == 'open' and args[0] == '/' + CONTROL_NAME:
                return m.ctl_open(args[1])
            if op in ('unlink', 'rename', 'link', 'chmod', 'chown', 'truncate', 'utimens') and \
                    args[0] == '/' + CONTROL_NAME:
                return 0 if op == 'truncate' else self._raise(errno.EPERM)
            with m._mutex:
                return getattr(m, 'op_' + op)(*args)
        except OSError:
            raise
        except Exception:
            m.log('%s%r failed:\n%s' % (op, args[:1], traceback.format_exc()))
            raise _err(errno.EIO)

    @staticmethod
    def _raise(code):
        raise _err(code)

    @staticmethod
    def _fi(op, args):
        if op in ('read', 'fallocate'):
            fi = args[-1]
        elif op in ('write',):
            fi = args[3]
        elif op in ('release', 'flush'):
            fi = args[1]
        elif op == 'fsync':
            fi = args[2]
        else:  # truncate(path, length, fh=None), getattr(path, fh=None)
            fi = args[-1] if len(args) == (3 if op == 'truncate' else 2) else None
        return fi if fi else None


for _name in FUSE_OPS:
    setattr(FuseOps, _name, True)  # fusepy registers an op when the operations object has the attribute


def serve(backing, mountpoint, allow_other=False):
    """Mounts and serves in this process until unmounted (SIGTERM/SIGINT unmount too)."""
    mod = _load_fusepy()

    class _FUSE(mod.FUSE):
        def fallocate(self, path, mode, offset, length, fip):
            return self.operations('fallocate', self._decode_optional_path(path), mode, offset, length,
                                   fip.contents)

    os.umask(0)
    if not os.path.isdir(backing):
        raise SystemExit('unsyncedfs: %s is not a directory' % backing)
    if not os.path.isdir(mountpoint):
        raise SystemExit('unsyncedfs: %s is not a directory' % mountpoint)
    if _mount_entry(os.path.realpath(mountpoint)):
        raise SystemExit('unsyncedfs: %s is already a mount point' % mountpoint)
    model = UnsyncedFS(backing, mountpoint)
    model.log('serving %s at %s (pid %d)' % (model.root, model.mountpoint, os.getpid()))
    # fsname unsyncedfs.PID: /proc/mounts names the process serving the mount, for unmount (even when it hangs)
    options = dict(foreground=True, nothreads=False, raw_fi=True, fsname='unsyncedfs.%d' % os.getpid(),
                   subtype='unsyncedfs',
                   default_permissions=True, use_ino=True, big_writes=True, max_write=131072,
                   entry_timeout=0, negative_timeout=0, attr_timeout=0)
    if allow_other:
        options['allow_other'] = True
    import logging
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        _FUSE(FuseOps(model), mountpoint, **options)
    finally:
        # A clean unmount is a clean shutdown: the backing directory keeps the live view; the model goes.
        for sub in STATE_SUBDIRS:
            shutil.rmtree(os.path.join(model.state, sub), ignore_errors=True)
    model.log('unmounted %s' % model.mountpoint)


# ---- the client side ---------------------------------------------------------------------------------------------

def control(mountpoint, command):
    """Sends one command through MOUNTPOINT/.unsyncedfs-control; returns the decoded JSON reply."""
    path = os.path.join(mountpoint, CONTROL_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            os.write(fd, command.encode() + b'\n')
        except OSError:
            pass  # the reply says why
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    data = b''.join(chunks)
    if not data:
        return {'ok': False, 'error': 'no reply from %s' % path}
    return json.loads(data)


def _alive(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _umount(mountpoint, lazy=False):
    """(ok, message). Root: umount(8); otherwise fusermount3/fusermount."""
    attempts = []
    if os.geteuid() == 0:
        attempts.append(['umount'] + (['-l'] if lazy else []) + [mountpoint])
    for tool in ('fusermount3', 'fusermount'):
        if shutil.which(tool):
            attempts.append([tool, '-u'] + (['-z'] if lazy else []) + [mountpoint])
    message = 'no umount tool'
    for argv in attempts:
        if not shutil.which(argv[0]):
            continue
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        if r.returncode == 0:
            return True, ''
        message = (r.stderr or r.stdout).strip()
        if not os.path.ismount(mountpoint):
            return True, ''
    return False, message


def cmd_mount(args):
    backing = os.path.abspath(args.backing)
    mountpoint = os.path.abspath(args.mountpoint)
    if args.foreground:
        if args.log:
            fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 2)
            os.close(fd)
        serve(backing, mountpoint, args.allow_other)
        return 0
    if _mount_entry(os.path.realpath(mountpoint)):
        print('unsyncedfs: %s is already a mount point' % mountpoint, file=sys.stderr)
        return 1
    log = args.log or os.path.join(backing, STATE_NAME, 'mount.log')
    if not args.log:
        os.makedirs(os.path.dirname(log), exist_ok=True)
    argv = [sys.executable, os.path.abspath(__file__), 'mount', backing, mountpoint, '--foreground']
    if args.allow_other:
        argv.append('--allow-other')
    with open(log, 'ab') as logf:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                close_fds=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log, 'rb') as f:
                tail = f.read()[-2000:].decode('utf-8', 'replace')
            print('unsyncedfs: the filesystem process exited with %s; its log (%s):\n%s'
                  % (proc.returncode, log, tail), file=sys.stderr)
            return 1
        if os.path.ismount(mountpoint):
            try:
                reply = control(mountpoint, 'status')
                if reply.get('ok'):
                    print(json.dumps({'ok': True, 'pid': proc.pid, 'mountpoint': mountpoint, 'backing': backing,
                                      'log': log}))
                    return 0
            except OSError:
                pass
        time.sleep(0.02)
    print('unsyncedfs: %s did not come up within %.0f s; stopping pid %d' % (mountpoint, args.timeout, proc.pid),
          file=sys.stderr)
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
    if _mount_entry(os.path.realpath(mountpoint)):
        _umount(mountpoint, lazy=True)
    return 1


def _mount_entry(mountpoint):
    """(source, fstype) of the mount at mountpoint from /proc/self/mounts (also for a dead FUSE mount, which
    os.path.ismount cannot stat), or None."""
    found = None
    with open('/proc/self/mounts') as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 3:
                target = re.sub(r'\\([0-7]{3})', lambda m: chr(int(m.group(1), 8)), fields[1])
                if target == mountpoint:
                    found = (fields[0], fields[2])
    return found


def cmd_unmount(args):
    mountpoint = os.path.realpath(args.mountpoint)
    entry = _mount_entry(mountpoint)
    if entry is None:
        print(json.dumps({'ok': True, 'note': 'not mounted'}))
        return 0
    if entry[1] != 'fuse.unsyncedfs':
        print(json.dumps({'ok': False, 'error': '%s is a %s mount, not unsyncedfs' % (mountpoint, entry[1])}))
        return 1
    pid = int(entry[0].rsplit('.', 1)[1]) if entry[0].startswith('unsyncedfs.') else None  # fsname unsyncedfs.PID
    ok, message = _umount(mountpoint)
    if not ok and (args.lazy or pid is None or not _alive(pid) or 'not connected' in message):
        ok, message = _umount(mountpoint, lazy=True)
    if not ok:
        print(json.dumps({'ok': False, 'error': 'cannot unmount %s: %s (files still open? --lazy detaches it '
                                                'anyway)' % (mountpoint, message)}))
        return 1
    if pid:
        deadline = time.monotonic() + args.timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if _alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 2
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    print(json.dumps({'ok': True, 'pid': pid}))
    return 0


def main(argv=None):
    args = command_parser(with_mountpoint=True).parse_args(argv)
    if args.command == 'mount':
        return cmd_mount(args)
    if args.command == 'unmount':
        return cmd_unmount(args)
    words = list(sys.argv[1:] if argv is None else argv)
    words.remove(args.mountpoint)  # the rest is the command, in the control file's grammar
    try:
        reply = control(args.mountpoint, ' '.join(shlex.quote(w) for w in words))
    except OSError as e:
        print(json.dumps({'ok': False, 'error': 'cannot reach %s: %s' % (args.mountpoint, e)}))
        return 1
    print(json.dumps(reply, sort_keys=True))
    if args.command == 'cut' and reply.get('ok'):
        print('unsyncedfs: cut #%d mode=%s seed=%d' % (reply['cut'], reply['mode'], reply['seed']), file=sys.stderr)
    if not reply.get('ok'):
        print('unsyncedfs: %s' % reply.get('error'), file=sys.stderr)
    return 0 if reply.get('ok') else 1


if __name__ == '__main__':
    sys.exit(main())
