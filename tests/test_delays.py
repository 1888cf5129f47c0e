"""pixfeed.machine.delays: a process's delay accounting read from the kernel's taskstats.

The tests that talk to the kernel need root, taskstats and delay accounting (they skip, saying which is
missing); the parsing tests build replies by hand and run everywhere.
"""
from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys

import pytest

from pixfeed.machine import delays
from pixfeed.machine.memory import memory_stat
from pixfeed.machine.delays import TaskstatsReplyError, delay_accounting, parse_stats, process_delays
from pixfeed.storage.pagecache import evict, resident_fraction


def kernel_reason():
    """Why the kernel tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (to turn on kernel.task_delayacct and to ask taskstats)"
    with delay_accounting() as off:
        return off or process_delays().reason


def reply(stats: bytes, sequence: int = 2) -> bytes:
    """A TASKSTATS_CMD_GET reply as the kernel builds it: AGGR_TGID { TGID, STATS }."""
    nest = delays._attribute(struct.pack("=I", 1234), 2) + delays._attribute(stats, delays.TASKSTATS_TYPE_STATS)
    body = delays.GENL.pack(1, 1, 0) + delays._attribute(nest, delays.TASKSTATS_TYPE_AGGR_TGID | 0x8000)
    return delays.NLMSG.pack(delays.NLMSG.size + len(body), 31, 0, sequence, 0) + body


def stats_struct(version: int, size: int) -> bytes:
    """A struct taskstats of ``size`` bytes whose delay fields are distinct numbers."""
    raw = bytearray(size)
    struct.pack_into("=H", raw, 0, version)
    for k, offset in enumerate(delays.OFFSETS.values()):
        if offset + 16 <= size:
            struct.pack_into("=QQ", raw, offset, 10 + k, 1_000_000 * (k + 1))
    return bytes(raw)


def test_parse_reads_each_delay_and_its_count():
    got = parse_stats(reply(stats_struct(16, 560)))
    assert (got.reclaim_count, got.reclaim_ns) == (10, 1_000_000)
    assert (got.thrashing_count, got.thrashing_ns) == (11, 2_000_000)
    assert (got.blkio_count, got.blkio_ns) == (12, 3_000_000)
    assert got.version == 16 and got.reason is None
    spent = got - parse_stats(reply(bytes(stats_struct(16, 560))[:2] + bytes(558)))
    assert spent.thrashing_ns == 2_000_000 and spent.share("thrashing", 0.5) == pytest.approx(0.004)


def test_a_struct_too_short_for_a_field_gives_none_with_the_reason():
    got = parse_stats(reply(stats_struct(8, 328)))  # ends after freepages, before thrashing
    assert got.reclaim_ns == 1_000_000 and got.blkio_count == 12
    assert got.thrashing_ns is None and got.thrashing_count is None
    assert "thrashing" in got.reason and "version 8" in got.reason
    assert (got - got).thrashing_ns is None and got.share("thrashing", 1.0) is None
    old = parse_stats(reply(stats_struct(1, 328)))
    assert old.blkio_ns is None and "version 1" in old.reason


@pytest.mark.parametrize("cut", [3, 16, 19, 30, 60, 300])
def test_a_truncated_reply_raises_instead_of_returning_garbage(cut):
    whole = reply(stats_struct(16, 560))
    with pytest.raises(TaskstatsReplyError, match="truncated|no statistics|no command"):
        parse_stats(whole[:cut])
    # the same bytes with a header that agrees with their length: the attributes themselves are cut short
    short = bytearray(whole[:cut])
    if cut >= delays.NLMSG.size:
        struct.pack_into("=I", short, 0, cut)
        with pytest.raises(TaskstatsReplyError):
            parse_stats(bytes(short))


def test_a_reply_without_statistics_or_with_a_kernel_error():
    body = delays.GENL.pack(1, 1, 0)
    empty = delays.NLMSG.pack(delays.NLMSG.size + len(body), 31, 0, 2, 0) + body
    with pytest.raises(TaskstatsReplyError, match="no statistics"):
        parse_stats(empty)
    error = delays.NLMSG.pack(delays.NLMSG.size + 4, delays.NLMSG_ERROR, 0, 2, 0) + struct.pack("=i", -errno.EPERM)
    with pytest.raises(PermissionError):
        parse_stats(error)


def test_the_setting_is_restored_even_after_an_error(tmp_path):
    setting = tmp_path / "task_delayacct"
    setting.write_text("0\n")
    with pytest.raises(RuntimeError):
        with delay_accounting(setting) as off:
            assert off is None and setting.read_text() == "1"
            raise RuntimeError("inside")
    assert setting.read_text().strip() == "0"
    with delay_accounting(tmp_path / "absent") as off:
        assert "cannot read" in off


def test_real_accounting_is_turned_on_and_restored():
    reason = kernel_reason()
    if reason:
        pytest.skip(reason)
    before = delays.TASK_DELAYACCT.read_text()
    with pytest.raises(KeyError):
        with delay_accounting() as off:
            assert off is None and delays.TASK_DELAYACCT.read_text().strip() == "1"
            raise KeyError("inside")
    assert delays.TASK_DELAYACCT.read_text() == before
    if before.strip() == "0":
        assert "task_delayacct is 0" in process_delays().reason


READER = """
import json, os, sys, threading
from pixfeed.machine.delays import process_delays, thread_delays
from pixfeed.storage.pagecache import evict
path = sys.argv[1]
evict([path])
idle, done = [], threading.Event()
def wait():  # a second thread that only waits while this one reads
    idle.append(threading.get_native_id())
    done.wait()
