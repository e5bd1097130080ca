/* The per-file loop of hermetic.data.hashing, in C: open, fstat, read, sha256, close.
 *
 * Why C: on a dataset of small files the Python version of this loop spends as
 * long in interpreter work (calls, tuples, big ints for the stat key) as in the
 * hashing itself; here it costs the syscalls and the sha256 and nothing else,
 * and the GIL is released for the whole span. The hash is OpenSSL's, the same
 * library behind Python's hashlib (SHA-NI where the CPU has it).
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

#define DIGEST_BYTES 32
#define KEY_BYTES 40
#define READ_SIZE (1 << 20)
#define NOT_REGULAR (-1) /* our own "errno": no longer a regular file */

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif
#ifndef O_NOCTTY
#define O_NOCTTY 0
#endif

static const EVP_MD *sha256_md; /* fetched once: a per-call implicit fetch costs more than a small file's hash */

/* Read fd to EOF into ctx; 0 or an errno. `size` is the fstat size (one read suffices if it returns exactly that). */
static int hash_fd(int fd, off_t size, EVP_MD_CTX *ctx, unsigned char *buf, unsigned char *digest) {
    if (!EVP_DigestInit_ex(ctx, sha256_md, NULL))
        return EIO;
    int first = 1;
    for (;;) {
        /* Ask for one byte more than the file holds, so that a file read whole in one call needs no second read to see EOF. */
        size_t want = READ_SIZE;
        if (first && size >= 0 && (uint64_t)size < READ_SIZE)
            want = (size_t)size + 1;
        ssize_t got = read(fd, buf, want);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (got == 0)
            break;
        if (!EVP_DigestUpdate(ctx, buf, (size_t)got))
            return EIO;
        if (first && (off_t)got == size && want == (size_t)size + 1)
            break; /* exactly st_size bytes: the whole file as of the fstat */
        first = 0;
    }
    unsigned int len = 0;
    if (!EVP_DigestFinal_ex(ctx, digest, &len) || len != DIGEST_BYTES)
        return EIO;
    return 0;
}

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

static PyObject *hash_span(PyObject *self, PyObject *args) {
    PyObject *paths;
    Py_ssize_t start, end;
    Py_buffer digests_view, keys_view;
    int dir_fd;
    long long max_size;
    if (!PyArg_ParseTuple(args, "O!nnw*w*iL", &PyList_Type, &paths, &start, &end, &digests_view, &keys_view,
                          &dir_fd, &max_size))
        return NULL;

    PyObject *result = NULL, *keep = NULL, *errors = NULL, *deferred = NULL;
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
    names = PyMem_Calloc((size_t)(n ? n : 1), sizeof *names);
    codes = PyMem_Calloc((size_t)(n ? n : 1), sizeof *codes);
    keep = PyList_New(0); /* encoded copies of non-ASCII names, alive until the loop ends */
    buf = PyMem_RawMalloc(READ_SIZE);
    ctx = EVP_MD_CTX_new();
    if (!names || !codes || !keep || !buf || !ctx) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *p = PyList_GET_ITEM(paths, start + k);
        if (!PyUnicode_Check(p)) {
            PyErr_Format(PyExc_TypeError, "hash_span: path %zd is not a str", start + k);
            goto done;
        }
        Py_ssize_t len;
        const char *s;
        if (PyUnicode_IS_ASCII(p)) {
            s = PyUnicode_AsUTF8AndSize(p, &len); /* the str's own bytes: no copy */
        } else {
            PyObject *b = PyUnicode_EncodeFSDefault(p); /* surrogateescape: the name's original bytes */
            if (!b || PyList_Append(keep, b) < 0) {
                Py_XDECREF(b);
                goto done;
            }
            Py_DECREF(b);
            s = PyBytes_AS_STRING(b);
            len = PyBytes_GET_SIZE(b);
        }
        if (!s)
            goto done;
        if ((Py_ssize_t)strlen(s) != len) {
            PyErr_Format(PyExc_ValueError, "hash_span: path %zd has an embedded null byte", start + k);
            goto done;
        }
        names[k] = s;
    }

    char *digests = digests_view.buf, *keys = keys_view.buf;
    int at = dir_fd < 0 ? AT_FDCWD : dir_fd;
    long long nbytes = 0;
    Py_ssize_t n_deferred = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = start + k;
        struct stat st;
        int err = 0;
        int fd = openat(at, names[k], O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK); /* a FIFO must not block the open */
        if (fd < 0) {
            err = errno;
        } else {
            if (fstat(fd, &st) < 0)
                err = errno;
            else if (!S_ISREG(st.st_mode))
                err = NOT_REGULAR;
            else if ((long long)st.st_size > max_size) {
                codes[k] = INT_MIN; /* deferred: not an error */
                n_deferred++;
            } else
                err = hash_fd(fd, st.st_size, ctx, buf, (unsigned char *)digests + i * DIGEST_BYTES);
            close(fd);
        }
        if (codes[k] == INT_MIN)
            continue;
        codes[k] = err;
        if (err) {
            memset(digests + i * DIGEST_BYTES, 0, DIGEST_BYTES);
            memset(keys + i * KEY_BYTES, 0, KEY_BYTES);
        } else {
            put_key(keys, i, &st);
            nbytes += st.st_size;
        }
    }
    Py_END_ALLOW_THREADS

    errors = PyList_New(0);
    deferred = PyList_New(0);
    if (!errors || !deferred)
        goto done;
    for (Py_ssize_t k = 0; k < n; k++) {
        int err = codes[k];
        if (!err)
            continue;
        PyObject *item;
        if (err == INT_MIN) {
            item = PyLong_FromSsize_t(start + k);
            if (!item || PyList_Append(deferred, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
            continue;
        }
        if (err == ENOENT)
            item = Py_BuildValue("(nO)", start + k, Py_None);
        else
            item = Py_BuildValue("(ns)", start + k, err == NOT_REGULAR ? "no longer a regular file" : strerror(err));
        if (!item || PyList_Append(errors, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    (void)n_deferred;
    result = Py_BuildValue("(LOO)", nbytes, errors, deferred);

done:
    Py_XDECREF(errors);
    Py_XDECREF(deferred);
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

static PyMethodDef methods[] = {
    {"hash_span", hash_span, METH_VARARGS,
     "hash_span(paths, start, end, digests_out, keys_out, dir_fd, max_size) -> (bytes, errors, deferred)\n\n"
     "sha256 and stat key of paths[start:end] (see hermetic/data/_filehash.c)."},
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
