"""How long a process's threads waited: on memory reclaim, on refaulted pages, on block I/O.

The kernel's delay accounting, read per process through taskstats (generic
netlink family ``"TASKSTATS"``, ``TASKSTATS_CMD_GET`` with
``TASKSTATS_CMD_ATTR_TGID``): the sums over every thread of the process, live
or exited, so it is the process's own figure, not the machine's (as
``/proc/pressure/memory`` is under cgroup v1); ``thread_delays`` asks for one
thread (``TASKSTATS_CMD_ATTR_PID`` with its native id), e.g. the reader apart
from a pool whose waits on I/O are its work::

    with delay_accounting():                 # kernel.task_delayacct on, the old value back after
        child = subprocess.Popen(...)         # a process started with accounting on, which then runs:
            before = process_delays()         #   its own delays (all its threads)
            ...                               #   it reads
            spent = process_delays() - before
            spent.share("reclaim", seconds)   #   thread-seconds in direct reclaim per second of wall time

* ``reclaim``: waiting in direct reclaim for free pages (``freepages_delay_total``),
  a cgroup at its limit included;
* ``thrashing``: waiting on a page that was evicted and is read again
  (``thrashing_delay_total``, the kernel's workingset refaults);
* ``blkio``: waiting on synchronous block I/O (``blkio_delay_total``).  The
  kernel closes this wait when another task wakes the sleeper, and on 6.18 a
  few of 16 new threads reading at once were charged the machine's uptime
  for one wait each (a wait timed from 0): trust a total of one thread's
  reads; for many threads, look at the count.

Each in nanoseconds with its count of waits.  Summed over threads, a share of
wall time can exceed 1 (sixteen threads waiting at once count sixteen times).
The counters only run while ``/proc/sys/kernel/task_delayacct`` is 1 (the
whole machine's setting), and only for threads created while it was 1 (the
kernel gives a task its delay record when it forks: Linux 6.18 does): turn
it on, then start the process to measure (a thread started before reads 0,
which cannot be told from "no waits").  A figure the kernel does not offer
is None, with ``Delays.reason`` saying why (not root, no taskstats,
accounting off, a struct too old for the field).
"""
from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator, Optional, Tuple

from pixfeed.errors import PixfeedError

TASK_DELAYACCT = Path("/proc/sys/kernel/task_delayacct")
NETLINK_GENERIC = 16
GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 0x10, 3, 1, 2
NLMSG_ERROR, NLM_F_REQUEST = 2, 1
TASKSTATS_CMD_GET, TASKSTATS_CMD_ATTR_PID, TASKSTATS_CMD_ATTR_TGID = 1, 1, 2
TASKSTATS_TYPE_STATS, TASKSTATS_TYPE_AGGR_PID, TASKSTATS_TYPE_AGGR_TGID = 3, 4, 5
NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port
GENL = struct.Struct("=BBH")  # command, version, reserved
NLA = struct.Struct("=HH")  # length, type
# struct taskstats (include/uapi/linux/taskstats.h): fields are only ever appended, and version 2 on (Linux
# 2.6.20) share this layout; the offset of each kind's __u64 count, its __u64 delay total right after it
OFFSETS = {"reclaim": 312, "thrashing": 328, "blkio": 32}  # freepages_count, thrashing_count, blkio_count
LAYOUT_VERSION = 2


class TaskstatsReplyError(PixfeedError, ValueError):
    """A taskstats reply that does not parse (short, truncated, or without the statistics)."""


