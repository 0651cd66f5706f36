/*
 * replay.c -- runs every file given (or every file in a directory given) through a fuzz
 * target's LLVMFuzzerTestOneInput, without libFuzzer: built with gcc and its sanitizers so
 * that the normal test suite replays the corpus.  Exits 0 and prints "<n> inputs" when all
 * pass; a failing input aborts (its name is printed first).
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
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            return -1;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        unsigned char *p = realloc(buf, cap * 2);
        if (!p)
            free(buf);
        buf = p;
        cap *= 2;
    }
    fclose(f);
    /* an exact-size copy, so reads past the end are caught */
    unsigned char *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    fprintf(stderr, "%s\n", path);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    int count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) != 0)
                return 1;
            count++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            perror(argv[i]);
            return 1;
        }
        char **names = NULL;
        size_t nn = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char **p = realloc(names, (nn + 1) * sizeof *names);
            if (!p)
                return 1;
            names = p;
            size_t l = strlen(argv[i]) + strlen(e->d_name) + 2;
            names[nn] = malloc(l);
            if (!names[nn])
                return 1;
            snprintf(names[nn], l, "%s/%s", argv[i], e->d_name);
            nn++;
        }
        closedir(d);
        if (nn)
            qsort(names, nn, sizeof *names, cmp);
        for (size_t k = 0; k < nn; k++) {
            if (run_file(names[k]) != 0)
                return 1;
            count++;
            free(names[k]);
        }
        free(names);
    }
    printf("%d inputs\n", count);
    return 0;
}
