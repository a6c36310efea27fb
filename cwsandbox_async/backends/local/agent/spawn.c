/* cwspawn: what an exec's child does between PID 1 and the command, without a fork of CPython.
 *
 * PID 1 of a sandbox starts it with posix_spawn (a vfork: no page is copied) for every command and
 * file operation (not `run_python`, which needs Python), with the exec's descriptors
 * inheritable for this one spawn (`execs.Execs.spawn`). It does what `child._command` does, in the
 * same order, with the same exit codes and messages:
 *
 *   cwspawn DIE REQ OUT ERR STDIN CPU FSIZE NPROC AS [JOIN...]
 *
 *   0. not dumpable at once (its memory is about to hold its request; the file is execute-only for
 *      the sandbox, so the kernel makes it non-dumpable from its execve anyway);
 *   1. STDIN (or /dev/null when -1), OUT and ERR on 0, 1 and 2;
 *   2. writes "0" to every JOIN (`cgroup.procs` of the commands' cgroups): the memory limit binds it
 *      and all it starts; a failure is `cannot join the commands' cgroup`, exit 126;
 *   3. setsid, child subreaper, parent-death SIGKILL when DIE is 1;
 *   4. the rlimits (0: not set; CPU's hard limit is one second above its soft one);
 *   5. reads its request from the memfd REQ (`protocol.pack_request`), changes directory, finds the
 *      command on the request's PATH and execve's it; every descriptor above 2 is close-on-exec.
 *
 * `cwspawn --file r|w REQ RESULT FILE_LIMIT` is a file operation instead (`read_file`/`write_file`,
 * what `child._file_op` and `files.py` do, below `file_main`): it stays in PID 1's cgroups.
 *
 * `cwspawn --check` prints "ok" and exits 0 (the template's test that it runs there).
 *
 * No C library: raw system calls (x86_64 and aarch64), no startup code. An exec of a static glibc
 * program costs ~1 ms of CPU here (the pages its startup touches), this one ~0.1 ms. Built by
 * `_native.py` on first use:
 *   cc -O2 -s -static -nostdlib -ffreestanding -fno-builtin -fno-stack-protector -fno-pie -no-pie
 */
typedef unsigned long u64;
typedef long i64;

