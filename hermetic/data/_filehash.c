/* The per-file loop of hermetic.data.hashing, in C: open, fstat, read, sha256, close.
 *
 * Why C: on a dataset of small files the Python version of this loop spends as
 * long in interpreter work (calls, tuples, big ints for the stat key) as in the
 * hashing itself; here it costs the syscalls and the sha256 and nothing else,
 * and the GIL is released for the whole span.
 *
 * Two sha256 implementations, chosen per file; both give the one standard digest:
 *  - OpenSSL's (libcrypto, the library behind hashlib; SHA-NI where the CPU has
 *    it), streaming, for any size;
 *  - where the build found it (setup.py defines HERMETIC_WITH_IPSEC_MB), Intel's
 *    multi-buffer library (intel-ipsec-mb), which hashes up to 16 independent
 *    buffers at once in AVX-512 or 8 in AVX2 lanes: on this project's machine
 *    2.3x the throughput of SHA-NI, one buffer at a time. Files under 64 KiB
 *    (what its job API takes) are read whole into one of MB_SLOTS buffers and
 *    submitted as jobs; the manager hands jobs back in submission order, each
 *    having written its digest straight into the output.
 *
 * Contract (kept identical to hashing._hash_span_py, and tested against it):
 * for each i in [start, end), open paths[i] relative to dir_fd (-1: the
 * current directory; absolute paths ignore it), fstat the open file, refuse
 * anything but a regular file, read to EOF (stopping after exactly st_size
 * bytes in one read: the whole file as of the fstat) and write the digest at
 * digests[32*i] and the key (dev, ino, size, mtime_ns, ctime_ns as native
 * int64) at keys[40*i]. A file whose fstat size exceeds max_size is not read:
 * its index is returned in `deferred`, for the Python loop that reports
 * progress inside large files. Failures leave zeros and are returned as
 * (index, strerror) -- or (index, None) when the file is gone (ENOENT).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#ifdef HERMETIC_WITH_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

#define DIGEST_BYTES 32
#define KEY_BYTES 40
#define READ_SIZE (1 << 20)
#define NOT_REGULAR (-1) /* our own "errno": no longer a regular file */
#define DEFERRED INT_MIN /* not an error: too large for this loop */

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif
#ifndef O_NOCTTY
#define O_NOCTTY 0
#endif

static const EVP_MD *sha256_md; /* fetched once: a per-call implicit fetch costs more than a small file's hash */

