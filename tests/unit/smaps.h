/* The unit tests' view of /proc/self/smaps: what the kernel did with a mapping's advice. */
#ifndef XSEG_TESTS_UNIT_SMAPS_H
#define XSEG_TESTS_UNIT_SMAPS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* For the mapping that holds @p p: its VmFlags line into @p flags (empty when absent or without
 * /proc) and its AnonHugePages in kB into *@p huge_kb (0 then). */
static inline void smaps_of(const void *p, char *flags, size_t size, unsigned long *huge_kb)
{
    flags[0] = 0;
    *huge_kb = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return;
    char line[512];
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, kb;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        } else if (in && sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) {
            *huge_kb = kb;
        } else if (in && !strncmp(line, "VmFlags:", 8)) { /* a mapping's last line */
            snprintf(flags, size, "%s", line);
            break;
        }
    }
    fclose(f);
}

#endif
