"""Count the bytes ONNX Runtime's CPU allocator holds, exactly, for ``passes/verify.py``.

ORT's CPU allocator takes every tensor and every kernel working buffer it hands out from
``posix_memalign`` / ``aligned_alloc`` (64-byte alignment; with the arena on, the arena's chunks
come from there too). A small library preloaded into the measuring child (``LD_PRELOAD``) wraps the
aligned-allocation family and ``free``, keeps each aligned block's size in a hash table and counts
the bytes in use and their high-water mark. The high-water mark over a run less the bytes in use
before it is the run's dynamic peak in tensor bytes: no page rounding, no heap fragmentation and no
approximate kernel counter (the RSS recipe's errors, bench/results/small_peak_measurement.md).
Plain ``malloc`` (Python, numpy, ORT's bookkeeping and ``std::vector`` scratch) is not counted.

The library is compiled once from :data:`SOURCE` with the system C compiler into a cache folder
(``$MEMPLAN_CACHE``, else ``$XDG_CACHE_HOME/memplan`` or ``~/.cache/memplan``). Where that is not
possible (no compiler, not glibc, not Linux) :func:`library` returns None and verify falls back to
the RSS recipe, saying so.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

#: The preloaded library. glibc's own ``__libc_memalign`` / ``__libc_free`` / ``__libc_realloc`` do the
#: allocating; the table (linear probing, backward-shift deletion, so no tombstones) maps each live
#: aligned block to its size. A full table stops counting and says so (``memcount_lost``).
SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

extern void *__libc_memalign(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

#define SLOTS (1u << 17)
static uintptr_t *keys;
static size_t *sizes;
static int lock;
static long long in_use, high, lost;

static void acquire(void) { while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE)) {} }
static void release(void) { __atomic_store_n(&lock, 0, __ATOMIC_RELEASE); }
static size_t home(uintptr_t p) { return (size_t)(((p >> 4) * 0x9E3779B97F4A7C15ull) >> 40) & (SLOTS - 1); }

static void remember(void *p, size_t n) {
    acquire();
    if (!keys) {
        /* populated now: pages touched later, during a measured run, would count in its RSS */
        int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE;
        void *k = mmap(0, SLOTS * sizeof *keys, PROT_READ | PROT_WRITE, flags, -1, 0);
        void *s = mmap(0, SLOTS * sizeof *sizes, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (k == MAP_FAILED || s == MAP_FAILED) { lost++; release(); return; }
        keys = k; sizes = s;
    }
    size_t i = home((uintptr_t)p), probes = 0;
    while (keys[i] && keys[i] != (uintptr_t)p) {  /* p already here: its free went past us */
        if (++probes == SLOTS) { lost++; release(); return; }
        i = (i + 1) & (SLOTS - 1);
    }
    if (keys[i]) in_use -= (long long)sizes[i];
    keys[i] = (uintptr_t)p;
    sizes[i] = n;
    in_use += (long long)n;
    if (in_use > high) high = in_use;
    release();
}

static void forget(void *p) {
    if (!keys || !p) return;
    acquire();
    size_t i = home((uintptr_t)p), probes = 0;
    while (keys[i] != (uintptr_t)p) {
        if (!keys[i] || ++probes == SLOTS) { release(); return; }
        i = (i + 1) & (SLOTS - 1);
    }
    in_use -= (long long)sizes[i];
    for (size_t j = (i + 1) & (SLOTS - 1); keys[j]; j = (j + 1) & (SLOTS - 1)) {
        size_t h = home(keys[j]);
        if ((j > i) ? (h <= i || h > j) : (h <= i && h > j)) {
            keys[i] = keys[j]; sizes[i] = sizes[j]; i = j;
        }
    }
    keys[i] = 0;
    release();
}

void *memalign(size_t a, size_t n) { void *p = __libc_memalign(a, n); if (p) remember(p, n); return p; }
void *aligned_alloc(size_t a, size_t n) { return memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n) {
    if (a % sizeof(void *) || (a & (a - 1))) return EINVAL;
    void *p = memalign(a, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
void *valloc(size_t n) { return memalign(4096, n); }
void *pvalloc(size_t n) { return memalign(4096, (n + 4095) & ~(size_t)4095); }
void free(void *p) { forget(p); __libc_free(p); }
void *realloc(void *p, size_t n) { forget(p); return __libc_realloc(p, n); }

long long memcount_in_use(void) { acquire(); long long v = in_use; release(); return v; }
long long memcount_high(void) { acquire(); long long v = high; release(); return v; }
long long memcount_lost(void) { acquire(); long long v = lost; release(); return v; }
long long memcount_reset(void) { acquire(); high = in_use; long long v = in_use; release(); return v; }
"""