/* The stat key of the bytes hashed: (dev, ino, size, mtime_ns, ctime_ns), native int64. */
static void put_key(char *keys, Py_ssize_t i, const struct stat *st) {
    int64_t key[5] = {
        (int64_t)st->st_dev,
        (int64_t)st->st_ino,
        (int64_t)st->st_size,
        (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec,
        (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec,
    };
    memcpy(keys + i * KEY_BYTES, key, sizeof key);
}

/* ------------------------------------------------------------------ OpenSSL, streaming */

/* Hash `have` bytes already in buf, then the rest of fd to EOF; 0 or an errno. */
static int openssl_rest(int fd, EVP_MD_CTX *ctx, unsigned char *buf, size_t have, unsigned char *digest) {
    if (!EVP_DigestInit_ex(ctx, sha256_md, NULL) || (have && !EVP_DigestUpdate(ctx, buf, have)))
        return EIO;
    for (;;) {
        ssize_t got = read(fd, buf, READ_SIZE);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (got == 0)
            break;
        if (!EVP_DigestUpdate(ctx, buf, (size_t)got))
            return EIO;
    }
    unsigned int len = 0;
    if (!EVP_DigestFinal_ex(ctx, digest, &len) || len != DIGEST_BYTES)
        return EIO;
    return 0;
}

/* One read of up to `want` bytes (retried on EINTR): the byte count, or -errno. */
static ssize_t read_once(int fd, unsigned char *buf, size_t want) {
    for (;;) {
        ssize_t got = read(fd, buf, want);
        if (got >= 0 || errno != EINTR)
            return got < 0 ? -errno : got;
    }
}

/* The whole file with OpenSSL: one read of size+1 bytes first (a file read whole needs no
 * second read to see EOF), then 1 MiB reads if it was not all there. */
static int openssl_file(int fd, off_t size, EVP_MD_CTX *ctx, unsigned char *buf, unsigned char *digest) {
    if (size >= READ_SIZE)
        return openssl_rest(fd, ctx, buf, 0, digest);
    ssize_t got = read_once(fd, buf, (size_t)size + 1);
    if (got < 0)
        return (int)-got;
    if (got != size) /* the file changed since the fstat: hash what is there now */
        return openssl_rest(fd, ctx, buf, (size_t)got, digest);
    unsigned int len = 0;
    if (!EVP_DigestInit_ex(ctx, sha256_md, NULL) || !EVP_DigestUpdate(ctx, buf, (size_t)got) ||
        !EVP_DigestFinal_ex(ctx, digest, &len) || len != DIGEST_BYTES)
        return EIO;
    return 0;
}

/* ------------------------------------------------------------------ intel-ipsec-mb, many buffers at once */

#ifdef HERMETIC_WITH_IPSEC_MB
#define MB_SLOTS 32             /* files in flight: twice the widest manager's lanes (AVX-512: 16) */
#define MB_SLOT_BYTES (1 << 16) /* a slot holds a whole file and the byte past its end */
#define MB_MAX_BYTES 65534      /* the job API takes plain-SHA messages up to this length */

/* Per thread (a manager is not thread-safe): the manager (~0.5 ms to set up) and the slots'
 * buffers (2 MiB, touched once), kept for the thread's life rather than remade per span. */
static __thread IMB_MGR *mb_mgr;
static __thread unsigned char *mb_arena;
static int mb_state; /* 0 unknown, 1 usable, -1 not (decided once, with the GIL held) */
static const char *mb_arch = "none";

typedef struct {
    IMB_MGR *mgr;
    unsigned char *arena;
    int free_slots[MB_SLOTS], n_free;
    Py_ssize_t k_of[MB_SLOTS];  /* the file in each slot (its position in the span), while in flight */
    size_t size_of[MB_SLOTS];
} mb_hasher;

static IMB_MGR *mb_new(void) {
    IMB_MGR *m = alloc_mb_mgr(0);
    if (!m)
        return NULL;
    init_mb_mgr_auto(m, NULL);
    if (imb_get_errno(m) != 0) {
        free_mb_mgr(m);
        return NULL;
    }
    return m;
}

/* Called with the GIL held, before the first span: is the library there and working? */
static void mb_probe(void) {
    if (mb_state)
        return;
    IMB_MGR *m = mb_new();
    mb_state = m ? 1 : -1;
    if (m) {
        static const char *names[] = {"none", "noaesni", "sse", "avx", "avx2", "avx512"};
        unsigned a = (unsigned)m->used_arch;
        mb_arch = a < sizeof names / sizeof *names ? names[a] : "other";
        mb_mgr = m; /* this thread's */
    }
}

/* With the GIL held: use the library for this span? HERMETIC_NO_IPSEC_MB switches it off at run time. */
static int mb_wanted(void) {
    mb_probe();
    const char *off = getenv("HERMETIC_NO_IPSEC_MB");
    return mb_state == 1 && !(off && *off);
}

static int mb_begin(mb_hasher *h) {
    if (!mb_mgr)
        mb_mgr = mb_new();
    if (!mb_arena)
        mb_arena = malloc((size_t)MB_SLOTS * MB_SLOT_BYTES);
    if (!mb_mgr || !mb_arena)
        return 0;
    h->mgr = mb_mgr;
    h->arena = mb_arena;
    h->n_free = 0;
    for (int s = MB_SLOTS - 1; s >= 0; s--)
        h->free_slots[h->n_free++] = s;
    return 1;
}

/* A job is back: free its slot; if it failed, zero what it was to write and mark the file. */
static void mb_retire(mb_hasher *h, IMB_JOB *job, int *codes, char *digests, char *keys, Py_ssize_t start,
                      long long *nbytes) {
    int s = (int)(intptr_t)job->user_data;
    if (job->status != IMB_STATUS_COMPLETED) {
        Py_ssize_t k = h->k_of[s], i = start + k;
        codes[k] = EIO;
        memset(digests + i * DIGEST_BYTES, 0, DIGEST_BYTES);
        memset(keys + i * KEY_BYTES, 0, KEY_BYTES);
        *nbytes -= (long long)h->size_of[s];
    }
    h->free_slots[h->n_free++] = s;
}

static void mb_retire_completed(mb_hasher *h, IMB_JOB *job, int *codes, char *digests, char *keys,
                                Py_ssize_t start, long long *nbytes) {
    while (job) {
        mb_retire(h, job, codes, digests, keys, start, nbytes);
        job = IMB_GET_COMPLETED_JOB(h->mgr);
    }
}

/* Read the file whole into a slot and submit it. 0: submitted -- its key and bytes are counted
 * now, its digest comes later (a job that fails takes them back out); else an errno, or the file
 * changed size since the fstat, in which case OpenSSL hashed it meanwhile and the caller records it. */
static int mb_file(mb_hasher *h, int fd, const struct stat *st, Py_ssize_t k, EVP_MD_CTX *ctx,
                   unsigned char *stream_buf, unsigned char *digest, int *codes, char *digests, char *keys,
                   Py_ssize_t start, long long *nbytes, int *submitted) {
    off_t size = st->st_size;
    *submitted = 0;
    if (!h->n_free) /* every slot in flight: finish the oldest job (and any others done by then) */
        mb_retire_completed(h, IMB_FLUSH_JOB(h->mgr), codes, digests, keys, start, nbytes);
    if (!h->n_free) /* (cannot happen: a manager with no job in flight leaves every slot free) */
        return openssl_file(fd, size, ctx, stream_buf, digest);
    int s = h->free_slots[--h->n_free];
    unsigned char *slot = h->arena + (size_t)s * MB_SLOT_BYTES;
    ssize_t got = read_once(fd, slot, (size_t)size + 1);
    if (got != size) {
        h->free_slots[h->n_free++] = s;
        if (got < 0)
            return (int)-got;
        /* the file changed since the fstat: hash what is there now, as the streaming path does */
        memcpy(stream_buf, slot, (size_t)got);
        return openssl_rest(fd, ctx, stream_buf, (size_t)got, digest);
    }
    h->k_of[s] = k;
    h->size_of[s] = (size_t)size;
    put_key(keys, start + k, st);
    *nbytes += size;
    IMB_JOB *job = IMB_GET_NEXT_JOB(h->mgr);
    memset(job, 0, sizeof *job);
    job->cipher_mode = IMB_CIPHER_NULL;
    job->cipher_direction = IMB_DIR_ENCRYPT;
    job->chain_order = IMB_ORDER_HASH_CIPHER;
    job->hash_alg = IMB_AUTH_SHA_256;
    job->src = slot;
    job->hash_start_src_offset_in_bytes = 0;
    job->msg_len_to_hash_in_bytes = (uint64_t)size;
    job->auth_tag_output = digest;
    job->auth_tag_output_len_in_bytes = DIGEST_BYTES;
    job->user_data = (void *)(intptr_t)s;
    *submitted = 1;
    mb_retire_completed(h, IMB_SUBMIT_JOB(h->mgr), codes, digests, keys, start, nbytes);
    return 0;
}

static void mb_end(mb_hasher *h, int *codes, char *digests, char *keys, Py_ssize_t start, long long *nbytes) {
    IMB_JOB *job;
    while ((job = IMB_FLUSH_JOB(h->mgr)))
        mb_retire(h, job, codes, digests, keys, start, nbytes);
}
#endif

/* ------------------------------------------------------------------ the loop */

/* paths[start:end] as C strings (ASCII names point into the str objects; others are encoded
 * into `keep`), or NULL with an exception set. */
static const char **c_names(PyObject *paths, Py_ssize_t start, Py_ssize_t n, PyObject *keep) {
    const char **names = PyMem_Calloc((size_t)(n ? n : 1), sizeof *names);
    if (!names) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *p = PyList_GET_ITEM(paths, start + k);
        if (!PyUnicode_Check(p)) {
            PyErr_Format(PyExc_TypeError, "hash_span: path %zd is not a str", start + k);
            goto fail;
        }
        Py_ssize_t len;
        const char *s;
        if (PyUnicode_IS_ASCII(p)) {
            s = PyUnicode_AsUTF8AndSize(p, &len); /* the str's own bytes: no copy */
        } else {
            PyObject *b = PyUnicode_EncodeFSDefault(p); /* surrogateescape: the name's original bytes */
            if (!b || PyList_Append(keep, b) < 0) {
                Py_XDECREF(b);
                goto fail;
            }
            Py_DECREF(b);
            s = PyBytes_AS_STRING(b);
            len = PyBytes_GET_SIZE(b);
        }
        if (!s)
            goto fail;
        if ((Py_ssize_t)strlen(s) != len) {
            PyErr_Format(PyExc_ValueError, "hash_span: path %zd has an embedded null byte", start + k);
            goto fail;
        }
        names[k] = s;
    }
    return names;
fail:
    PyMem_Free(names);
    return NULL;
}

/* (bytes hashed, [(index, strerror or None)], [deferred index]) from the per-file codes. */
static PyObject *span_result(const int *codes, Py_ssize_t start, Py_ssize_t n, long long nbytes) {
    PyObject *errors = PyList_New(0), *deferred = PyList_New(0), *result = NULL;
    if (!errors || !deferred)
        goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        int err = codes[k];
        if (!err)
            continue;
        PyObject *item, *into = err == DEFERRED ? deferred : errors;
        if (err == DEFERRED)
            item = PyLong_FromSsize_t(start + k);
        else if (err == ENOENT)
            item = Py_BuildValue("(nO)", start + k, Py_None);
        else
            item = Py_BuildValue("(ns)", start + k, err == NOT_REGULAR ? "no longer a regular file" : strerror(err));
        if (!item || PyList_Append(into, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    result = Py_BuildValue("(LOO)", nbytes, errors, deferred);
done:
    Py_XDECREF(errors);
    Py_XDECREF(deferred);
    return result;
}

static PyObject *hash_span(PyObject *self, PyObject *args) {
    PyObject *paths;
    Py_ssize_t start, end;
    Py_buffer digests_view, keys_view;
    int dir_fd;
    long long max_size;
    if (!PyArg_ParseTuple(args, "O!nnw*w*iL", &PyList_Type, &paths, &start, &end, &digests_view, &keys_view,
                          &dir_fd, &max_size))
        return NULL;

    PyObject *result = NULL, *keep = NULL;
    const char **names = NULL;
    int *codes = NULL;
    unsigned char *buf = NULL;
    EVP_MD_CTX *ctx = NULL;
    Py_ssize_t n = end - start;

    if (start < 0 || end < start || end > PyList_GET_SIZE(paths)) {
        PyErr_SetString(PyExc_IndexError, "hash_span: span out of range");
        goto done;
    }
    if (digests_view.len < end * DIGEST_BYTES || keys_view.len < end * KEY_BYTES) {
        PyErr_SetString(PyExc_ValueError, "hash_span: output buffers too small");
        goto done;
    }
    keep = PyList_New(0); /* encoded copies of non-ASCII names, alive until the loop ends */
    if (!keep || !(names = c_names(paths, start, n, keep)))
        goto done;
    codes = PyMem_Calloc((size_t)(n ? n : 1), sizeof *codes);
    buf = PyMem_RawMalloc(READ_SIZE);
    ctx = EVP_MD_CTX_new();
    if (!codes || !buf || !ctx) {
        PyErr_NoMemory();
        goto done;
    }
#ifdef HERMETIC_WITH_IPSEC_MB
    int want_mb = mb_wanted();
#endif

    char *digests = digests_view.buf, *keys = keys_view.buf;
    int at = dir_fd < 0 ? AT_FDCWD : dir_fd;
    long long nbytes = 0;
    Py_BEGIN_ALLOW_THREADS
#ifdef HERMETIC_WITH_IPSEC_MB
    mb_hasher mb;
    int use_mb = want_mb && mb_begin(&mb);
#endif
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = start + k;
        unsigned char *digest = (unsigned char *)digests + i * DIGEST_BYTES;
        struct stat st;
        int err = 0;
        int fd = openat(at, names[k], O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK); /* a FIFO must not block */
        if (fd < 0) {
            err = errno;
        } else {
            if (fstat(fd, &st) < 0)
                err = errno;
            else if (!S_ISREG(st.st_mode))
                err = NOT_REGULAR;
            else if ((long long)st.st_size > max_size)
                err = DEFERRED;
#ifdef HERMETIC_WITH_IPSEC_MB
            else if (use_mb && st.st_size <= MB_MAX_BYTES) {
                int submitted;
                err = mb_file(&mb, fd, &st, k, ctx, buf, digest, codes, digests, keys, start, &nbytes, &submitted);
                if (submitted) {
                    close(fd);
                    continue;
                }
            }
#endif
            else
                err = openssl_file(fd, st.st_size, ctx, buf, digest);
            close(fd);
        }
        codes[k] = err;
        if (err == DEFERRED)
            continue;
        if (err) {
            memset(digest, 0, DIGEST_BYTES);
            memset(keys + i * KEY_BYTES, 0, KEY_BYTES);
        } else {
            put_key(keys, i, &st);
            nbytes += st.st_size;
        }
    }
#ifdef HERMETIC_WITH_IPSEC_MB
    if (use_mb)
        mb_end(&mb, codes, digests, keys, start, &nbytes);
#endif
    Py_END_ALLOW_THREADS

    result = span_result(codes, start, n, nbytes);

done:
    Py_XDECREF(keep);
    if (ctx)
        EVP_MD_CTX_free(ctx);
    PyMem_RawFree(buf);
    PyMem_Free(codes);
    PyMem_Free(names);
    PyBuffer_Release(&digests_view);
    PyBuffer_Release(&keys_view);
    return result;
}

static PyObject *backend(PyObject *self, PyObject *unused) {
#ifdef HERMETIC_WITH_IPSEC_MB
    if (mb_wanted())
        return PyUnicode_FromFormat("intel-ipsec-mb %s (%s) for files up to %d bytes, OpenSSL for larger ones",
                                    imb_get_version_str(), mb_arch, MB_MAX_BYTES);
    if (mb_state == 1)
        return PyUnicode_FromString("OpenSSL (intel-ipsec-mb switched off by HERMETIC_NO_IPSEC_MB)");
#endif
    return PyUnicode_FromString("OpenSSL");
}

static PyMethodDef methods[] = {
    {"hash_span", hash_span, METH_VARARGS,
     "hash_span(paths, start, end, digests_out, keys_out, dir_fd, max_size) -> (bytes, errors, deferred)\n\n"
     "sha256 and stat key of paths[start:end] (see hermetic/data/_filehash.c)."},
    {"backend", backend, METH_NOARGS, "backend() -> str: which sha256 implementations the loop uses."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hermetic.data._filehash", "The per-file hashing loop in C (see hashing.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__filehash(void) {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
#else
    sha256_md = EVP_sha256();
#endif
    if (!sha256_md) {
        PyErr_SetString(PyExc_ImportError, "OpenSSL has no SHA256");
        return NULL;
    }
    return PyModule_Create(&module);
}
