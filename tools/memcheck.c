/* memcheck.c -- the memory estimate's check against what the machine has available (see memcheck.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "memcheck.h"

double cli_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                fclose(f);
                return (double)kb * 1024.0;
            }
        fclose(f);
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (double)pages * (double)psz : 0.0;
}

int cli_mem_check(const char *cmd, double need_bytes, double check_bytes, int allow) {
    const double avail = cli_mem_available();
    if (allow || avail <= 0 || need_bytes <= avail) return CLI_OK;
    char refs[160] = "";
    if (check_bytes > 0)
        snprintf(refs, sizeof refs, "; %.1f GB of it for the golden references, which --no-check leaves out",
                 check_bytes * 1e-9);
    return cli_error(cmd, "this problem needs about %.1f GB of memory (inputs, gradients, the library's scratch%s) "
                     "but %.1f GB are available; make it smaller, or pass --no-memory-check to go ahead anyway",
                     need_bytes * 1e-9, refs, avail * 1e-9);
}