@dataclass(frozen=True)
class Delays:
    """A process's delay totals (ns) and counts; None where not offered, ``reason`` saying why."""
    reclaim_ns: Optional[int] = None
    reclaim_count: Optional[int] = None
    thrashing_ns: Optional[int] = None
    thrashing_count: Optional[int] = None
    blkio_ns: Optional[int] = None
    blkio_count: Optional[int] = None
    version: Optional[int] = None  # of the kernel's struct taskstats
    reason: Optional[str] = None

    def __sub__(self, earlier: "Delays") -> "Delays":
        """What accrued since ``earlier`` (None where either has no figure)."""
        diff = {f.name: None if getattr(self, f.name) is None or getattr(earlier, f.name) is None
                else getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)[:6]}
        return Delays(**diff, version=self.version, reason=self.reason or earlier.reason)

    def share(self, kind: str, seconds: float) -> Optional[float]:
        """Thread-seconds of ``kind`` ("reclaim", "thrashing", "blkio") per second of ``seconds``."""
        total = getattr(self, f"{kind}_ns")
        return None if total is None else total / 1e9 / max(seconds, 1e-9)


def _attributes(data: bytes, start: int, end: int) -> Iterator[Tuple[int, int, int]]:
    """(type, payload start, payload end) of each netlink attribute in ``data[start:end]``."""
    while start + NLA.size <= end:
        length, kind = NLA.unpack_from(data, start)
        if length < NLA.size or start + length > end:
            raise TaskstatsReplyError(f"netlink attribute of type {kind} at byte {start} says {length} bytes, "
                                      f"but {end - start} remain: truncated reply")
        yield kind & 0x3FFF, start + NLA.size, start + length  # without the NESTED/BYTEORDER flags
        start += (length + 3) & ~3


def _attribute(payload: bytes, kind: int) -> bytes:
    length = NLA.size + len(payload)
    return NLA.pack(length, kind) + payload + b"\0" * (-length % 4)


def _message(data: bytes) -> Tuple[int, int]:
    """(type, end) of the one netlink message ``data`` holds; a kernel error is raised as OSError."""
    if len(data) < NLMSG.size:
        raise TaskstatsReplyError(f"netlink reply of {len(data)} bytes is shorter than its header "
                                  f"({NLMSG.size} bytes): truncated reply")
    length, kind = NLMSG.unpack_from(data)[:2]
    if length < NLMSG.size or length > len(data):
        raise TaskstatsReplyError(f"netlink reply says {length} bytes but {len(data)} arrived: truncated reply")
    if kind == NLMSG_ERROR:
        if length < NLMSG.size + 4:
            raise TaskstatsReplyError(f"netlink error reply of {length} bytes has no error code: truncated reply")
        code = -struct.unpack_from("=i", data, NLMSG.size)[0]
        raise OSError(code, f"taskstats: {os.strerror(code)}")
    if length < NLMSG.size + GENL.size:
        raise TaskstatsReplyError(f"generic netlink reply of {length} bytes has no command header: truncated reply")
    return kind, length


def parse_stats(data: bytes) -> Delays:
    """The delays in a TASKSTATS_CMD_GET reply (one netlink message, as the kernel sends it)."""
    _, end = _message(data)
    stats = None
    for kind, start, stop in _attributes(data, NLMSG.size + GENL.size, end):
        if kind in (TASKSTATS_TYPE_AGGR_TGID, TASKSTATS_TYPE_AGGR_PID):
            stats = next(((a, b) for k, a, b in _attributes(data, start, stop) if k == TASKSTATS_TYPE_STATS), None)
    if stats is None:
        raise TaskstatsReplyError("taskstats reply holds no statistics (no TASKSTATS_TYPE_STATS attribute)")
    start, stop = stats
    if stop - start < 2:
        raise TaskstatsReplyError(f"taskstats statistics of {stop - start} bytes hold no version: truncated reply")
    version = struct.unpack_from("=H", data, start)[0]
    if version < LAYOUT_VERSION:
        return Delays(version=version, reason=f"struct taskstats version {version} predates the layout read here")
    values, missing = {"version": version}, []
    for kind, offset in OFFSETS.items():
        if start + offset + 16 <= stop:
            values[f"{kind}_count"], values[f"{kind}_ns"] = struct.unpack_from("=QQ", data, start + offset)
        else:
            missing.append(kind)
    reason = None if not missing else (f"the kernel's struct taskstats (version {version}, {stop - start} bytes) "
                                        f"has no {' or '.join(missing)} figures")
    return Delays(**values, reason=reason)