other = threading.Thread(target=wait)
other.start()
while not idle:
    pass
before, mine, its = process_delays(), thread_delays(), thread_delays(idle[0])
with open(path, "rb", buffering=0) as f:
    while f.read(1 << 20):
        pass
spent, mine, its = process_delays() - before, thread_delays() - mine, thread_delays(idle[0]) - its
done.set()
other.join()
print(json.dumps({"reason": before.reason, "version": before.version, "count": spent.blkio_count,
                  "ns": spent.blkio_ns, "mine": mine.blkio_count, "its": its.blkio_count}))
"""


def test_reading_an_evicted_file_adds_block_io_delay(tmp_path):
    """In a process started with accounting on: the kernel keeps delays only for tasks created while it is."""
    reason = kernel_reason()
    if reason:
        pytest.skip(reason)
    path = tmp_path / "data.bin"
    with open(path, "wb") as f:
        f.write(os.urandom(8 << 20))
        f.flush()
        os.fsync(f.fileno())
    evict([path])
    if resident_fraction([path]) != 0.0:
        pytest.skip(f"{tmp_path} keeps its pages cached after POSIX_FADV_DONTNEED (tmpfs?)")
    with delay_accounting():
        child = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True, text=True,
                               timeout=120, check=True)
    got = json.loads(child.stdout.splitlines()[-1])
    assert got["reason"] is None and got["version"] >= 2
    assert got["count"] >= 1 and got["ns"] > 0, got
    assert got["mine"] >= 1 and got["its"] == 0, got  # one thread's own waits: the reader's, not the idle one's


def test_without_root_the_reason_says_so():
    if os.geteuid() != 0:
        assert "root" in process_delays().reason or "task_delayacct" in process_delays().reason
        return
    reason = kernel_reason()
    if reason:
        pytest.skip(reason)
    read, write = os.pipe()
    with delay_accounting():
        pid = os.fork()
        if pid == 0:  # the child: nobody, asking taskstats
            try:
                os.setgid(65534)
                os.setuid(65534)
                os.write(write, (process_delays().reason or "no reason").encode())
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        assert "CAP_NET_ADMIN (root)" in pipe.read()


def test_the_cgroup_counters_next_to_the_delays(tmp_path):
    """memory_stat: the cgroup's own memory.stat, which the benchmark reads beside the process's delays."""
    (tmp_path / "memory.stat").write_text("cache 4096\nworkingset_refault_file 283\npgmajfault 12\n\n")
    assert memory_stat(tmp_path) == {"cache": 4096, "workingset_refault_file": 283, "pgmajfault": 12}