#if defined(__x86_64__)
enum {
    NR_write = 1, NR_close = 3, NR_mmap = 9, NR_pread64 = 17, NR_execve = 59, NR_chdir = 80,
    NR_setsid = 112, NR_prctl = 157, NR_exit_group = 231, NR_openat = 257, NR_faccessat = 269,
    NR_dup3 = 292, NR_prlimit64 = 302, NR_statx = 332, NR_close_range = 436,
    NR_read = 0, NR_pwrite64 = 18, NR_sendfile = 40, NR_fcntl = 72, NR_ftruncate = 77, NR_mkdirat = 258,
};
static i64 sys6(i64 n, i64 a, i64 b, i64 c, i64 d, i64 e, i64 f) {
    register i64 r10 __asm__("r10") = d, r8 __asm__("r8") = e, r9 __asm__("r9") = f;
    i64 ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
__asm__(".text\n.globl _start\n_start:\n xor %rbp,%rbp\n mov %rsp,%rdi\n and $-16,%rsp\n call cmain\n hlt\n");
#elif defined(__aarch64__)
enum {
    NR_write = 64, NR_close = 57, NR_mmap = 222, NR_pread64 = 67, NR_execve = 221, NR_chdir = 49,
    NR_setsid = 157, NR_prctl = 167, NR_exit_group = 94, NR_openat = 56, NR_faccessat = 48,
    NR_dup3 = 24, NR_prlimit64 = 261, NR_statx = 291, NR_close_range = 436,
    NR_read = 63, NR_pwrite64 = 68, NR_sendfile = 71, NR_fcntl = 25, NR_ftruncate = 46, NR_mkdirat = 34,
};
static i64 sys6(i64 n, i64 a, i64 b, i64 c, i64 d, i64 e, i64 f) {
    register i64 x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c;
    register i64 x3 __asm__("x3") = d, x4 __asm__("x4") = e, x5 __asm__("x5") = f;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
    return x0;
}
__asm__(".text\n.globl _start\n_start:\n mov x29, #0\n mov x30, #0\n mov x0, sp\n bl cmain\n");
#else
#error "cwspawn: x86_64 and aarch64 only"
#endif

#define sys1(n, a) sys6(n, (i64)(a), 0, 0, 0, 0, 0)
#define sys2(n, a, b) sys6(n, (i64)(a), (i64)(b), 0, 0, 0, 0)
#define sys3(n, a, b, c) sys6(n, (i64)(a), (i64)(b), (i64)(c), 0, 0, 0)
#define sys4(n, a, b, c, d) sys6(n, (i64)(a), (i64)(b), (i64)(c), (i64)(d), 0, 0)
#define sys5(n, a, b, c, d, e) sys6(n, (i64)(a), (i64)(b), (i64)(c), (i64)(d), (i64)(e), 0)

#define SPAWN_FAILED 126
#define NOT_FOUND 127
#define AT_FDCWD (-100)
#define AT_EMPTY_PATH 0x1000
#define O_RDONLY 0
#define O_CLOEXEC 02000000
#define X_OK 1
#define EINTR 4
#define ENOENT 2
#define EPERM 1
#define EACCES 13
#define PR_SET_PDEATHSIG 1
#define PR_SET_DUMPABLE 4
#define PR_SET_CHILD_SUBREAPER 36
#define SIGKILL 9
#define RLIMIT_CPU 0
#define RLIMIT_FSIZE 1
#define RLIMIT_NPROC 6
#define RLIMIT_AS 9
#define S_IFMT 0170000
#define S_IFDIR 0040000
#define STATX_MODE 0x2
#define STATX_SIZE 0x200
#define STATX_INO 0x100
#define S_IFREG 0100000
#define O_WRONLY 01
#define O_CREAT 0100
#define O_NOCTTY 0400
#define O_NONBLOCK 04000
#define F_GETFL 3
#define F_SETFL 4
#define EEXIST 17
#define EINVAL 22
#define ENOSYS 38
#define EOPNOTSUPP 95

/* the compiler may emit calls to these for copies and zeroing */
void *memcpy(void *d, const void *s, u64 n) {
    char *dd = d;
    const char *ss = s;
    while (n--) *dd++ = *ss++;
    return d;
}
void *memset(void *d, int c, u64 n) {
    char *dd = d;
    while (n--) *dd++ = (char)c;
    return d;
}

static u64 slen(const char *s) {
    u64 n = 0;
    while (s[n]) n++;
    return n;
}
static int seq(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}
static const char *schr(const char *s, char c) {
    for (; *s; s++)
        if (*s == c) return s;
    return 0;
}

/* glibc's texts (what Python's strerror prints) for the errors these calls can give */
static const char *errtext(i64 e) {
    switch (e) {
    case 1: return "Operation not permitted";
    case 2: return "No such file or directory";
    case 3: return "No such process";
    case 4: return "Interrupted system call";
    case 5: return "Input/output error";
    case 6: return "No such device or address";
    case 7: return "Argument list too long";
    case 8: return "Exec format error";
    case 9: return "Bad file descriptor";
    case 11: return "Resource temporarily unavailable";
    case 12: return "Cannot allocate memory";
    case 13: return "Permission denied";
    case 14: return "Bad address";
    case 16: return "Device or resource busy";
    case 17: return "File exists";
    case 19: return "No such device";
    case 20: return "Not a directory";
    case 21: return "Is a directory";
    case 22: return "Invalid argument";
    case 23: return "Too many open files in system";
    case 24: return "Too many open files";
    case 26: return "Text file busy";
    case 27: return "File too large";
    case 28: return "No space left on device";
    case 30: return "Read-only file system";
    case 31: return "Too many links";
    case 36: return "File name too long";
    case 38: return "Function not implemented";
    case 40: return "Too many levels of symbolic links";
    case 79: return "Can not access a needed shared library";
    case 80: return "Accessing a corrupted shared library";
    case 95: return "Operation not supported";
    case 122: return "Disk quota exceeded";
    default: return "Unknown error";
    }
}

static void say(const char *a, const char *b, const char *c, const char *d) {
    const char *parts[5] = {"cwsandbox: ", a, b, c, d};
    char buf[4096];
    u64 n = 0;
    for (int i = 0; i < 5; i++) {
        if (parts[i] == 0) continue;
        u64 len = slen(parts[i]);
        if (len > sizeof(buf) - 2 - n) len = sizeof(buf) - 2 - n;
        memcpy(buf + n, parts[i], len);
        n += len;
    }
    buf[n++] = '\n';
    sys3(NR_write, 2, buf, n); /* the caller may be gone: the exit code stands */
}

static __attribute__((noreturn)) void leave(int code) {
    for (;;) sys1(NR_exit_group, code);
}

static __attribute__((noreturn)) void fail(int code, const char *a, const char *b, const char *c) {
    say(a, b, c, 0);
    leave(code);
}

#define INTERNAL "internal error before the command started: "

static i64 num(const char *s) {
    i64 v = 0, sign = 1;
    const char *p = s;
    if (*p == '-') sign = -1, p++;
    if (*p == '\0') fail(SPAWN_FAILED, INTERNAL "bad argument ", s, 0);
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || v > (1L << 58)) fail(SPAWN_FAILED, INTERNAL "bad argument ", s, 0);
        v = v * 10 + (*p - '0');
    }
    return v * sign;
}

