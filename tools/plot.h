/* plot.h -- `--plot`: draw a command's JSON results with the Python package's plotting module (see plot.c). */
#ifndef MXFP8_TOOLS_PLOT_H
#define MXFP8_TOOLS_PLOT_H

#include <cjson/cJSON.h>

#include "cli.h"

/** Draw doc (kind "bench" or "quantize") into the image file `out`. CLI_OK, or CLI_USAGE after an error line
 *  (no Python, no matplotlib, a failed drawing). */
int cli_plot(const char *cmd, const char *kind, const cJSON *doc, const char *out);
/** Before the work: `out` ends in .png, .svg or .pdf, its directory exists and is writable, and the Python that
 *  will draw it has matplotlib (`python -m mxfp8.plot check`). */
int cli_plot_check(const char *cmd, const char *out);

#endif
