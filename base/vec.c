/* Growable arrays (base/vec.h). */
#include "base/vec.h"
#include "base/hostmem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

bool vec_reserve(void *arrp, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t ncap = *cap < 8 ? 8 : *cap;
    while (ncap < need)
        ncap = ncap > SIZE_MAX / 2 ? need : ncap * 2;
    if (elem && ncap > SIZE_MAX / elem)
        return false;
    /* The owner's pointer is read and written through memcpy: it may be any object pointer type
     * (all have void *'s representation on the platforms xseg supports). */
    void *old;
    memcpy(&old, arrp, sizeof old);
    void *p = xs_realloc(old, ncap * elem);
    if (!p)
        return false;
    memcpy(arrp, &p, sizeof p);
    *cap = ncap;
    return true;
}
