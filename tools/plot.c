/*
 * plot.c -- `--plot` of bench and quantize: the command writes its results as JSON to a temporary file and runs the
 * plotting module of the Python package (python/mxfp8/plot.py, matplotlib) on it.
 *
 * The interpreter: $MXFP8_PYTHON, else python3 (the `mxfp8` entry point of the Python package sets MXFP8_PYTHON to
 * its own interpreter). The module: plot.py found next to this executable's installation -- the source tree
 * (build/../python/mxfp8), the Python package (mxfp8/bin/../plot.py), or `cmake --install`'s share/mxfp8 -- run as a
 * script, else `python -m mxfp8.plot` from wherever that interpreter finds the package.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plot.h"

/* plot.py near the executable, into buf; 0 when found. */
static int find_module(char *buf, size_t len) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return -1;
    *slash = 0;
    static const char *const rel[] = {"/../python/mxfp8/plot.py", "/../plot.py", "/../share/mxfp8/plot.py"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        struct stat st;
        snprintf(buf, len, "%s%s", exe, rel[i]);
        if (stat(buf, &st) == 0 && S_ISREG(st.st_mode)) return 0;
    }
    return -1;
}

/* The last non-empty line of file f (the Python side's message), into buf. */
static void last_line(FILE *f, char *buf, size_t len) {
    char line[1024];
    buf[0] = 0;
    rewind(f);
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n) snprintf(buf, len, "%s", line);
    }
    const char *pfx = "mxfp8 plot: error: ";
    if (!strncmp(buf, pfx, strlen(pfx))) memmove(buf, buf + strlen(pfx), strlen(buf + strlen(pfx)) + 1);
}

/* Run python on the JSON file; the exit status, or -1 when it could not start. err_out gets its stderr. */
static int run_python(const char *python, const char *kind, const char *json_path, const char *out, FILE *err_out) {
    char module[PATH_MAX];
    int by_path = find_module(module, sizeof module) == 0;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (err_out) dup2(fileno(err_out), 2);
        if (!json_path) { /* "check": is matplotlib there? */
            if (by_path) execlp(python, python, module, kind, (char *)NULL);
            else execlp(python, python, "-m", "mxfp8.plot", kind, (char *)NULL);
        } else if (by_path) execlp(python, python, module, kind, json_path, out, (char *)NULL);
        else execlp(python, python, "-m", "mxfp8.plot", kind, json_path, out, (char *)NULL);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int cli_plot(const char *cmd, const char *kind, const cJSON *doc, const char *out) {
    const char *python = getenv("MXFP8_PYTHON");
    if (!python || !*python) python = "python3";
    char json_path[] = "/tmp/mxfp8-plot-XXXXXX";
    int fd = mkstemp(json_path);
    if (fd < 0) return cli_error(cmd, "--plot: cannot create a temporary file: %s", strerror(errno));
    char *text = cJSON_PrintUnformatted(doc);
    int ok = text != NULL;
    if (ok) {
        size_t n = strlen(text), done = 0;
        while (ok && done < n) {
            ssize_t w = write(fd, text + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            ok = w > 0;
            if (ok) done += (size_t)w;
        }
    }
    free(text);
    close(fd);
    if (!ok) {
        unlink(json_path);
        return cli_error(cmd, "--plot: cannot write the results to %s", json_path);
    }
    FILE *err = tmpfile();
    int st = run_python(python, kind, json_path, out, err);
    unlink(json_path);
    char msg[1024] = "";
    if (err) {
        last_line(err, msg, sizeof msg);
        fclose(err);
    }
    if (st == 0) return CLI_OK;
    if (st == 3)
        return cli_error(cmd, "--plot needs matplotlib in %s: pip install matplotlib (or set MXFP8_PYTHON to a "
                         "Python that has it)", python);
    if (st == 127 || st < 0)
        return cli_error(cmd, "--plot: cannot run %s (set MXFP8_PYTHON to a Python with matplotlib)", python);
    return cli_error(cmd, "--plot: drawing %s failed%s%s", out, *msg ? ": " : "", msg);
}

int cli_plot_check(const char *cmd, const char *out) {
    const char *dot = strrchr(out, '.'), *slash = strrchr(out, '/');
    if (!dot || (slash && dot < slash) || (strcasecmp(dot, ".png") && strcasecmp(dot, ".svg") && strcasecmp(dot, ".pdf")))
        return cli_error(cmd, "--plot %s: the image's name must end in .png, .svg or .pdf", out);
    char dir[PATH_MAX];
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - out) ? (int)(slash - out) : 1, out);
    else snprintf(dir, sizeof dir, ".");
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return cli_error(cmd, "--plot %s: directory '%s' does not exist", out, dir);
    if (access(dir, W_OK) != 0) return cli_error(cmd, "--plot %s: directory '%s' is not writable", out, dir);
    /* matplotlib, before the work rather than after it */
    const char *python = getenv("MXFP8_PYTHON");
    if (!python || !*python) python = "python3";
    FILE *err = tmpfile();
    int rc = run_python(python, "check", NULL, NULL, err);
    if (err) fclose(err);
    if (rc == 0) return CLI_OK;
    if (rc == 3)
        return cli_error(cmd, "--plot needs matplotlib in %s: pip install matplotlib (or set MXFP8_PYTHON to a "
                         "Python that has it)", python);
    return cli_error(cmd, "--plot: cannot run %s (set MXFP8_PYTHON to a Python with matplotlib)", python);
}