def _exchange(sock: socket.socket, family: int, command: int, attributes: bytes, sequence: int) -> bytes:
    body = GENL.pack(command, 1, 0) + attributes
    sock.send(NLMSG.pack(NLMSG.size + len(body), family, NLM_F_REQUEST, sequence, 0) + body)
    while True:
        data = sock.recv(1 << 16)
        if len(data) >= NLMSG.size and NLMSG.unpack_from(data)[3] == sequence:
            return data


def _family(sock: socket.socket) -> int:
    """The generic netlink family id of "TASKSTATS"."""
    data = _exchange(sock, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, _attribute(b"TASKSTATS\0", CTRL_ATTR_FAMILY_NAME), 1)
    _, end = _message(data)
    for kind, start, stop in _attributes(data, NLMSG.size + GENL.size, end):
        if kind == CTRL_ATTR_FAMILY_ID and stop - start >= 2:
            return struct.unpack_from("=H", data, start)[0]
    raise TaskstatsReplyError("generic netlink family reply for TASKSTATS holds no family id")


def accounting_off() -> Optional[str]:
    """Why delays are not being counted now (kernel.task_delayacct absent or 0), or None when they are."""
    try:
        value = TASK_DELAYACCT.read_text().strip()
    except OSError:
        return f"no {TASK_DELAYACCT}: this kernel has no delay accounting (CONFIG_TASK_DELAY_ACCT)"
    return None if value == "1" else f"kernel.task_delayacct is {value}: delays are not counted (delay_accounting())"


def process_delays(pid: Optional[int] = None) -> Delays:
    """The delays of process ``pid`` (this one by default), all its threads; fields None where not offered."""
    return _delays(TASKSTATS_CMD_ATTR_TGID, os.getpid() if pid is None else pid)


def thread_delays(tid: Optional[int] = None) -> Delays:
    """The delays of one thread, ``tid`` (its native id; the calling thread by default): what a reader thread
    itself waited, apart from helper threads whose waits are their work (a pool reading ahead)."""
    return _delays(TASKSTATS_CMD_ATTR_PID, threading.get_native_id() if tid is None else tid)


def _delays(attribute: int, pid: int) -> Delays:
    off = accounting_off()
    if off is not None:
        return Delays(reason=off)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC) as sock:
            sock.settimeout(5.0)
            sock.bind((0, 0))
            family = _family(sock)
            return parse_stats(_exchange(sock, family, TASKSTATS_CMD_GET,
                                         _attribute(struct.pack("=I", pid), attribute), 2))
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES):
            return Delays(reason="taskstats needs CAP_NET_ADMIN (root)")
        if exc.errno == errno.ENOENT:
            return Delays(reason="this kernel has no taskstats (CONFIG_TASKSTATS)")
        if exc.errno in (errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT):
            return Delays(reason=f"no generic netlink socket here ({exc})")
        raise


@contextmanager
def delay_accounting(setting: Path = TASK_DELAYACCT) -> Iterator[Optional[str]]:
    """kernel.task_delayacct on for the duration, its previous value restored after (an error inside too).

    Yields None when accounting is on, else the reason it could not be turned on (not root, no such
    setting).  Only processes and threads started inside are measured.  The setting is the machine's: a
    second user that turns it off ends the counting here too.
    """
    try:
        before = setting.read_text().strip()
        reason = None
    except OSError as exc:
        before, reason = None, f"cannot read {setting}: {exc.strerror} (kernel without delay accounting?)"
    changed = False
    if reason is None and before != "1":
        try:
            setting.write_text("1")
            changed = True
        except OSError as exc:
            reason = f"cannot turn on delay accounting ({setting}: {exc.strerror}; needs root)"
    try:
        yield reason
    finally:
        if changed:
            setting.write_text(before)
