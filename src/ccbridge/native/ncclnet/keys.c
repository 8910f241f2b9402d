/*
 * The group secret, read as ccbridge.secure.keys reads it: $CCBRIDGE_KEY (64
 * hex digits), else $CCBRIDGE_KEY_FILE (a text file of 64 hex digits, mode
 * 600 or stricter); material that is plainly not random is refused with the
 * rules of keys._weakness, in the same order (tests/test_ncclnet_cpu.py
 * checks that both sides agree on a table of weak and strong keys).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net.h"

static int distinct(const uint8_t *k) {
    uint8_t seen[256] = {0};
    int n = 0;
    for (int i = 0; i < KEY_BYTES; i++) n += !seen[k[i]]++;
    return n;
}

static int longest_equal_steps(const uint8_t *k) {
    int run = 1, longest = 1;
    for (int i = 1; i + 1 < KEY_BYTES; i++) {
        run = (uint8_t)(k[i + 1] - k[i]) == (uint8_t)(k[i] - k[i - 1]) ? run + 1 : 1;
        if (run > longest) longest = run;
    }
    return longest;
}

static int text_bytes(const uint8_t *k) {
    int n = 0;
    for (int i = 0; i < KEY_BYTES; i++) n += (k[i] >= 0x20 && k[i] < 0x7f) || k[i] == '\t' || k[i] == '\n' || k[i] == '\r';
    return n;
}

/* Valid UTF-8 (strict, as Python decodes it) with no control character but
 * tab/newline/return. Python's isprintable() also treats format, private-use,
 * unassigned and non-ASCII space characters as unprintable (so it accepts such
 * keys); this rule refuses them too: stricter, never weaker, and random keys
 * are valid UTF-8 with probability far below 1e-12 either way. */
static int utf8_text(const uint8_t *k) {
    for (int i = 0; i < KEY_BYTES;) {
        uint32_t c = k[i];
        int more = c < 0x80 ? 0 : c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : -1;
        if (more < 0 || i + more >= KEY_BYTES) return 0;
        c &= more ? (0x3f >> more) : 0x7f;
        for (int j = 1; j <= more; j++) {
            if ((k[i + j] & 0xc0) != 0x80) return 0;
            c = c << 6 | (k[i + j] & 0x3f);
        }
        if ((more == 2 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) || (more == 3 && (c < 0x10000 || c > 0x10ffff)))
            return 0; /* overlong, surrogate, beyond Unicode */
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || (c >= 0x7f && c < 0xa0)) return 0;
        i += more + 1;
    }
    return 1;
}

const char *key_weakness(const uint8_t k[KEY_BYTES]) {
    if (distinct(k) == 1) return "every byte is the same";
    if (!memcmp(k, k + 16, 16)) return "its two halves are equal";
    if (longest_equal_steps(k) >= 8) return "it holds a counting run";
    if (distinct(k) < 16) return "it has too few distinct byte values";
    if (text_bytes(k) >= KEY_BYTES - 1) return "it is text (a password, or an encoded key read as raw bytes?)";
    if (utf8_text(k)) return "it is UTF-8 text (a passphrase?)";
    return NULL;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* str.strip()'s ASCII whitespace */
static int space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

static int parse_hex(const char *text, size_t n, uint8_t key[KEY_BYTES], const char *where, char *err, size_t errlen) {
    while (n && space(text[0])) text++, n--;
    while (n && space(text[n - 1])) n--;
    int ok = n == 2 * KEY_BYTES;
    for (size_t i = 0; ok && i < n; i++) ok = hexval(text[i]) >= 0;
    if (!ok) {
        snprintf(err, errlen, "%s: expected 64 hex digits (32 bytes), got %zu characters%s", where, n,
                 n == 2 * KEY_BYTES ? " that are not all hex digits" : "");
        return -1;
    }
    for (int i = 0; i < KEY_BYTES; i++) key[i] = (uint8_t)(hexval(text[2 * i]) << 4 | hexval(text[2 * i + 1]));
    const char *why = key_weakness(key);
    if (why) {
        wipe(key, KEY_BYTES);
        snprintf(err, errlen, "%s: refused, %s; use 32 random bytes, e.g. `openssl rand -hex 32`", where, why);
        return -1;
    }
    return 0;
}

static int read_key_file(const char *path, uint8_t key[KEY_BYTES], char *err, size_t errlen) {
    char where[512], buf[4096];
    snprintf(where, sizeof where, "key file %s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s: %s", where, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || (st.st_mode & (S_IRWXG | S_IRWXO))) {
        snprintf(err, errlen, S_ISREG(st.st_mode) ? "%s is readable by group or others (mode %o); chmod 600 it"
                                                  : "%s: not a regular file", where, st.st_mode & 07777);
        close(fd);
        return -1;
    }
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    if (n < 0) {
        snprintf(err, errlen, "%s: %s", where, strerror(errno));
        return -1;
    }
    for (ssize_t i = 0; i < n; i++) {
        if ((unsigned char)buf[i] >= 0x80) {
            wipe(buf, sizeof buf);
            snprintf(err, errlen, "%s: not text; a text key file holds 64 hex digits", where);
            return -1;
        }
    }
    int rc = parse_hex(buf, (size_t)n, key, where, err, errlen);
    wipe(buf, sizeof buf);
    return rc;
}

int key_load(uint8_t key[KEY_BYTES], char *err, size_t errlen) {
    const char *env = getenv("CCBRIDGE_KEY"), *file = getenv("CCBRIDGE_KEY_FILE");
    if (env && *env) return parse_hex(env, strlen(env), key, "$CCBRIDGE_KEY", err, errlen);
    if (file && *file) return read_key_file(file, key, err, errlen);
    snprintf(err, errlen, "no key: set $CCBRIDGE_KEY (64 hex digits) or $CCBRIDGE_KEY_FILE");
    return -1;
}
