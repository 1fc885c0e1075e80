/*
 * fileaccess.c -- hardened file access for the tensor-file readers and writers: error messages, input files read
 * at checked offsets, UTF-8 validation, atomic output (a temporary file renamed on commit, removed on a signal).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileaccess.h"

int tf_err(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Input files                                                                                                  */
/* ---------------------------------------------------------------------------------------------------------- */
int tf_open_read(const char *path, tf_infile *in, char *err, size_t errlen) {
    memset(in, 0, sizeof *in);
    in->f = fopen(path, "rb");
    if (!in->f) return tf_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(in->f), &st) != 0) {
        int e = errno;
        tf_close_read(in);
        return tf_err(err, errlen, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        tf_close_read(in);
        return tf_err(err, errlen, "%s: not a regular file", path);
    }
    in->size = (uint64_t)st.st_size;
    return 0;
}

int tf_read_at(tf_infile *in, uint64_t off, void *buf, size_t n, const char *path, char *err, size_t errlen) {
    if (off > in->size || n > in->size - off)
        return tf_err(err, errlen, "%s: truncated file: needs bytes [%llu, %llu) but holds %llu", path,
                      (unsigned long long)off, (unsigned long long)(off + n), (unsigned long long)in->size);
    if (n == 0) return 0;
    if (fseeko(in->f, (off_t)off, SEEK_SET) != 0 || fread(buf, 1, n, in->f) != n)
        return tf_err(err, errlen, "%s: read error or truncated file at offset %llu", path, (unsigned long long)off);
    return 0;
}

void tf_close_read(tf_infile *in) {
    if (in->f) fclose(in->f);
    in->f = NULL;
}

int tf_utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
        else return 0;
        if (n - i < (size_t)len) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += (size_t)len;
    }
    return 1;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Atomic output                                                                                                */
/* ---------------------------------------------------------------------------------------------------------- */
/* The temporary file being written, removed by the signal handler if the process is interrupted. */
static char g_tmp_path[PATH_MAX + 64];
static volatile sig_atomic_t g_tmp_live;
static struct sigaction g_old_int, g_old_term, g_old_hup;

static void on_signal(int sig) {
    if (g_tmp_live) unlink(g_tmp_path);
    g_tmp_live = 0;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
    sigaction(SIGHUP, &sa, &g_old_hup);
}

static void restore_handlers(void) {
    sigaction(SIGINT, &g_old_int, NULL);
    sigaction(SIGTERM, &g_old_term, NULL);
    sigaction(SIGHUP, &g_old_hup, NULL);
}

char *tf_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

int tf_atomic_open(tf_atomic *a, const char *path, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    size_t len = strlen(path);
    if (len == 0 || len > PATH_MAX) return tf_err(err, errlen, "bad output path");
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base) return tf_err(err, errlen, "%s: output path names a directory", path);
    char *tmp = malloc(len + 32);
    if (!tmp) return tf_err(err, errlen, "out of memory");
    snprintf(tmp, len + 32, "%.*s.%s.tmp-XXXXXX", (int)(base - path), path, base);
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old); /* no signal between creating the file and recording its name */
    int fd = mkstemp(tmp);
    int e = errno;
    if (fd >= 0) {
        snprintf(g_tmp_path, sizeof g_tmp_path, "%s", tmp);
        g_tmp_live = 1;
        install_handlers();
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (fd < 0) {
        free(tmp);
        return tf_err(err, errlen, "%s: cannot create a file in its directory: %s", path, strerror(e));
    }
    mode_t um = umask(0);
    umask(um);
    fchmod(fd, 0666 & ~um);
    a->f = fdopen(fd, "wb");
    if (!a->f) {
        e = errno;
        close(fd);
        unlink(tmp);
        g_tmp_live = 0;
        restore_handlers();
        free(tmp);
        return tf_err(err, errlen, "%s: %s", path, strerror(e));
    }
    a->tmp = tmp;
    a->final_path = strdup(path);
    if (!a->final_path) {
        tf_atomic_abort(a);
        return tf_err(err, errlen, "out of memory");
    }
    return 0;
}

int tf_atomic_write(tf_atomic *a, const void *buf, size_t n, char *err, size_t errlen) {
    if (n && fwrite(buf, 1, n, a->f) != n)
        return tf_err(err, errlen, "%s: write failed: %s", a->final_path, strerror(errno));
    return 0;
}

void tf_atomic_abort(tf_atomic *a) {
    if (a->f) fclose(a->f);
    if (a->tmp) unlink(a->tmp);
    if (a->tmp) {
        g_tmp_live = 0;
        restore_handlers();
    }
    free(a->tmp);
    free(a->final_path);
    memset(a, 0, sizeof *a);
}

int tf_atomic_commit(tf_atomic *a, char *err, size_t errlen) {
    int rc = 0;
    if (fflush(a->f) != 0 || fsync(fileno(a->f)) != 0) {
        rc = tf_err(err, errlen, "%s: write failed: %s", a->final_path, strerror(errno));
    }
    int cr = fclose(a->f);
    a->f = NULL;
    if (!rc && cr != 0) rc = tf_err(err, errlen, "%s: write failed: %s", a->final_path, strerror(errno));
    if (!rc && rename(a->tmp, a->final_path) != 0)
        rc = tf_err(err, errlen, "%s: cannot rename the finished file into place: %s", a->final_path,
                    strerror(errno));
    if (rc) {
        tf_atomic_abort(a);
        return rc;
    }
    g_tmp_live = 0;
    restore_handlers();
    /* Make the rename itself durable. */
    char *dir = tf_dir_of(a->final_path);
    if (dir) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    free(a->tmp);
    free(a->final_path);
    memset(a, 0, sizeof *a);
    return 0;
}