#: Environment variable that names the C compiler (default: cc, then gcc).
COMPILER_ENV = "MEMPLAN_CC"


def cache_dir() -> Path:
    if os.environ.get("MEMPLAN_CACHE"):
        return Path(os.environ["MEMPLAN_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memplan"


@lru_cache(maxsize=None)
def library() -> str | None:
    """Path of the compiled counting library, building it on first use; None where it cannot be
    built or loaded here (the reason is logged)."""
    if not sys.platform.startswith("linux"):
        log.info("allocation counter: needs Linux (glibc); measuring RSS instead")
        return None
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    try:
        folder = cache_dir().absolute()  # LD_PRELOAD looks a name without a slash up on the library path
    except RuntimeError as err:  # no $HOME and no passwd entry (a container's arbitrary uid)
        log.info("allocation counter: no cache folder (%s; set MEMPLAN_CACHE); measuring RSS instead", err)
        return None
    target = folder / f"alloc_counter-{digest}.so"
    if any(c in str(target) for c in " :"):  # LD_PRELOAD splits its list at spaces and colons
        log.info("allocation counter: the cache path %s has a space or colon (set MEMPLAN_CACHE); "
                 "measuring RSS instead", target)
        return None
    if target.exists():
        if _loads(target):
            return str(target)
        # a truncated or damaged file (a full disk, a copied cache) made every measuring child die
        # of SIGBUS at preload ("measuring the model in onnxruntime failed: (no output)")
        log.info("allocation counter: %s does not load; building it again", target)
    names = [os.environ[COMPILER_ENV]] if os.environ.get(COMPILER_ENV) else ["cc", "gcc"]
    compiler = next((shutil.which(c) for c in names if shutil.which(c)), None)
    if compiler is None:
        log.info("allocation counter: no C compiler (%s); measuring RSS instead", " or ".join(names))
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src, out = Path(tmp) / "alloc_counter.c", Path(tmp) / "alloc_counter.so"
            src.write_text(SOURCE)
            # --no-undefined: a libc without glibc's __libc_* entry points fails here, not at preload
            proc = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-Wl,--no-undefined", "-o", str(out), str(src)],
                                  capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                log.info("allocation counter: %s failed (%s); measuring RSS instead", compiler, tail)
                return None
            if not _loads(out):
                log.info("allocation counter: the library %s built does not load; measuring RSS instead", compiler)
                return None
            os.replace(out, target)  # atomic: a concurrent build leaves one whole library
    except (OSError, subprocess.SubprocessError) as err:
        log.info("allocation counter: cannot build in %s (%s); measuring RSS instead", target.parent, err)
        return None
    return str(target)


def _loads(path: Path) -> bool:
    """Whether a Python preloaded with the library at ``path`` starts and finds its counters."""
    try:
        proc = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL(None).memcount_high"],
                              env=dict(os.environ, LD_PRELOAD=str(path)), capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


#: Python run inside the measuring child: reads the preloaded counter, or None without it.
CHILD_HELPERS = r"""
def _counter():
    import ctypes
    try:
        lib = ctypes.CDLL(None)
        fns = [getattr(lib, "memcount_" + n) for n in ("in_use", "high", "lost", "reset")]
    except (OSError, AttributeError):
        return None
    for f in fns:
        f.restype = ctypes.c_longlong
    return dict(zip(("in_use", "high", "lost", "reset"), fns))
"""