static void limit(int resource, i64 value, i64 extra) {
    if (value <= 0) return;
    u64 r[2] = {(u64)value, (u64)(value + extra)};
    sys4(NR_prlimit64, 0, resource, r, 0); /* as the Python path: a refused limit is left as it was */
}

/* statx's layout is the same on every machine: mode (u16) at 28, size (u64) at 40 */
static int statx_of(int dirfd, const char *path, int flags, unsigned mask, unsigned *mode, u64 *size) {
    u64 buf[32];
    if (sys5(NR_statx, dirfd, path, flags, mask, buf) != 0) return -1;
    if (mode) *mode = *(unsigned short *)((char *)buf + 28);
    if (size) *size = *(u64 *)((char *)buf + 40);
    return 0;
}

static int executable(const char *path) {
    unsigned mode = 0;
    return sys4(NR_faccessat, AT_FDCWD, path, X_OK, 0) == 0 && statx_of(AT_FDCWD, path, 0, STATX_MODE, &mode, 0) == 0 &&
           (mode & S_IFMT) != S_IFDIR;
}

static void *grab(u64 size) {
    i64 p = sys6(NR_mmap, 0, (i64)((size + 4095) & ~4095UL), 3 /* rw */, 0x22 /* private, anonymous */, -1, 0);
    if (p < 0 && p > -4096) fail(SPAWN_FAILED, INTERNAL "out of memory", 0, 0);
    return (void *)p;
}

static void onto(int fd, int target) {
    if (fd == target) return; /* inheritable already: PID 1 cleared its close-on-exec */
    i64 r = sys3(NR_dup3, fd, target, 0);
    if (r < 0) fail(SPAWN_FAILED, INTERNAL "dup3: ", errtext(-r), 0);
}

/* ---- file operations (`cwspawn --file r|w REQ RESULT FILE_LIMIT`): `files.py`'s, without a CPython fork ----
 *
 * PID 1 spawns it in place of a fork for `read_file`/`write_file` (`execs.Execs.spawn`): it stays in
 * PID 1's cgroups (no JOIN), non-dumpable, with the same checks, messages and exit codes as
 * `child._file_op` and `files`: REQ is `protocol.pack_file_request` (max bytes, path, shown path, data),
 * RESULT the driver's memfd (the file's bytes, or on exit 1 the message). */

