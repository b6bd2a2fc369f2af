#!/usr/bin/env python3
"""One llama-bench run inside an existing cgroup v1 memory group, for benches/llama_cpp.sh.

    llama_cpp_measure.py --cgroup MEMCG --blkio BLKIOCG --disk vda --setting NAME --tokens N [--json]
                         -- llama-bench ARGS...

Starts llama-bench as `sh -c '... echo $$ > MEMCG/cgroup.procs && echo $$ > BLKIOCG/cgroup.procs && exec "$@"'`, so
llama-bench runs in both groups from its first instruction, follows its stderr (llama-bench must be
run with --progress) and snapshots the blkio group's byte counters when llama-bench announces its
timed decode ("... generation run 1/1") and again when it exits.

disk_bytes_per_token = (bytes read + written on the disk by the blkio group between the two
snapshots) / generated tokens: llama-bench's own I/O during decode only (model load and prompt
excluded), mmap page faults and readahead included. Source: blkio.throttle.io_service_bytes of the
group, which cgroup v1 only fills in when the group has a throttle rule for the device, so the
runner sets a non-limiting 1 TiB/s one. disk_bytes_total is the same for the whole process (load
included); diskstats_bytes_decode is the device-wide /proc/diskstats figure over the decode window
(includes other processes' I/O: the Rust builds on the same disk). s_per_token is llama-bench's
own tg timing: the median of its samples_ns (one per -r run) / n_gen. With -r R the disk
figure covers all R runs and is divided by R * n_gen.

Prints one line, or with --json one JSON object:
  {"setting", "s_per_token", "oom_killed", "disk_bytes_per_token", ...extra fields}
Exit status 0 also when llama-bench was OOM-killed (that is a result); 1 on other failures.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time


def disk_sectors(dev):
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == dev:
                # fields: 5 = sectors read (index 5), 9 = sectors written (index 9); sectors are 512 B
                return int(p[5]), int(p[9])
    raise SystemExit(f"llama_cpp_measure: disk {dev} not in /proc/diskstats")


def blkio_bytes(cg, devno):
    """(read, write) bytes of the blkio group on device MAJ:MIN."""
    r = w = 0
    with open(os.path.join(cg, "blkio.throttle.io_service_bytes")) as f:
        for line in f:
            p = line.split()
            if len(p) == 3 and p[0] == devno:
                if p[1] == "Read":
                    r = int(p[2])
                elif p[1] == "Write":
                    w = int(p[2])
    return r, w


def read_int(path, default=None):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def oom_kill_count(cg):
    try:
        with open(os.path.join(cg, "memory.oom_control")) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
    except OSError:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cgroup", required=True)
    ap.add_argument("--setting", required=True)
    ap.add_argument("--blkio", required=True, help="blkio cgroup v1 directory (with a throttle rule)")
    ap.add_argument("--disk", default="vda")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--reps", type=int, default=1, help="llama-bench -r value (timed decode runs)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--log", help="append llama-bench's stderr here")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("no command")

    with open(f"/sys/block/{a.disk}/dev") as f:
        devno = f.read().strip()
    procs = os.path.join(a.cgroup, "cgroup.procs")
    bprocs = os.path.join(a.blkio, "cgroup.procs")
    oom_before = oom_kill_count(a.cgroup)
    start_blk = blkio_bytes(a.blkio, devno)
    start_sectors = disk_sectors(a.disk)
    t0 = time.monotonic()
    p = subprocess.Popen(["sh", "-c", 'b=$1; shift; echo $$ > "$0" && echo $$ > "$b" && exec "$@"', procs, bprocs] + cmd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    gen_sectors = []
    err_lines = []
    log = open(a.log, "a") if a.log else None

    def follow_stderr():
        for line in p.stderr:
            if not gen_sectors and "generation run" in line:
                gen_sectors.append(disk_sectors(a.disk))
                gen_sectors.append(blkio_bytes(a.blkio, devno))
            err_lines.append(line)
            if log:
                log.write(line)

    th = threading.Thread(target=follow_stderr, daemon=True)
    th.start()
    out = p.stdout.read()
    rc = p.wait()
    th.join()
    end_sectors = disk_sectors(a.disk)
    end_blk = blkio_bytes(a.blkio, devno)
    wall = time.monotonic() - t0
    if log:
        log.close()

    max_usage = read_int(os.path.join(a.cgroup, "memory.max_usage_in_bytes"))
    # With memory.memsw.limit_in_bytes = limit_in_bytes, hits are counted in memsw.failcnt.
    failcnt = max(read_int(os.path.join(a.cgroup, "memory.failcnt"), 0),
                  read_int(os.path.join(a.cgroup, "memory.memsw.failcnt"), 0))
    oom_kills = oom_kill_count(a.cgroup) - oom_before
    killed = rc in (-signal.SIGKILL, 128 + signal.SIGKILL)
    oom_killed = oom_kills > 0 or (killed and max_usage is not None and failcnt)

    s_per_token = None
    n_gen = a.tokens
    n_runs = a.reps
    samples = []
    if rc == 0:
        try:
            tests = json.loads(out)
            tg = [t for t in tests if t.get("n_gen", 0) > 0 and t.get("n_prompt", 0) == 0]
            if tg:
                n_gen = tg[0]["n_gen"]
                samples = sorted(tg[0]["samples_ns"])
                n_runs = len(samples)
                s_per_token = statistics.median(samples) / n_gen / 1e9
        except (ValueError, KeyError, TypeError) as e:
            print(f"llama_cpp_measure: cannot parse llama-bench output ({e}): {out[:500]!r}", file=sys.stderr)

    def io_bytes(a_, b_, unit=1):
        return ((b_[0] - a_[0]) + (b_[1] - a_[1])) * unit

    if gen_sectors:
        decode_bytes = io_bytes(gen_sectors[1], end_blk)
        disk_per_token = None if oom_killed else decode_bytes / (n_gen * n_runs)
        dev_decode = io_bytes(gen_sectors[0], end_sectors, 512)
    else:
        decode_bytes = disk_per_token = dev_decode = None
    total_bytes = io_bytes(start_blk, end_blk)

    res = {
        "setting": a.setting,
        "s_per_token": s_per_token,
        "oom_killed": bool(oom_killed),
        "disk_bytes_per_token": disk_per_token,
        "disk_bytes_scope": f"blkio cgroup {devno} ({a.disk}) read+write bytes of llama-bench, "
                            "timed decode only ('generation run' message to exit)",
        "disk_read_bytes_decode": end_blk[0] - gen_sectors[1][0] if gen_sectors else None,
        "disk_bytes_total": total_bytes,
        "diskstats_bytes_decode": dev_decode,
        "tokens": n_gen,
        "runs": n_runs,
        "s_per_token_runs": [x / n_gen / 1e9 for x in samples],
        "exit_status": rc if rc >= 0 else 128 - rc,
        "mem_max_usage_bytes": max_usage,
        "mem_failcnt": failcnt,
        "oom_kills": oom_kills,
        "wall_s": round(wall, 3),
    }
    if a.json:
        print(json.dumps(res), flush=True)
    else:
        if res["oom_killed"]:
            status = "OOM-killed"
        elif s_per_token is None:
            status = f"FAILED (exit {res['exit_status']})"
        else:
            status = f"{s_per_token:.4f} s/token ({1 / s_per_token:.2f} tok/s)"
        dpt = "n/a" if disk_per_token is None else f"{disk_per_token / 1e6:.2f} MB/token"
        print(f"{a.setting:28s} {status:36s} disk {dpt} (decode), {total_bytes / 1e6:.1f} MB incl. load; "
              f"peak mem {(max_usage or 0) / 2**20:.0f} MiB", flush=True)
    if rc != 0 and not res["oom_killed"]:
        sys.stderr.write("".join(err_lines[-20:]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
