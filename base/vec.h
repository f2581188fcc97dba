/* Growable arrays: one growth rule for every array the allocator keeps (event pools, stream
 * lists, handle tables, candidate lists). The array stays a plain pointer plus a capacity in the
 * owner's struct; this only makes room. */
#ifndef XSEG_BASE_VEC_H
#define XSEG_BASE_VEC_H

#include <stdbool.h>
#include <stddef.h>

/* Make room for @p need elements of @p elem bytes in the array whose pointer is at @p arrp (a
 * `T **`) and whose capacity, in elements, is *@p cap. Grows geometrically (doubling, at least 8
 * elements), so appends are amortized O(1); new elements are not initialized. On failure (host
 * memory, or a size that overflows) returns false with the array and *cap unchanged. */
bool vec_reserve(void *arrp, size_t *cap, size_t need, size_t elem);

/* vec_reserve for an array lvalue @p arr (any object pointer type) and its size_t capacity. */
#define VEC_RESERVE(arr, cap, need) vec_reserve(&(arr), &(cap), (need), sizeof *(arr))

#endif
