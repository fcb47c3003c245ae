/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The guest test programs' KTAP lines (Documentation/dev-tools/ktap.rst):
 * one line per call, indented by ktap_indent spaces (the nesting level the
 * harness gives with -i) and flushed at once, so that a guest that crashes
 * mid-run has sent every line it printed and the host sees where it stopped.
 */
#ifndef MMIOLAB_KTAP_H
#define MMIOLAB_KTAP_H

#include <stdarg.h>
#include <stdio.h>

static int ktap_indent;

static void __attribute__((format(printf, 1, 2))) ktap_out(const char *fmt, ...)
{
	va_list ap;

	printf("%*s", ktap_indent, "");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

#endif
