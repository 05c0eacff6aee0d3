"""How busy the machine was while `make test` ran, printed at its end.

A CI run that runs out of time leaves only its log. Stop 49's did: every test in it ran 1.5 to 4
times slower than in the runs measured before, and nothing in the log said whether the machine was
starved (of CPU, memory or disk) or the tests had become slower. This samples the kernel's own
figures every few seconds while the tests run and prints one summary when it is stopped:

- the load average (runnable tasks; the machine has `nproc` cores),
- CPU, memory and I/O pressure (/proc/pressure: the share of time some task waited for it),
- the least memory available and the least free disk seen.

    python hack/machine_load.py build/machine-load.log &   # sample until SIGTERM, then print the summary

It only reads /proc and statvfs; it starts nothing and opens no port.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

INTERVAL_S = 5.0
PRESSURE = ("cpu", "memory", "io")


def pressure_total_us(resource: str) -> int | None:
    """The kernel's running total of microseconds some task waited for ``resource``; None without PSI."""
    try:
        first_line = Path(f"/proc/pressure/{resource}").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return int(first_line.rsplit("total=", 1)[1])


def mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


@dataclass
class Samples:
    started: float = field(default_factory=time.monotonic)
    pressure_start: dict[str, int | None] = field(default_factory=lambda: {r: pressure_total_us(r) for r in PRESSURE})
    loads: list[float] = field(default_factory=list)
    least_mem_available: int = 1 << 62
    least_disk_free: int = 1 << 62

    def take(self, log: Path) -> None:
        load = float(Path("/proc/loadavg").read_text().split()[0])
        mem = mem_available_bytes()
        disk = os.statvfs("/")
        free = disk.f_bavail * disk.f_frsize
        self.loads.append(load)
        self.least_mem_available = min(self.least_mem_available, mem)
        self.least_disk_free = min(self.least_disk_free, free)
        with log.open("a") as out:
            stamp = time.strftime("%H:%M:%S")
            out.write(f"{stamp} load {load:.2f} mem_available {mem >> 20} MiB disk_free {free >> 30} GiB\n")

    def summary(self) -> str:
        elapsed = time.monotonic() - self.started
        waited = []
        for resource in PRESSURE:
            start, now = self.pressure_start[resource], pressure_total_us(resource)
            if start is not None and now is not None and elapsed > 0:
                waited.append(f"{resource} {100 * (now - start) / 1e6 / elapsed:.0f}%")
        loads = sorted(self.loads) or [0.0]
        return (
            f"machine load over {elapsed / 60:.1f} min on {os.cpu_count()} cores: "
            f"load average median {loads[len(loads) // 2]:.1f}, max {loads[-1]:.1f}; "
            f"time some task waited for {', '.join(waited) or 'n/a (no /proc/pressure)'}; "
            f"least memory available {self.least_mem_available / 2**30:.1f} GiB; "
            f"least disk free {self.least_disk_free / 2**30:.1f} GiB"
        )


def main() -> int:
    log = Path(sys.argv[1] if len(sys.argv) > 1 else "build/machine-load.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    samples = Samples()
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        samples.take(log)
        time.sleep(INTERVAL_S)
    print(samples.summary(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
