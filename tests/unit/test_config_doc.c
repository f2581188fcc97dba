/* docs/configuration.md cannot drift from the key table (core/process/config_keys.h): every key has a row
 * in the doc's key table whose default starts with the row's spelling, the doc's table names no
 * key the table lacks, the ignored pinned_* keys are listed under "Ignored keys", and each
 * spelling holds the value the canonical string of the defaults writes. Argument: the doc. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/process/config.h"

static const char *doc_path;
static char *doc;

/* The doc's text after the line @p heading, up to the next "# " or "## " heading. */
static char *section(const char *heading)
{
    const char *s = strstr(doc, heading);
    if (!s)
        fail_msg("%s: no section '%s'", doc_path, heading);
    s += strlen(heading);
    const char *e = s;
    while ((e = strstr(e, "\n#")) && !(e[2] == '#' && e[3] == ' ') && !(e[2] == ' '))
        e++;
    size_t n = e ? (size_t)(e - s) : strlen(s);
    char *out = strndup(s, n);
    assert_non_null(out);
    return out;
}

/* Copy of @p s up to @p end with '*' and '`' removed (the doc's emphasis and code marks). */
static void plain(const char *s, const char *end, char *out, size_t size)
{
    size_t n = 0;
    for (; s < end && n + 1 < size; s++)
        if (*s != '*' && *s != '`')
            out[n++] = *s;
    out[n] = '\0';
}

struct doc_row {
    char key[64], alias[64], deflt[256];
};

/* The rows of the "## Keys" table: "| `key` (alias `a`) | default | ...". */
static size_t doc_rows(struct doc_row *rows, size_t max)
{
    char *keys = section("\n## Keys\n");
    size_t n = 0;
    for (char *l = strstr(keys, "\n| `"); l && n < max; l = strstr(l + 1, "\n| `")) {
        char *c1 = strchr(l + 3, '|'), *c2 = c1 ? strchr(c1 + 1, '|') : NULL;
        assert_non_null(c2);
        struct doc_row *r = &rows[n++];
        memset(r, 0, sizeof *r);
        const char *q = l + 4, *qe = strchr(q, '`');
        snprintf(r->key, sizeof r->key, "%.*s", (int)(qe - q), q);
        const char *al = strstr(qe, "(alias `");
        if (al && al < c1) {
            al += strlen("(alias `");
            snprintf(r->alias, sizeof r->alias, "%.*s", (int)(strchr(al, '`') - al), al);
        }
        char d[256];
        plain(c1 + 1, c2, d, sizeof d);
        const char *b = d;
        while (*b == ' ')
            b++;
        snprintf(r->deflt, sizeof r->deflt, "%s", b);
    }
    free(keys);
    return n;
}

static void test_doc_matches_table(void **state)
{
    (void)state;
    struct doc_row rows[64];
    size_t n = doc_rows(rows, 64);
    assert_true(n > 0);
    struct cfg def;
    cfg_default(&def);
    char canon[2048] = ",";
    cfg_format(&def, canon + 1, sizeof canon - 1, NULL); /* ",key:value,key:value..." */
    char *ignored = section("\n### Ignored keys\n");
    for (size_t k = 0; k < cfg_nkeys; k++) {
        const struct cfg_key *key = &cfg_keys[k];
        if (key->flags & CFG_IGNORED) {
            char quoted[80];
            snprintf(quoted, sizeof quoted, "`%s`", key->name);
            if (!strstr(ignored, quoted))
                fail_msg("%s: ignored key %s is not listed under 'Ignored keys'", doc_path, key->name);
            continue;
        }
        const struct doc_row *r = NULL;
        for (size_t i = 0; i < n && !r; i++)
            if (!strcmp(rows[i].key, key->name))
                r = &rows[i];
        if (!r)
            fail_msg("%s: key %s (core/process/config_keys.h) has no row in the key table", doc_path, key->name);
        if (strcmp(r->alias, key->alias ? key->alias : ""))
            fail_msg("%s: key %s: the doc gives alias '%s', the table '%s'", doc_path, key->name, r->alias,
                     key->alias ? key->alias : "");
        if (strncmp(r->deflt, key->doc, strlen(key->doc)))
            fail_msg("%s: key %s: default '%s' does not start with '%s' (core/process/config_keys.h)", doc_path,
                     key->name, r->deflt, key->doc);
        /* The spelling holds the value the defaults' canonical string writes. */
        char pat[80];
        snprintf(pat, sizeof pat, ",%s:", key->name);
        const char *v = strstr(canon, pat);
        if (v) {
            v += strlen(pat);
            char val[64];
            snprintf(val, sizeof val, "%.*s", (int)strcspn(v, ","), v);
            if (!strstr(key->doc, val))
                fail_msg("key %s: the doc's default '%s' does not hold the default value '%s'", key->name,
                         key->doc, val);
        }
    }
    free(ignored);
    for (size_t i = 0; i < n; i++) {
        bool found = false;
        for (size_t k = 0; k < cfg_nkeys && !found; k++)
            found = !strcmp(rows[i].key, cfg_keys[k].name) && !(cfg_keys[k].flags & CFG_IGNORED);
        if (!found)
            fail_msg("%s: the key table lists '%s', which core/process/config_keys.h does not have", doc_path, rows[i].key);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s docs/configuration.md\n", argv[0]);
        return 2;
    }
    doc_path = argv[1];
    FILE *f = fopen(doc_path, "rb");
    if (!f) {
        perror(doc_path);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    doc = calloc(1, (size_t)size + 1);
    if (!doc || fread(doc, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "%s: cannot read\n", doc_path);
        return 2;
    }
    fclose(f);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_doc_matches_table)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    free(doc);
    return rc;
}
