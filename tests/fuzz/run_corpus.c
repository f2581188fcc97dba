/*
 * Without libFuzzer (gcc builds, every CI setup): run a fuzz target's LLVMFuzzerTestOneInput
 * once on every file of the given files and directories: the seed corpus and the regression
 * inputs (crashes the fuzzer found, kept in tests/fuzz/regressions/TARGET/). Under the ASan and
 * TSan setups that checks each of them for memory and threading errors too.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 4096, len = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return -1;
    }
    /* An exact-size copy, so that ASan sees a read one past the input's end. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, errors = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            perror(argv[i]);
            errors++;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            errors += run_file(argv[i]) != 0;
            files++;
            continue;
        }
        struct dirent **names;
        int n = scandir(argv[i], &names, NULL, alphasort);
        if (n < 0) {
            perror(argv[i]);
            errors++;
            continue;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
            if (names[k]->d_name[0] != '.' && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
                errors += run_file(path) != 0;
                files++;
            }
            free(names[k]);
        }
        free(names);
    }
    printf("%d inputs run, %d unreadable\n", files, errors);
    return errors ? 1 : 0;
}
