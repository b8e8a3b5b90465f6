"""The RSS high-water mark of a program, read from /proc while it runs: the rusage of a
child counts the image it was forked from (a Python interpreter's tens of MiB) too, so it
cannot tell a small program's peak. Shared by bench/served_check/memory.sh and the e2e
tests that compare a report's memory with a served process's."""
import os
import subprocess
import time


def peak_rss(cmd, env=None, tries=5):
    """Run cmd (its argv[0] an executable path) to its end, stdout discarded; the largest
    VmHWM seen while it ran the program, in bytes. A program that ends before it can be read
    is run again, up to tries times; a failing one raises."""
    exe = os.path.realpath(cmd[0])
    for _ in range(tries):
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0
        while p.poll() is None:
            try:
                if os.path.realpath("/proc/%d/exe" % p.pid) == exe:
                    with open("/proc/%d/status" % p.pid) as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                peak = max(peak, int(line.split()[1]) * 1024)
            except OSError:
                pass   # exiting
            time.sleep(0.0005)
        if p.returncode != 0:
            raise AssertionError("%s failed (%d)" % (cmd, p.returncode))
        if peak:
            return peak
    raise AssertionError("%s ended before its memory could be read, %d times" % (cmd, tries))