static void file_text(char *buf, u64 *n, u64 cap, const char *s) {
    u64 len = slen(s);
    if (len > cap - *n) len = cap - *n;
    memcpy(buf + *n, s, len);
    *n += len;
}

static void file_num(char *buf, u64 *n, u64 cap, u64 v) {
    char digits[24];
    int i = 23;
    digits[i] = '\0';
    do digits[--i] = (char)('0' + v % 10), v /= 10; while (v && i > 0);
    file_text(buf, n, cap, digits + i);
}

/* The message "SHOWN: A[N1][B][N2]" (an N below 0 and a null B are left out) into the result (fd 1), then
 * exit 1: the message alone, nothing of the file. */
static __attribute__((noreturn)) void file_fail(const char *shown, const char *a, i64 n1, const char *b, i64 n2) {
    char buf[4096];
    u64 n = 0;
    file_text(buf, &n, sizeof(buf), shown);
    file_text(buf, &n, sizeof(buf), ": ");
    file_text(buf, &n, sizeof(buf), a);
    if (n1 >= 0) file_num(buf, &n, sizeof(buf), (u64)n1);
    if (b) file_text(buf, &n, sizeof(buf), b);
    if (n2 >= 0) file_num(buf, &n, sizeof(buf), (u64)n2);
    sys2(NR_ftruncate, 1, 0);
    sys4(NR_pwrite64, 1, buf, n, 0);
    leave(1);
}

typedef struct { unsigned mode; u64 size, ino; unsigned major, minor; } fstat_t;

static int fstat_of(int fd, fstat_t *st) {
    u64 buf[32];
    if (sys5(NR_statx, fd, "", AT_EMPTY_PATH, STATX_MODE | STATX_SIZE | STATX_INO, buf) != 0) return -1;
    st->mode = *(unsigned short *)((char *)buf + 28);
    st->ino = *(u64 *)((char *)buf + 32);
    st->size = *(u64 *)((char *)buf + 40);
    st->major = *(unsigned *)((char *)buf + 136);
    st->minor = *(unsigned *)((char *)buf + 140);
    return 0;
}

static fstat_t own[4]; /* fds 0-3: this helper's own (a symlink to /proc/self/fd/1 must not reach its result) */

static void check_regular(int fd, const char *shown) {
    fstat_t st;
    if (fstat_of(fd, &st) != 0) file_fail(shown, "not a regular file", -1, 0, -1);
    if ((st.mode & S_IFMT) == S_IFDIR) file_fail(shown, "is a directory", -1, 0, -1);
    int mine = 0;
    for (int i = 0; i < 4; i++)
        if (own[i].ino == st.ino && own[i].major == st.major && own[i].minor == st.minor && own[i].mode) mine = 1;
    if ((st.mode & S_IFMT) != S_IFREG || mine) file_fail(shown, "not a regular file", -1, 0, -1);
}

/* Copy SRC (from OFFSET, or its own position when OFFSET < 0) to DST until EOF; past LIMIT (>= 0) bytes,
 * stop and return -2 (one byte more is read to know). sendfile where the kernel allows it. -errno on error. */
static i64 file_copy(int src, int dst, i64 limit, i64 offset) {
    static char chunk[1 << 16];
    u64 total = 0;
    while (limit < 0 || total <= (u64)limit) {
        u64 want = 1UL << 24;
        if (limit >= 0 && want > (u64)limit + 1 - total) want = (u64)limit + 1 - total;
        i64 off = offset + (i64)total;
        i64 n = sys4(NR_sendfile, dst, src, offset < 0 ? 0 : (i64)&off, want);
        if (n == -EINVAL || n == -ENOSYS || n == -EOPNOTSUPP) {
            if (want > sizeof(chunk)) want = sizeof(chunk);
            n = offset < 0 ? sys3(NR_read, src, chunk, want) : sys4(NR_pread64, src, chunk, want, offset + (i64)total);
            for (i64 done = 0; n > 0 && done < n;) {
                i64 w = sys3(NR_write, dst, chunk + done, n - done);
                if (w == -EINTR) continue;
                if (w < 0) return w;
                done += w;
            }
        }
        if (n == -EINTR) continue;
        if (n < 0) return n;
        if (n == 0) return (i64)total;
        total += (u64)n;
    }
    return -2;
}

