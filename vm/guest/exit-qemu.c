// SPDX-License-Identifier: GPL-2.0
/*
 * exit-qemu STATUS: end the guest and make QEMU exit with a status the host
 * can read. Writes to the isa-debug-exit port (0xf4): QEMU then exits with
 * (STATUS << 1) | 1. Falls back to a plain power-off if the port is missing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/io.h>
#include <sys/reboot.h>

#define DEBUG_EXIT_PORT 0xf4

int main(int argc, char **argv)
{
	int status = argc > 1 ? atoi(argv[1]) : 0;

	if (status < 0 || status > 127)
		status = 127;
	sync();
	if (ioperm(DEBUG_EXIT_PORT, 4, 1) == 0)
		outl(status, DEBUG_EXIT_PORT);
	perror("exit-qemu: isa-debug-exit");
	reboot(RB_POWER_OFF);
	return 1;
}
