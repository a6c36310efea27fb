/* cwspawn: what an exec's child does between PID 1 and the command, without a fork of CPython.
 *
 * PID 1 of a sandbox starts it with posix_spawn (a vfork: no page is copied) for every command
 * (`exec`, not `run_python` nor file operations, which need Python), with the exec's descriptors
 * inheritable for this one spawn. It does what `child._command` does, in the same order, with the
 * same exit codes and messages:
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
 * `cwspawn --check` prints "ok" and exits 0 (the template's test that it runs there).
 * Built by `_native.py` (static when the C library allows, else dynamic), on first use.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SPAWN_FAILED 126
#define NOT_FOUND 127

static void say(const char *a, const char *b, const char *c, const char *d) {
    const char *parts[5] = {"cwsandbox: ", a, b, c, d};
    char buf[4096];
    size_t n = 0;
    for (int i = 0; i < 5; i++) {
        if (parts[i] == NULL) continue;
        size_t len = strlen(parts[i]);
        if (len > sizeof(buf) - 2 - n) len = sizeof(buf) - 2 - n;
        memcpy(buf + n, parts[i], len);
        n += len;
    }
    buf[n++] = '\n';
    ssize_t w = write(2, buf, n); /* the caller may be gone: the exit code stands */
    (void)w;
}

static __attribute__((noreturn)) void fail(int code, const char *a, const char *b, const char *c) {
    say(a, b, c, NULL);
    _exit(code);
}

static long num(const char *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s) fail(SPAWN_FAILED, "internal error before the command started: bad argument ", s, NULL);
    return v;
}

static void limit(int resource, long value, long extra) {
    if (value <= 0) return;
    struct rlimit r = {(rlim_t)value, (rlim_t)value + (rlim_t)extra};
    (void)setrlimit(resource, &r); /* as the Python path: a refused limit is left as it was */
}

/* The request's bytes, NUL-split: "argc envc", cwd, argv..., (key, value)..., raw. */
static char *read_all(int fd, size_t *size) {
    struct stat st;
    if (fstat(fd, &st) != 0) return NULL;
    size_t want = (size_t)st.st_size;
    char *data = malloc(want + 1);
    if (data == NULL) return NULL;
    size_t got = 0;
    while (got < want) {
        ssize_t r = pread(fd, data + got, want - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    data[got] = '\0';
    *size = got;
    return data;
}

static int cloexec_above_2(void) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */) == 0) return 0;
#endif
    /* an older kernel: every descriptor PID 1 holds is close-on-exec already but the ones passed here */
    return -1;
}