static void file_read(const char *path, const char *shown, i64 limit) {
    i64 fd = sys4(NR_openat, AT_FDCWD, path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0);
    if (fd < 0) file_fail(shown, errtext(-fd), -1, 0, -1);
    check_regular((int)fd, shown);
    fstat_t st;
    if (fstat_of((int)fd, &st) == 0 && st.size > (u64)limit) file_fail(shown, "", (i64)st.size, " bytes is more than ", limit);
    i64 r = file_copy((int)fd, 1, limit, -1); /* /proc files say size 0: up to the limit and one byte more */
    if (r == -2) file_fail(shown, "more than ", limit, " bytes", -1);
    if (r < 0) file_fail(shown, errtext(-r), -1, 0, -1);
}

static void file_write(char *path, const char *shown, int src, u64 offset, i64 file_limit) {
    fstat_t st;
    if (fstat_of(src, &st) != 0) file_fail(shown, "cannot read the request", -1, 0, -1);
    u64 size = st.size - offset;
    if (file_limit > 0 && size > (u64)file_limit) file_fail(shown, "", (i64)size, " bytes is over the file size limit", -1);
    /* the parent directories, as os.makedirs(parent, exist_ok=True): each missing one made; one that is
     * there (a directory, after following symlinks) is fine; anything else fails with its error */
    u64 len = slen(path);
    for (u64 i = 1; i < len; i++) {
        if (path[i] != '/') continue;
        path[i] = '\0';
        i64 r = sys3(NR_mkdirat, AT_FDCWD, path, 0777);
        unsigned mode = 0;
        int dir = r != 0 && statx_of(AT_FDCWD, path, 0, STATX_MODE, &mode, 0) == 0 && (mode & S_IFMT) == S_IFDIR;
        path[i] = '/';
        if (r != 0 && !dir) file_fail(shown, errtext(-r), -1, 0, -1);
    }
    i64 fd = sys4(NR_openat, AT_FDCWD, path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
    if (fd < 0) file_fail(shown, errtext(-fd), -1, 0, -1);
    check_regular((int)fd, shown); /* only a regular file: truncated only once that is known */
    i64 flags = sys2(NR_fcntl, fd, F_GETFL);
    if (flags >= 0) sys3(NR_fcntl, fd, F_SETFL, flags & ~O_NONBLOCK);
    i64 r = sys2(NR_ftruncate, fd, 0);
    if (r < 0) file_fail(shown, errtext(-r), -1, 0, -1);
    r = file_copy(src, (int)fd, -1, (i64)offset);
    if (r < 0) file_fail(shown, errtext(-r), -1, 0, -1);
}

static __attribute__((noreturn)) void file_main(int argc, char **argv) {
    if (argc != 6) fail(SPAWN_FAILED, INTERNAL "cwspawn --file arguments", 0, 0);
    int reading = seq(argv[2], "r");
    int req = (int)num(argv[3]), result = (int)num(argv[4]);
    i64 file_limit = num(argv[5]);
    onto(result, 1);
    if (req != 3) {
        onto(req, 3);
        req = 3;
    }
    sys3(NR_close_range, 4, ~0U, 0);
    for (int i = 0; i < 4; i++) fstat_of(i, &own[i]); /* a closed one stays zero: it matches nothing */
    u64 size = 0;
    if (statx_of(req, "", AT_EMPTY_PATH, STATX_SIZE, 0, &size) != 0) fail(SPAWN_FAILED, INTERNAL "cannot read the request", 0, 0);
    /* "MAX\0PATH\0SHOWN\0" then the data: read the head only (a path is at most 4096 bytes, twice, and a number) */
    u64 head_cap = size < 8300 ? size : 8300;
    char *head = grab(head_cap + 1);
    u64 got = 0;
    while (got < head_cap) {
        i64 r = sys4(NR_pread64, req, head + got, head_cap - got, got);
        if (r == -EINTR) continue;
        if (r <= 0) break;
        got += (u64)r;
    }
    head[got] = '\0';
    char *fields[3];
    u64 at = 0;
    for (int i = 0; i < 3; i++) {
        if (at >= got) fail(SPAWN_FAILED, INTERNAL "malformed file request", 0, 0);
        fields[i] = head + at;
        at += slen(head + at) + 1;
    }
    if (at > got) fail(SPAWN_FAILED, INTERNAL "malformed file request", 0, 0);
    if (reading)
        file_read(fields[1], fields[2], num(fields[0]));
    else
        file_write(fields[1], fields[2], req, at, file_limit);
    leave(0);
}

__attribute__((used)) void cmain(i64 *sp) {
    int argc = (int)sp[0];
    char **argv = (char **)(sp + 1);
    if (argc == 2 && seq(argv[1], "--check")) leave(sys3(NR_write, 1, "ok\n", 3) == 3 ? 0 : 1);
    sys5(NR_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (argc > 1 && seq(argv[1], "--file")) file_main(argc, argv);
    if (argc < 10) fail(SPAWN_FAILED, INTERNAL "cwspawn arguments", 0, 0);
    int die = (int)num(argv[1]), req = (int)num(argv[2]), out = (int)num(argv[3]), err = (int)num(argv[4]);
    int in = (int)num(argv[5]);
    i64 cpu = num(argv[6]), fsize = num(argv[7]), nproc = num(argv[8]), as = num(argv[9]);
    if (in < 0) {
        in = (int)sys4(NR_openat, AT_FDCWD, "/dev/null", O_RDONLY | O_CLOEXEC, 0);
        if (in < 0) fail(SPAWN_FAILED, INTERNAL "/dev/null: ", errtext(-in), 0);
    }
    onto(in, 0);
    onto(out, 1);
    onto(err, 2);
    for (int i = 10; i < argc; i++) {
        int fd = (int)num(argv[i]);
        i64 r = sys3(NR_write, fd, "0", 1);
        if (r != 1) fail(SPAWN_FAILED, "cannot join the commands' cgroup: ", errtext(r < 0 ? -r : 5), 0);
        sys1(NR_close, fd);
    }
    if (in > 2) sys1(NR_close, in);
    if (out > 2) sys1(NR_close, out);
    if (err > 2 && err != out) sys1(NR_close, err);
    sys1(NR_setsid, 0);
    sys5(NR_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    if (die) sys5(NR_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    limit(RLIMIT_CPU, cpu, 1);
    limit(RLIMIT_FSIZE, fsize, 0);
    limit(RLIMIT_NPROC, nproc, 0);
    limit(RLIMIT_AS, as, 0);

    /* the request: "argc envc", cwd, argv..., (key, value)..., raw; NUL-separated */
    u64 size = 0;
    if (statx_of(req, "", AT_EMPTY_PATH, STATX_SIZE, 0, &size) != 0) fail(SPAWN_FAILED, INTERNAL "cannot read the request", 0, 0);
    char *data = grab(size + 1);
    u64 got = 0;
    while (got < size) {
        i64 r = sys4(NR_pread64, req, data + got, size - got, got);
        if (r == -EINTR) continue;
        if (r <= 0) break;
        got += (u64)r;
    }
    data[got] = '\0';
    size = got;
    sys1(NR_close, req);
    sys3(NR_close_range, 3, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */); /* belt and braces: PID 1's are already */
    char *p = data, *end = data + size;
    char *head = p;
    p += slen(p) + 1;
    const char *sp2 = schr(head, ' ');
    if (sp2 == 0 || p > end + 1) fail(SPAWN_FAILED, INTERNAL "malformed request", 0, 0);
    *(char *)sp2 = '\0';
    i64 nargs = num(head), nenv = num(sp2 + 1);
    if (nargs < 1 || nenv < 0 || nargs > (i64)size || nenv > (i64)size) fail(SPAWN_FAILED, INTERNAL "malformed request", 0, 0);
    i64 nfields = 1 + nargs + 2 * nenv;
    char **fields = grab(sizeof(char *) * (u64)(nfields + nargs + nenv + 2));
    char **args = fields + nfields, **env = args + nargs + 1;
    for (i64 i = 0; i < nfields; i++) {
        if (p > end) fail(SPAWN_FAILED, INTERNAL "request shorter than its counts say", 0, 0);
        fields[i] = p;
        p += slen(p) + 1;
    }
    if (p > end) fail(SPAWN_FAILED, INTERNAL "request shorter than its counts say", 0, 0);
    const char *cwd = fields[0];
    for (i64 i = 0; i < nargs; i++) args[i] = fields[1 + i];
    args[nargs] = 0;
    /* the environment as the Python path builds it: a dict, so a repeated key keeps its first place, last value */
    char *strings = grab(size + (u64)nenv * 2 + 16);
    i64 ne = 0;
    const char *path_var = 0;
    for (i64 i = 0; i < nenv; i++) {
        const char *k = fields[1 + nargs + 2 * i], *v = fields[2 + nargs + 2 * i];
        if (*k == '\0' || schr(k + 1, '=') != 0) /* as os.execve */
            fail(SPAWN_FAILED, INTERNAL "illegal environment variable name", 0, 0);
        u64 kl = slen(k), vl = slen(v);
        char *kv = strings;
        strings += kl + vl + 2;
        memcpy(kv, k, kl);
        kv[kl] = '=';
        memcpy(kv + kl + 1, v, vl + 1);
        i64 at = ne;
        for (i64 j = 0; j < ne && at == ne; j++) {
            u64 m = 0;
            while (m <= kl && env[j][m] == kv[m]) m++;
            if (m > kl) at = j;
        }
        env[at] = kv;
        if (at == ne) ne++;
        if (kl == 4 && k[0] == 'P' && k[1] == 'A' && k[2] == 'T' && k[3] == 'H') path_var = kv + 5;
    }
    env[ne] = 0;
    i64 r = sys1(NR_chdir, cwd);
    if (r != 0) { /* quoted as Python's repr of a plain string, as the Python path prints it */
        say("cannot change directory to '", cwd, "': ", errtext(-r));
        leave(SPAWN_FAILED);
    }
    const char *cmd = args[0];
    const char *found = 0;
    if (schr(cmd, '/') != 0) {
        found = cmd;
    } else {
        const char *dirs = path_var ? path_var : "/usr/local/bin:/usr/bin:/bin";
        u64 cl = slen(cmd);
        char *buf = grab(slen(dirs) + cl + 3);
        const char *d = dirs;
        for (;;) {
            const char *colon = schr(d, ':');
            u64 dl = colon ? (u64)(colon - d) : slen(d);
            u64 n = 0;
            if (dl == 0) {
                buf[n++] = '.';
            } else {
                memcpy(buf, d, dl);
                n = dl;
            }
            if (buf[n - 1] != '/') buf[n++] = '/';
            memcpy(buf + n, cmd, cl + 1);
            if (executable(buf)) {
                found = buf;
                break;
            }
            if (colon == 0) break;
            d = colon + 1;
        }
    }
    if (found == 0) fail(NOT_FOUND, cmd, ": command not found", 0);
    i64 e = -sys3(NR_execve, found, args, env);
    if (e == ENOENT) fail(NOT_FOUND, cmd, ": command not found", 0);
    if (e == EACCES || e == EPERM) fail(SPAWN_FAILED, cmd, ": permission denied", 0);
    fail(SPAWN_FAILED, "cannot start the command: ", errtext(e), 0);
}