static int executable(const char *path) {
    struct stat st;
    return access(path, X_OK) == 0 && stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--check") == 0) {
        ssize_t w = write(1, "ok\n", 3);
        return w == 3 ? 0 : 1;
    }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (argc < 10) fail(SPAWN_FAILED, "internal error before the command started: cwspawn arguments", NULL, NULL);
    int die = (int)num(argv[1]), req = (int)num(argv[2]), out = (int)num(argv[3]), err = (int)num(argv[4]);
    int in = (int)num(argv[5]);
    long cpu = num(argv[6]), fsize = num(argv[7]), nproc = num(argv[8]), as = num(argv[9]);
    if (in < 0) {
        in = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (in < 0) fail(SPAWN_FAILED, "internal error before the command started: /dev/null: ", strerror(errno), NULL);
    }
    if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
        fail(SPAWN_FAILED, "internal error before the command started: dup2: ", strerror(errno), NULL);
    for (int i = 10; i < argc; i++) {
        int fd = (int)num(argv[i]);
        if (write(fd, "0", 1) != 1) fail(SPAWN_FAILED, "cannot join the commands' cgroup: ", strerror(errno), NULL);
        close(fd);
    }
    if (in > 2) close(in);
    if (out > 2) close(out);
    if (err > 2 && err != out) close(err);
    setsid();
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    if (die) prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    limit(RLIMIT_CPU, cpu, 1);
    limit(RLIMIT_FSIZE, fsize, 0);
    limit(RLIMIT_NPROC, nproc, 0);
    limit(RLIMIT_AS, as, 0);

    size_t size = 0;
    char *data = read_all(req, &size);
    if (data == NULL) fail(SPAWN_FAILED, "internal error before the command started: cannot read the request: ", strerror(errno), NULL);
    close(req);
    cloexec_above_2();
    /* split on NUL: head, cwd, argv (argc), env (2 * envc), raw */
    char *p = data, *end = data + size;
    char *head = p;
    p += strlen(p) + 1;
    long nargs = 0, nenv = 0;
    {
        char *sp = strchr(head, ' ');
        if (sp == NULL || p > end) fail(SPAWN_FAILED, "internal error before the command started: malformed request", NULL, NULL);
        *sp = '\0';
        nargs = num(head);
        nenv = num(sp + 1);
    }
    if (nargs < 1 || nenv < 0 || nargs > (long)size || nenv > (long)size)
        fail(SPAWN_FAILED, "internal error before the command started: malformed request", NULL, NULL);
    char **fields = malloc(sizeof(char *) * (size_t)(1 + nargs + 2 * nenv));
    char **args = malloc(sizeof(char *) * (size_t)(nargs + 1));
    char **env = malloc(sizeof(char *) * (size_t)(nenv + 1));
    if (fields == NULL || args == NULL || env == NULL) fail(SPAWN_FAILED, "internal error before the command started: out of memory", NULL, NULL);
    long nfields = 1 + nargs + 2 * nenv;
    for (long i = 0; i < nfields; i++) {
        if (p >= end) fail(SPAWN_FAILED, "internal error before the command started: request shorter than its counts say", NULL, NULL);
        fields[i] = p;
        p += strlen(p) + 1;
    }
    if (p > end) fail(SPAWN_FAILED, "internal error before the command started: request shorter than its counts say", NULL, NULL);
    const char *cwd = fields[0];
    for (long i = 0; i < nargs; i++) args[i] = fields[1 + i];
    args[nargs] = NULL;
    /* the environment as the Python path builds it: a dict, so a repeated key keeps its first place, last value */
    long ne = 0;
    const char *path_var = NULL;
    for (long i = 0; i < nenv; i++) {
        const char *k = fields[1 + nargs + 2 * i], *v = fields[2 + nargs + 2 * i];
        if (*k == '\0' || strchr(k + 1, '=') != NULL) /* as os.execve */
            fail(SPAWN_FAILED, "internal error before the command started: illegal environment variable name", NULL, NULL);
        size_t kl = strlen(k), vl = strlen(v);
        char *kv = malloc(kl + vl + 2);
        if (kv == NULL) fail(SPAWN_FAILED, "internal error before the command started: out of memory", NULL, NULL);
        memcpy(kv, k, kl);
        kv[kl] = '=';
        memcpy(kv + kl + 1, v, vl + 1);
        long at = ne;
        for (long j = 0; j < ne; j++)
            if (strncmp(env[j], kv, kl + 1) == 0) at = j;
        env[at] = kv;
        if (at == ne) ne++;
        if (strcmp(k, "PATH") == 0) path_var = kv + kl + 1;
    }
    env[ne] = NULL;
    if (chdir(cwd) != 0) { /* quoted as Python's repr of a plain string, as the Python path prints it */
        say("cannot change directory to '", cwd, "': ", strerror(errno));
        _exit(SPAWN_FAILED);
    }
    const char *cmd = args[0];
    const char *found = NULL;
    char *buf = NULL;
    if (strchr(cmd, '/') != NULL) {
        found = cmd;
    } else {
        const char *dirs = path_var ? path_var : "/usr/local/bin:/usr/bin:/bin";
        size_t cl = strlen(cmd);
        buf = malloc(strlen(dirs) + cl + 3);
        if (buf == NULL) fail(SPAWN_FAILED, "internal error before the command started: out of memory", NULL, NULL);
        const char *d = dirs;
        for (;;) {
            const char *colon = strchr(d, ':');
            size_t dl = colon ? (size_t)(colon - d) : strlen(d);
            size_t n = 0;
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
            if (colon == NULL) break;
            d = colon + 1;
        }
    }
    if (found == NULL) fail(NOT_FOUND, cmd, ": command not found", NULL);
    execve(found, args, env);
    int e = errno;
    if (e == ENOENT) fail(NOT_FOUND, cmd, ": command not found", NULL);
    if (e == EACCES || e == EPERM) fail(SPAWN_FAILED, cmd, ": permission denied", NULL);
    fail(SPAWN_FAILED, "cannot start the command: ", strerror(e), NULL);
}
