/*
 * Simulated NVML: a libnvidia-ml.so.1 that answers from the simulated GPU state file (see STATE.md).
 *
 * Loaded unchanged by nvidia-ml-py (`import pynvml`) and by anything else that dlopens
 * "libnvidia-ml.so.1". C99 + POSIX, no dependencies beyond libc.
 *
 *   state file:      $GPUFLEET_SIM_STATE, default /var/lib/gpufleet-sim/hw/gpus.state
 *   library version: $GPUFLEET_SIM_DRIVER_VERSION_FILE, default /usr/lib/gpufleet-sim/driver-version
 *
 * Every call that needs the state re-reads the file under flock(LOCK_SH) (faults and nvidia-smi change it
 * under us); setters re-read and rewrite it in place under flock(LOCK_EX), keys sorted (like state.render()).
 * Handles are pointers into static per-GPU / per-GPU-instance / per-compute-instance / per-MIG-device
 * arrays; their validity against the current state is re-checked at every call.
 *
 * Build: gcc -std=c99 -Wall -Wextra -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------------------------------------ */
/* NVML types (layouts as in nvml.h / pynvml.py)                                                     */
/* ------------------------------------------------------------------------------------------------ */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999
};

#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu
#define NVML_NVLINK_MAX_LINKS 36

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96

/* struct versions: size | (version << 24) */
#define nvmlMemory_v2 0x02000028u
#define nvmlPciInfoExt_v1 0x01000040u
#define nvmlTemperature_v1 0x0100000Cu
#define nvmlPowerValue_v2 0x0200000Cu
#define nvmlGpuInstanceProfileInfo_v2 0x02000098u
#define nvmlComputeInstanceProfileInfo_v2 0x02000088u

typedef struct nvml_obj nvml_obj_t;
typedef nvml_obj_t *nvmlDevice_t;
typedef nvml_obj_t *nvmlGpuInstance_t;
typedef nvml_obj_t *nvmlComputeInstance_t;

/* nvmlPciInfo_t as written by nvmlDeviceGetPciInfo / _v2 (legacy layout, 52 bytes) */
typedef struct {
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v2_t;

/* nvmlPciInfo_t as written by nvmlDeviceGetPciInfo_v3 (68 bytes) */
typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct {
    unsigned int version, domain, bus, device, pciDeviceId, pciSubSystemId, baseClass, subClass;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfoExt_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int version; unsigned int sensorType; int temperature; } nvmlTemperature_t;
typedef struct { unsigned int version; unsigned int powerScope; unsigned int powerValueMw; } nvmlPowerValue_v2_t;

typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t; /* _v2 and _v3 share this layout */

typedef struct { unsigned int start, size; } nvmlGpuInstancePlacement_t;
typedef struct { unsigned int start, size; } nvmlComputeInstancePlacement_t;

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlGpuInstanceProfileInfo_v2_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

typedef struct {
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} nvmlComputeInstanceProfileInfo_t;

typedef struct {
    unsigned int version;
    unsigned int id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
} nvmlComputeInstanceProfileInfo_v2_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
} nvmlComputeInstanceInfo_v1_t;

typedef struct {
    nvmlDevice_t device;
    nvmlGpuInstance_t gpuInstance;
    unsigned int id, profileId;
    nvmlComputeInstancePlacement_t placement;
} nvmlComputeInstanceInfo_t;

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

/* ------------------------------------------------------------------------------------------------ */
/* Handles: static objects                                                                          */
/* ------------------------------------------------------------------------------------------------ */

#define MAX_GPUS 32
#define MAX_GI 16
#define MAX_CI 8
#define OBJ_MAGIC 0x4e564d4cu /* "NVML" */

enum { OBJ_GPU = 1, OBJ_MIG = 2, OBJ_GI = 3, OBJ_CI = 4 };

struct nvml_obj {
    unsigned int magic, kind, gpu, gi, ci;
};

static nvml_obj_t g_gpu[MAX_GPUS];
static nvml_obj_t g_mig[MAX_GPUS][MAX_GI][MAX_CI];
static nvml_obj_t g_gi[MAX_GPUS][MAX_GI];
static nvml_obj_t g_ci[MAX_GPUS][MAX_GI][MAX_CI];

__attribute__((constructor)) static void objects_init(void)
{
    for (unsigned g = 0; g < MAX_GPUS; g++) {
        g_gpu[g] = (nvml_obj_t){OBJ_MAGIC, OBJ_GPU, g, 0, 0};
        for (unsigned i = 0; i < MAX_GI; i++) {
            g_gi[g][i] = (nvml_obj_t){OBJ_MAGIC, OBJ_GI, g, i, 0};
            for (unsigned c = 0; c < MAX_CI; c++) {
                g_mig[g][i][c] = (nvml_obj_t){OBJ_MAGIC, OBJ_MIG, g, i, c};
                g_ci[g][i][c] = (nvml_obj_t){OBJ_MAGIC, OBJ_CI, g, i, c};
            }
        }
    }
}

static int in_array(const void *p, const void *base, size_t bytes)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    return a >= b && a < b + bytes && (a - b) % sizeof(nvml_obj_t) == 0;
}

/* The object behind a handle if it is one of ours and of one of the kinds in the mask, else NULL. */
static const nvml_obj_t *obj_of(const void *p, unsigned kinds)
{
    const nvml_obj_t *o = NULL;
    if (!p)
        return NULL;
    if (in_array(p, g_gpu, sizeof g_gpu) || in_array(p, g_mig, sizeof g_mig) || in_array(p, g_gi, sizeof g_gi) ||
        in_array(p, g_ci, sizeof g_ci))
        o = p;
    if (!o || o->magic != OBJ_MAGIC || !(kinds & (1u << o->kind)))
        return NULL;
    return o;
}

#define K_GPU (1u << OBJ_GPU)
#define K_MIG (1u << OBJ_MIG)
#define K_GI (1u << OBJ_GI)
#define K_CI (1u << OBJ_CI)

/* ------------------------------------------------------------------------------------------------ */
/* Init state                                                                                       */
/* ------------------------------------------------------------------------------------------------ */

static char g_lock;
static int g_refcount;
static pid_t g_registered_pid;
static char g_lib_version[64];

static void lock(void)
{
    while (__atomic_test_and_set(&g_lock, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void unlock(void) { __atomic_clear(&g_lock, __ATOMIC_RELEASE); }

static int initialized(void) { return __atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE) > 0; }

static const char *state_path(void)
{
    const char *p = getenv("GPUFLEET_SIM_STATE");
    return p && *p ? p : "/var/lib/gpufleet-sim/hw/gpus.state";
}

static void read_lib_version(char *out, size_t len)
{
    const char *p = getenv("GPUFLEET_SIM_DRIVER_VERSION_FILE");
    FILE *f = fopen(p && *p ? p : "/usr/lib/gpufleet-sim/driver-version", "r");
    out[0] = '\0';
    if (!f)
        return;
    if (fgets(out, (int)len, f)) {
        size_t n = strlen(out);
        while (n && isspace((unsigned char)out[n - 1]))
            out[--n] = '\0';
    }
    fclose(f);
}

/* ------------------------------------------------------------------------------------------------ */
/* The state file                                                                                   */
/* ------------------------------------------------------------------------------------------------ */

typedef struct {
    char *key, *val;
    int own_key, own_val;
} kv_t;

typedef struct {
    int fd, writable, dirty;
    char *buf;
    kv_t *kv;
    int n, cap;
} state_t;

static int kv_push(state_t *st, char *key, char *val, int own_key, int own_val)
{
    if (st->n == st->cap) {
        int cap = st->cap ? st->cap * 2 : 256;
        kv_t *kv = realloc(st->kv, (size_t)cap * sizeof *kv);
        if (!kv)
            return -1;
        st->kv = kv;
        st->cap = cap;
    }
    st->kv[st->n++] = (kv_t){key, val, own_key, own_val};
    return 0;
}

static void st_free(state_t *st)
{
    for (int i = 0; i < st->n; i++) {
        if (st->kv[i].own_key)
            free(st->kv[i].key);
        if (st->kv[i].own_val)
            free(st->kv[i].val);
    }
    free(st->kv);
    free(st->buf);
    st->kv = NULL;
    st->buf = NULL;
    st->n = st->cap = 0;
}

/* Open, lock (shared, or exclusive when writable) and parse. Returns 0, or -1 with errno set. */
static int st_open(state_t *st, int writable)
{
    memset(st, 0, sizeof *st);
    st->fd = open(state_path(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (st->fd < 0)
        return -1;
    st->writable = writable;
    while (flock(st->fd, writable ? LOCK_EX : LOCK_SH) < 0) {
        if (errno != EINTR) {
            close(st->fd);
            return -1;
        }
    }
    size_t size = 0, cap = 8192;
    st->buf = malloc(cap + 1);
    if (!st->buf)
        goto fail;
    for (;;) {
        if (size == cap) {
            char *b = realloc(st->buf, cap * 2 + 1);
            if (!b)
                goto fail;
            st->buf = b;
            cap *= 2;
        }
        ssize_t r = read(st->fd, st->buf + size, cap - size);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            goto fail;
        if (r == 0)
            break;
        size += (size_t)r;
    }
    st->buf[size] = '\0';
    for (char *line = st->buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r')
            line[len - 1] = '\0';
        char *eq = strchr(line, '=');
        if (line[0] != '#' && eq) {
            *eq = '\0';
            if (kv_push(st, line, eq + 1, 0, 0) < 0)
                goto fail;
        }
        line = nl ? nl + 1 : NULL;
    }
    return 0;
fail:
    st_free(st);
    flock(st->fd, LOCK_UN);
    close(st->fd);
    errno = ENOMEM;
    return -1;
}

static int kv_cmp(const void *a, const void *b) { return strcmp(((const kv_t *)a)->key, ((const kv_t *)b)->key); }

/* Write back (if changed), unlock, close. */
static int st_close(state_t *st)
{
    int rc = 0;
    if (st->writable && st->dirty) {
        qsort(st->kv, (size_t)st->n, sizeof *st->kv, kv_cmp);
        size_t total = 0;
        for (int i = 0; i < st->n; i++)
            total += strlen(st->kv[i].key) + strlen(st->kv[i].val) + 2;
        char *out = malloc(total + 1), *p = out;
        if (!out) {
            rc = -1;
        } else {
            for (int i = 0; i < st->n; i++)
                p += sprintf(p, "%s=%s\n", st->kv[i].key, st->kv[i].val);
            if (ftruncate(st->fd, 0) < 0 || lseek(st->fd, 0, SEEK_SET) < 0)
                rc = -1;
            for (size_t off = 0; rc == 0 && off < total;) {
                ssize_t w = write(st->fd, out + off, total - off);
                if (w < 0 && errno == EINTR)
                    continue;
                if (w <= 0)
                    rc = -1;
                else
                    off += (size_t)w;
            }
            free(out);
        }
    }
    st_free(st);
    flock(st->fd, LOCK_UN);
    close(st->fd);
    return rc;
}

static kv_t *st_find(state_t *st, const char *key)
{
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->kv[i].key, key) == 0)
            return &st->kv[i];
    return NULL;
}

static const char *st_get(state_t *st, const char *key)
{
    kv_t *kv = st_find(st, key);
    return kv ? kv->val : NULL;
}

static int st_set(state_t *st, const char *key, const char *val)
{
    kv_t *kv = st_find(st, key);
    char *v = strdup(val);
    if (!v)
        return -1;
    st->dirty = 1;
    if (kv) {
        if (kv->own_val)
            free(kv->val);
        kv->val = v;
        kv->own_val = 1;
        return 0;
    }
    char *k = strdup(key);
    if (!k || kv_push(st, k, v, 1, 1) < 0) {
        free(k);
        free(v);
        return -1;
    }
    return 0;
}

static void st_del(state_t *st, const char *key)
{
    kv_t *kv = st_find(st, key);
    if (!kv)
        return;
    if (kv->own_key)
        free(kv->key);
    if (kv->own_val)
        free(kv->val);
    *kv = st->kv[--st->n];
    st->dirty = 1;
}

/* gpu.<i>.<field> */
static const char *gf(state_t *st, unsigned gpu, const char *field)
{
    char key[256];
    snprintf(key, sizeof key, "gpu.%u.%s", gpu, field);
    return st_get(st, key);
}

static int gf_set(state_t *st, unsigned gpu, const char *field, const char *val)
{
    char key[256];
    snprintf(key, sizeof key, "gpu.%u.%s", gpu, field);
    return st_set(st, key, val);
}

static int parse_ull(const char *s, int base, unsigned long long *out)
{
    char *end;
    if (!s || !*s)
        return 0;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || end == s)
        return 0;
    while (isspace((unsigned char)*end))
        end++;
    if (*end)
        return 0;
    *out = v;
    return 1;
}

/* Decimal field; 0 when missing/empty/unparsable. */
static int gf_ull(state_t *st, unsigned gpu, const char *field, unsigned long long *out)
{
    return parse_ull(gf(st, gpu, field), 10, out);
}

static int gf_uint(state_t *st, unsigned gpu, const char *field, unsigned int *out)
{
    unsigned long long v;
    if (!gf_ull(st, gpu, field, &v) || v > 0xFFFFFFFFull)
        return 0;
    *out = (unsigned int)v;
    return 1;
}

static int gf_is(state_t *st, unsigned gpu, const char *field, const char *val)
{
    const char *v = gf(st, gpu, field);
    return v && strcmp(v, val) == 0;
}

static unsigned gpu_count(state_t *st)
{
    unsigned long long n = 0;
    parse_ull(st_get(st, "gpu.count"), 10, &n);
    return n > MAX_GPUS ? MAX_GPUS : (unsigned)n;
}

/* n-th comma-separated field of s into out; returns 1 when present. */
static int csv_field(const char *s, int n, char *out, size_t len)
{
    if (!s)
        return 0;
    for (int i = 0; i < n; i++) {
        s = strchr(s, ',');
        if (!s)
            return 0;
        s++;
    }
    size_t k = strcspn(s, ",");
    if (k >= len)
        k = len - 1;
    memcpy(out, s, k);
    out[k] = '\0';
    return 1;
}

static unsigned csv_uint(const char *s, int n)
{
    char buf[64];
    unsigned long long v = 0;
    if (csv_field(s, n, buf, sizeof buf))
        parse_ull(buf, 10, &v);
    return (unsigned)v;
}

typedef struct {
    const char *name;
    unsigned value;
} name_value_t;

/* The value of the entry named `name` (case-insensitive) in a table, else `unknown`. */
static unsigned value_by_name(const name_value_t *table, size_t n, const char *name, unsigned unknown)
{
    unsigned v = unknown;
    for (size_t i = 0; name && i < n; i++)
        if (strcasecmp(name, table[i].name) == 0)
            v = table[i].value;
    return v;
}

#define VALUE_BY_NAME(t, name, unknown) value_by_name((t), sizeof(t) / sizeof((t)[0]), (name), (unknown))

static int pid_alive(long pid)
{
    if (pid <= 0)
        return 0;
    if (kill((pid_t)pid, 0) == 0)
        return 1;
    return errno != ESRCH;
}

/* Live holders (client.<pid>, proc.<pid>) of a GPU other than exclude_pid. */
static int live_holders(state_t *st, unsigned gpu, long exclude_pid)
{
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "gpu.%u.", gpu), count = 0;
    for (int i = 0; i < st->n; i++) {
        const char *k = st->kv[i].key;
        if (strncmp(k, prefix, (size_t)n) != 0)
            continue;
        k += n;
        if (strncmp(k, "client.", 7) == 0)
            k += 7;
        else if (strncmp(k, "proc.", 5) == 0)
            k += 5;
        else
            continue;
        unsigned long long pid;
        if (parse_ull(k, 10, &pid) && (long)pid != exclude_pid && pid_alive((long)pid))
            count++;
    }
    return count;
}

/* ------------------------------------------------------------------------------------------------ */
/* MIG helpers                                                                                      */
/* ------------------------------------------------------------------------------------------------ */

/* mig.gip.<profile_id> row */
typedef struct {
    int present;
    unsigned profile_id, nvml_enum, max_instances, memory_mib, compute_slices, memory_slices, sm, ce, dec, enc,
        jpeg, ofa, p2p;
    char name[48];
    char placements[256];
} gip_t;

static void gip_parse(const char *row, unsigned profile_id, gip_t *g)
{
    memset(g, 0, sizeof *g);
    if (!row)
        return;
    g->present = 1;
    g->profile_id = profile_id;
    csv_field(row, 0, g->name, sizeof g->name);
    g->nvml_enum = csv_uint(row, 1);
    g->max_instances = csv_uint(row, 2);
    g->memory_mib = csv_uint(row, 3);
    g->compute_slices = csv_uint(row, 5);
    g->memory_slices = csv_uint(row, 6);
    g->sm = csv_uint(row, 7);
    g->ce = csv_uint(row, 8);
    g->dec = csv_uint(row, 9);
    g->enc = csv_uint(row, 10);
    g->jpeg = csv_uint(row, 11);
    g->ofa = csv_uint(row, 12);
    g->p2p = csv_uint(row, 13);
    csv_field(row, 14, g->placements, sizeof g->placements);
}

static int gip_by_id(state_t *st, unsigned gpu, unsigned profile_id, gip_t *g)
{
    char field[64];
    snprintf(field, sizeof field, "mig.gip.%u", profile_id);
    gip_parse(gf(st, gpu, field), profile_id, g);
    return g->present;
}

static int gip_by_enum(state_t *st, unsigned gpu, unsigned nvml_enum, gip_t *g)
{
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "gpu.%u.mig.gip.", gpu);
    for (int i = 0; i < st->n; i++) {
        unsigned long long id;
        if (strncmp(st->kv[i].key, prefix, (size_t)n) == 0 && parse_ull(st->kv[i].key + n, 10, &id)) {
            gip_parse(st->kv[i].val, (unsigned)id, g);
            if (g->nvml_enum == nvml_enum)
                return 1;
        }
    }
    memset(g, 0, sizeof *g);
    return 0;
}

/* mig.gi.<id> = profile_id,start,size */
typedef struct {
    int present;
    unsigned profile_id, start, size;
} gi_t;

static int gi_get(state_t *st, unsigned gpu, unsigned gi, gi_t *out)
{
    char field[64];
    snprintf(field, sizeof field, "mig.gi.%u", gi);
    const char *v = gf(st, gpu, field);
    memset(out, 0, sizeof *out);
    if (!v)
        return 0;
    out->present = 1;
    out->profile_id = csv_uint(v, 0);
    out->start = csv_uint(v, 1);
    out->size = csv_uint(v, 2);
    return 1;
}

/* mig.ci.<gi>.<ci> = ci_profile_id,slice_count */
static const char *ci_get(state_t *st, unsigned gpu, unsigned gi, unsigned ci)
{
    char field[64];
    snprintf(field, sizeof field, "mig.ci.%u.%u", gi, ci);
    return gf(st, gpu, field);
}

/* present[gi][ci] for the compute instances in the state */
static void ci_map(state_t *st, unsigned gpu, unsigned char present[MAX_GI][MAX_CI])
{
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "gpu.%u.mig.ci.", gpu);
    memset(present, 0, MAX_GI * MAX_CI);
    for (int i = 0; i < st->n; i++) {
        unsigned gi, ci;
        char extra;
        if (strncmp(st->kv[i].key, prefix, (size_t)n) == 0 &&
            sscanf(st->kv[i].key + n, "%u.%u%c", &gi, &ci, &extra) == 2 && gi < MAX_GI && ci < MAX_CI)
            present[gi][ci] = 1;
    }
}

static int mig_enabled(state_t *st, unsigned gpu) { return gf_is(st, gpu, "mig.current", "1"); }

/* CI profile enum -> compute slices */
static unsigned ci_profile_slices(unsigned profile)
{
    static const unsigned slices[] = {1, 2, 3, 4, 7, 8, 6};
    return profile < sizeof slices / sizeof slices[0] ? slices[profile] : 0;
}

static int ci_profile_allowed(unsigned slices, unsigned gi_slices)
{
    if (!slices || slices > gi_slices)
        return 0;
    return slices == gi_slices || slices <= 2 || (gi_slices == 7 && (slices == 3 || slices == 4));
}

/* "<n>c.<giname>" or the GI name when the CI spans the whole GI */
static void ci_name(char *out, size_t len, unsigned ci_slices, const gip_t *gip)
{
    if (ci_slices == gip->compute_slices)
        snprintf(out, len, "%s", gip->name);
    else
        snprintf(out, len, "%uc.%s", ci_slices, gip->name);
}

/* Slices of a CI (field 1; default: the whole GI) and its start inside the GI (field 2; default 0). */
static unsigned ci_slices(state_t *st, unsigned gpu, unsigned gi, unsigned ci, const gip_t *gip)
{
    char buf[32];
    unsigned long long v;
    if (csv_field(ci_get(st, gpu, gi, ci), 1, buf, sizeof buf) && parse_ull(buf, 10, &v))
        return (unsigned)v;
    return gip ? gip->compute_slices : 0;
}

static unsigned ci_start(state_t *st, unsigned gpu, unsigned gi, unsigned ci) { return csv_uint(ci_get(st, gpu, gi, ci), 2); }

/* Framebuffer a GPU instance uses with nothing running (nvidia-smi: round(8.67 * compute slices) MiB). */
static unsigned gi_overhead_mib(unsigned compute_slices) { return (unsigned)(8.67 * compute_slices + 0.5); }

/* SMs of a CI: the GI's when it spans the GI, else min(1-slice SMs * slices, GI SMs) as nvidia-smi prints. */
static unsigned ci_sm(state_t *st, unsigned gpu, const gip_t *gip, unsigned slices)
{
    if (slices >= gip->compute_slices)
        return gip->sm;
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "gpu.%u.mig.gip.", gpu);
    unsigned one = 0;
    for (int i = 0; i < st->n; i++)
        if (strncmp(st->kv[i].key, prefix, (size_t)n) == 0 && csv_uint(st->kv[i].val, 5) == 1) {
            unsigned sm = csv_uint(st->kv[i].val, 7);
            if (!one || sm < one)
                one = sm;
        }
    return one * slices < gip->sm ? one * slices : gip->sm;
}

/* ------------------------------------------------------------------------------------------------ */
/* MIG device UUIDs: the CI's `uuid` field, else uuid5(NAMESPACE_URL, "<gpu uuid>/<gi>/<ci>") as      */
/* nvidia-smi (smi_common.mig_uuid) derives it                                                      */
/* ------------------------------------------------------------------------------------------------ */

typedef struct {
    uint32_t h[5];
    uint64_t len;
    unsigned char buf[64];
    size_t n;
} sha1_t;

static uint32_t rol(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }

static void sha1_block(sha1_t *c, const unsigned char *p)
{
    uint32_t w[80], a = c->h[0], b = c->h[1], d = c->h[3], e = c->h[4], cc = c->h[2];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) {
            f = (b & cc) | (~b & d);
            k = 0x5A827999u;
        } else if (i < 40) {
            f = b ^ cc ^ d;
            k = 0x6ED9EBA1u;
        } else if (i < 60) {
            f = (b & cc) | (b & d) | (cc & d);
            k = 0x8F1BBCDCu;
        } else {
            f = b ^ cc ^ d;
            k = 0xCA62C1D6u;
        }
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d;
        d = cc;
        cc = rol(b, 30);
        b = a;
        a = t;
    }
    c->h[0] += a;
    c->h[1] += b;
    c->h[2] += cc;
    c->h[3] += d;
    c->h[4] += e;
}

static void sha1_init(sha1_t *c)
{
    static const uint32_t iv[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
    memcpy(c->h, iv, sizeof iv);
    c->len = 0;
    c->n = 0;
}

static void sha1_update(sha1_t *c, const void *data, size_t len)
{
    const unsigned char *p = data;
    c->len += len;
    while (len--) {
        c->buf[c->n++] = *p++;
        if (c->n == 64) {
            sha1_block(c, c->buf);
            c->n = 0;
        }
    }
}

static void sha1_final(sha1_t *c, unsigned char out[20])
{
    uint64_t bits = c->len * 8;
    unsigned char pad = 0x80, zero = 0, lenb[8];
    sha1_update(c, &pad, 1);
    while (c->n != 56)
        sha1_update(c, &zero, 1);
    for (int i = 0; i < 8; i++)
        lenb[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha1_update(c, lenb, 8);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (unsigned char)(c->h[i] >> (24 - 8 * j));
}

static void mig_uuid(char *out, size_t len, state_t *st, unsigned gpu, unsigned gi, unsigned ci)
{
    static const unsigned char ns_url[16] = {0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad, 0x11, 0xd1,
                                             0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8};
    char field[64], name[160];
    snprintf(field, sizeof field, "mig.ci.%u.%u", gi, ci);
    if (csv_field(gf(st, gpu, field), 3, out, len) && out[0])
        return;
    const char *u = gf(st, gpu, "uuid");
    snprintf(name, sizeof name, "%s/%u/%u", u ? u : "", gi, ci);
    sha1_t c;
    unsigned char h[20];
    sha1_init(&c);
    sha1_update(&c, ns_url, sizeof ns_url);
    sha1_update(&c, name, strlen(name));
    sha1_final(&c, h);
    h[6] = (unsigned char)((h[6] & 0x0f) | 0x50);
    h[8] = (unsigned char)((h[8] & 0x3f) | 0x80);
    snprintf(out, len, "MIG-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", h[0], h[1], h[2],
             h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]);
}

/* ------------------------------------------------------------------------------------------------ */
/* Per-call context                                                                                 */
/* ------------------------------------------------------------------------------------------------ */

typedef struct {
    state_t st;
    const nvml_obj_t *obj;
    unsigned gpu;
} ctx_t;

/* Check init and handle, load the state, check the GPU is there and not lost and (for MIG objects) that
 * the instance still exists. kinds: which handle kinds this function accepts; a MIG device handle given to a
 * function that does not accept one yields NOT_SUPPORTED. */
static nvmlReturn_t begin(ctx_t *c, const void *handle, unsigned kinds, int writable)
{
    memset(c, 0, sizeof *c);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    unsigned family = (kinds & (K_GPU | K_MIG)) ? (K_GPU | K_MIG) : kinds;
    c->obj = obj_of(handle, family);
    if (!c->obj)
        return NVML_ERROR_INVALID_ARGUMENT;
    c->gpu = c->obj->gpu;
    if (st_open(&c->st, writable) < 0)
        return writable && (errno == EACCES || errno == EPERM) ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
    nvmlReturn_t r = NVML_SUCCESS;
    if (c->gpu >= gpu_count(&c->st))
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (gf_is(&c->st, c->gpu, "lost", "1"))
        r = NVML_ERROR_GPU_IS_LOST;
    else if (c->obj->kind != OBJ_GPU) {
        gi_t gi;
        if (!mig_enabled(&c->st, c->gpu) || !gi_get(&c->st, c->gpu, c->obj->gi, &gi))
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if ((c->obj->kind == OBJ_MIG || c->obj->kind == OBJ_CI) && !ci_get(&c->st, c->gpu, c->obj->gi, c->obj->ci))
            r = NVML_ERROR_INVALID_ARGUMENT;
        else if (!(kinds & (1u << c->obj->kind)))
            r = NVML_ERROR_NOT_SUPPORTED;
    }
    if (r != NVML_SUCCESS)
        st_close(&c->st);
    return r;
}

static nvmlReturn_t end(ctx_t *c, nvmlReturn_t r)
{
    if (st_close(&c->st) < 0 && r == NVML_SUCCESS)
        r = NVML_ERROR_UNKNOWN;
    return r;
}

#define BEGIN(h, kinds, w)                                                                                    \
    ctx_t c;                                                                                                  \
    do {                                                                                                      \
        nvmlReturn_t br_ = begin(&c, (h), (kinds), (w));                                                      \
        if (br_ != NVML_SUCCESS)                                                                              \
            return br_;                                                                                       \
    } while (0)
#define END(r) return end(&c, (r))
#define F(field) gf(&c.st, c.gpu, (field))

/* The GPU instance profile of the handle's GPU instance (MIG device, GPU instance, compute instance handles). */
static int obj_gip(ctx_t *c, gip_t *gip)
{
    gi_t gi;
    gi_get(&c->st, c->gpu, c->obj->gi, &gi);
    return gip_by_id(&c->st, c->gpu, gi.profile_id, gip);
}

static nvmlReturn_t copy_str(char *dst, unsigned int len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* Output an unsigned decimal field; empty/missing -> NOT_SUPPORTED. */
static nvmlReturn_t uint_field(nvmlDevice_t device, const char *field, unsigned int *out)
{
    BEGIN(device, K_GPU, 0);
    if (!out)
        END(NVML_ERROR_INVALID_ARGUMENT);
    END(gf_uint(&c.st, c.gpu, field, out) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED);
}

/* 1 when a decimal field is set, else 0: one fan, power management on. */
static nvmlReturn_t uint_field_present(nvmlDevice_t device, const char *field, unsigned int *out)
{
    BEGIN(device, K_GPU, 0);
    if (!out)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned v;
    *out = gf_uint(&c.st, c.gpu, field, &v) ? 1 : 0;
    END(NVML_SUCCESS);
}

/* A mode with "<mode>.supported", "<mode>.current" and "<mode>.pending" fields (ECC, MIG). */
static nvmlReturn_t mode_pair(nvmlDevice_t device, const char *mode, unsigned int *current, unsigned int *pending)
{
    char supported[32], cur[32], pend[32];
    snprintf(supported, sizeof supported, "%s.supported", mode);
    snprintf(cur, sizeof cur, "%s.current", mode);
    snprintf(pend, sizeof pend, "%s.pending", mode);
    BEGIN(device, K_GPU, 0);
    if (!current || !pending)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!gf_is(&c.st, c.gpu, supported, "1"))
        END(NVML_ERROR_NOT_SUPPORTED);
    *current = gf_is(&c.st, c.gpu, cur, "1");
    *pending = gf_is(&c.st, c.gpu, pend, "1");
    END(NVML_SUCCESS);
}

static int is_root(void) { return geteuid() == 0; }

/* ------------------------------------------------------------------------------------------------ */
/* Init / shutdown / errors                                                                         */
/* ------------------------------------------------------------------------------------------------ */

static void self_comm(char *out, size_t len)
{
    FILE *f = fopen("/proc/self/comm", "r");
    snprintf(out, len, "unknown");
    if (f) {
        if (fgets(out, (int)len, f))
            out[strcspn(out, "\n")] = '\0';
        fclose(f);
    }
}

static void unregister_client(pid_t pid)
{
    state_t st;
    if (st_open(&st, 1) < 0)
        return;
    char suffix[64];
    int n = snprintf(suffix, sizeof suffix, ".client.%ld", (long)pid);
    for (int i = st.n - 1; i >= 0; i--) {
        size_t kl = strlen(st.kv[i].key);
        if (strncmp(st.kv[i].key, "gpu.", 4) == 0 && kl > (size_t)n && strcmp(st.kv[i].key + kl - n, suffix) == 0)
            st_del(&st, st.kv[i].key);
    }
    st_close(&st);
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t r = NVML_SUCCESS;
    lock();
    if (g_refcount > 0) {
        g_refcount++;
        unlock();
        return NVML_SUCCESS;
    }
    read_lib_version(g_lib_version, sizeof g_lib_version);
    state_t st;
    int writable = 1;
    if (st_open(&st, 1) < 0) {
        writable = 0;
        if (st_open(&st, 0) < 0) {
            unlock();
            return NVML_ERROR_DRIVER_NOT_LOADED; /* no GPU state: as if no kernel module */
        }
    }
    const char *loaded = st_get(&st, "driver.loaded"), *version = st_get(&st, "driver.version");
    if (!loaded || strcmp(loaded, "1") != 0)
        r = NVML_ERROR_DRIVER_NOT_LOADED;
    else if (g_lib_version[0] && (!version || strcmp(version, g_lib_version) != 0))
        r = NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    if (r == NVML_SUCCESS && writable) {
        /* Opening the device files makes us a client holding every GPU. */
        char comm[64], field[64];
        self_comm(comm, sizeof comm);
        snprintf(field, sizeof field, "client.%ld", (long)getpid());
        for (unsigned g = 0, n = gpu_count(&st); g < n; g++)
            gf_set(&st, g, field, comm);
        g_registered_pid = getpid();
    } else {
        g_registered_pid = 0;
    }
    st_close(&st);
    if (r == NVML_SUCCESS)
        __atomic_store_n(&g_refcount, 1, __ATOMIC_RELEASE);
    unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    lock();
    if (g_refcount <= 0) {
        unlock();
        return NVML_ERROR_UNINITIALIZED;
    }
    if (g_refcount == 1 && g_registered_pid && g_registered_pid == getpid())
        unregister_client(g_registered_pid);
    if (g_refcount == 1)
        g_registered_pid = 0;
    __atomic_store_n(&g_refcount, g_refcount - 1, __ATOMIC_RELEASE);
    unlock();
    return NVML_SUCCESS;
}

/* A process that exits without nvmlShutdown closes its device files too. */
__attribute__((destructor)) static void at_unload(void)
{
    if (g_refcount > 0 && g_registered_pid && g_registered_pid == getpid())
        unregister_client(g_registered_pid);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, becasue ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "System is not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "No GPUs were found";
    case NVML_ERROR_INVALID_STATE: return "Resource not in correct state to perform requested operation";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset not supported for given device/parameters";
    default: return "Unknown Error";
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* System queries                                                                                   */
/* ------------------------------------------------------------------------------------------------ */

/* Calls without a handle: check init, load the state (into `st`), then check the arguments (args_ok). */
static nvmlReturn_t sys_begin(state_t *st, int args_ok)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (st_open(st, 0) < 0)
        return NVML_ERROR_UNKNOWN;
    if (!args_ok) {
        st_close(st);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

#define SYS_BEGIN(args_ok)                                                                                    \
    state_t st;                                                                                               \
    do {                                                                                                      \
        nvmlReturn_t sr_ = sys_begin(&st, (args_ok));                                                         \
        if (sr_ != NVML_SUCCESS)                                                                              \
            return sr_;                                                                                       \
    } while (0)

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    SYS_BEGIN(1);
    const char *v = st_get(&st, "driver.version");
    char buf[64];
    snprintf(buf, sizeof buf, "%s", v && *v ? v : g_lib_version);
    st_close(&st);
    return copy_str(version, length, buf);
}

/* driver.cuda_version, or when empty the branch map of simgpu.state.CUDA_BY_BRANCH (keep in sync). */
static int cuda_version_int(state_t *st)
{
    static const struct { unsigned branch, version; } by_branch[] = {
        {525, 12000}, {530, 12010}, {535, 12020}, {545, 12030}, {550, 12040}, {555, 12050}, {560, 12060},
        {565, 12070}, {570, 12080}, {575, 12090}, {580, 13000}, {590, 13010}, {595, 13020}, {600, 13020},
        {610, 13030},
    };
    const char *v = st_get(st, "driver.cuda_version");
    unsigned major = 0, minor = 0, branch = 0;
    if (v && sscanf(v, "%u.%u", &major, &minor) >= 1)
        return (int)(major * 1000 + minor * 10);
    const char *d = st_get(st, "driver.version");
    if ((!d || sscanf(d, "%u", &branch) != 1) && sscanf(g_lib_version, "%u", &branch) != 1)
        return 0;
    int found = 0;
    for (size_t i = 0; i < sizeof by_branch / sizeof by_branch[0]; i++)
        if (by_branch[i].branch <= branch)
            found = (int)by_branch[i].version;
    return found;
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    /* "<CUDA major>.<driver version>", e.g. 12.570.172.08; callable before nvmlInit. */
    char buf[96], lib[64];
    int cuda = 0;
    read_lib_version(lib, sizeof lib);
    state_t st;
    if (st_open(&st, 0) == 0) {
        cuda = cuda_version_int(&st);
        if (!lib[0]) {
            const char *v = st_get(&st, "driver.version");
            snprintf(lib, sizeof lib, "%s", v ? v : "");
        }
        st_close(&st);
    }
    if (cuda)
        snprintf(buf, sizeof buf, "%d.%s", cuda / 1000, lib);
    else
        snprintf(buf, sizeof buf, "%s", lib);
    return copy_str(version, length, buf);
}

static nvmlReturn_t cuda_driver_version(int *out)
{
    SYS_BEGIN(out != NULL);
    int v = cuda_version_int(&st);
    st_close(&st);
    if (!v)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = v;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return cuda_driver_version(cudaDriverVersion);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return cuda_driver_version(cudaDriverVersion);
}

EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    SYS_BEGIN(1);
    char buf[1024] = "", suffix[64];
    int n = snprintf(suffix, sizeof suffix, ".proc.%u", pid);
    for (int i = 0; i < st.n && !buf[0]; i++) {
        size_t kl = strlen(st.kv[i].key);
        if (kl > (size_t)n && strcmp(st.kv[i].key + kl - n, suffix) == 0)
            csv_field(st.kv[i].val, 0, buf, sizeof buf);
    }
    st_close(&st);
    if (!buf[0]) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
        FILE *f = fopen(path, "r");
        if (f) {
            size_t got = fread(buf, 1, sizeof buf - 1, f);
            buf[got] = '\0';
            fclose(f);
        }
        if (!buf[0]) {
            snprintf(path, sizeof path, "/proc/%u/comm", pid);
            f = fopen(path, "r");
            if (f) {
                if (fgets(buf, sizeof buf, f))
                    buf[strcspn(buf, "\n")] = '\0';
                fclose(f);
            }
        }
    }
    if (!buf[0])
        return NVML_ERROR_NOT_FOUND;
    return copy_str(name, length, buf);
}

/* ------------------------------------------------------------------------------------------------ */
/* Device handles                                                                                   */
/* ------------------------------------------------------------------------------------------------ */

static nvmlReturn_t device_count(unsigned int *count)
{
    SYS_BEGIN(count != NULL);
    *count = gpu_count(&st);
    st_close(&st);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return device_count(deviceCount); }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { return device_count(deviceCount); }

static nvmlReturn_t handle_by_index(unsigned int index, nvmlDevice_t *device)
{
    SYS_BEGIN(device != NULL);
    unsigned n = gpu_count(&st);
    st_close(&st);
    if (index >= n)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* A lost GPU still gets a handle; every query on it then answers GPU_IS_LOST. */
    *device = &g_gpu[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return handle_by_index(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    SYS_BEGIN(uuid && device);
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    for (unsigned g = 0, n = gpu_count(&st); g < n && r; g++) {
        const char *u = gf(&st, g, "uuid");
        if (u && strcasecmp(u, uuid) == 0) {
            *device = &g_gpu[g];
            r = NVML_SUCCESS;
        } else if (u && strncasecmp(uuid, "MIG-", 4) == 0 && mig_enabled(&st, g)) {
            unsigned char present[MAX_GI][MAX_CI];
            ci_map(&st, g, present);
            for (unsigned gi = 0; gi < MAX_GI && r; gi++)
                for (unsigned ci = 0; ci < MAX_CI && r; ci++) {
                    char mu[128];
                    if (!present[gi][ci])
                        continue;
                    mig_uuid(mu, sizeof mu, &st, g, gi, ci);
                    if (strcasecmp(mu, uuid) == 0) {
                        *device = &g_mig[g][gi][ci];
                        r = NVML_SUCCESS;
                    }
                }
        }
    }
    st_close(&st);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    SYS_BEGIN(serial && device);
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    for (unsigned g = 0, n = gpu_count(&st); g < n && r; g++) {
        const char *s = gf(&st, g, "serial");
        if (s && *s && strcmp(s, serial) == 0) {
            *device = &g_gpu[g];
            r = NVML_SUCCESS;
        }
    }
    st_close(&st);
    return r;
}

/* "domain:bus:device.function" or "bus:device.function" */
static int parse_bus_id(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn)
{
    char extra;
    if (!s)
        return 0;
    if (sscanf(s, "%x:%x:%x.%x%c", dom, bus, dev, fn, &extra) == 4)
        return 1;
    *dom = 0;
    return sscanf(s, "%x:%x.%x%c", bus, dev, fn, &extra) == 3;
}

static nvmlReturn_t handle_by_bus_id(const char *busId, nvmlDevice_t *device)
{
    unsigned d, b, v, f;
    SYS_BEGIN(device && parse_bus_id(busId, &d, &b, &v, &f));
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    for (unsigned g = 0, n = gpu_count(&st); g < n && r; g++) {
        unsigned d2, b2, v2, f2;
        if (parse_bus_id(gf(&st, g, "pci.bus_id"), &d2, &b2, &v2, &f2) && d == d2 && b == b2 && v == v2 && f == f2) {
            *device = &g_gpu[g];
            r = NVML_SUCCESS;
        }
    }
    st_close(&st);
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return handle_by_bus_id(pciBusId, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    return handle_by_bus_id(pciBusId, device);
}

/* ------------------------------------------------------------------------------------------------ */
/* Identity                                                                                         */
/* ------------------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    const char *n = F("name");
    char buf[256];
    snprintf(buf, sizeof buf, "%s", n ? n : "");
    if (c.obj->kind == OBJ_MIG) {
        gip_t gip;
        char cn[96];
        obj_gip(&c, &gip);
        ci_name(cn, sizeof cn, ci_slices(&c.st, c.gpu, c.obj->gi, c.obj->ci, &gip), &gip);
        snprintf(buf, sizeof buf, "%s MIG %s", n ? n : "", cn);
    }
    END(copy_str(name, length, buf));
}

enum {
    NVML_BRAND_UNKNOWN = 0, NVML_BRAND_QUADRO = 1, NVML_BRAND_TESLA = 2, NVML_BRAND_NVS = 3, NVML_BRAND_GRID = 4,
    NVML_BRAND_GEFORCE = 5, NVML_BRAND_TITAN = 6, NVML_BRAND_QUADRO_RTX = 12, NVML_BRAND_NVIDIA_RTX = 13,
    NVML_BRAND_NVIDIA = 14
};

static int is_geforce(state_t *st, unsigned gpu)
{
    const char *b = gf(st, gpu, "brand");
    return b && strcasecmp(b, "GeForce") == 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, unsigned int *type)
{
    static const name_value_t brands[] = {
        {"Quadro", NVML_BRAND_QUADRO}, {"Tesla", NVML_BRAND_TESLA}, {"NVS", NVML_BRAND_NVS},
        {"GRID", NVML_BRAND_GRID}, {"GeForce", NVML_BRAND_GEFORCE}, {"Titan", NVML_BRAND_TITAN},
        {"Quadro RTX", NVML_BRAND_QUADRO_RTX}, {"NVIDIA RTX", NVML_BRAND_NVIDIA_RTX}, {"NVIDIA", NVML_BRAND_NVIDIA},
    };
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!type)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *type = VALUE_BY_NAME(brands, F("brand"), NVML_BRAND_UNKNOWN);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    BEGIN(device, K_GPU, 0);
    if (!index)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *index = c.gpu;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    return uint_field(device, "minor", minorNumber);
}

static nvmlReturn_t string_field(nvmlDevice_t device, const char *field, char *out, unsigned int length)
{
    BEGIN(device, K_GPU, 0);
    const char *v = F(field);
    if (!v || !*v)
        END(NVML_ERROR_NOT_SUPPORTED);
    END(copy_str(out, length, v));
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    return string_field(device, "serial", serial, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    return string_field(device, "vbios", version, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    const char *u = F("uuid");
    char buf[128];
    if (c.obj->kind == OBJ_MIG)
        mig_uuid(buf, sizeof buf, &c.st, c.gpu, c.obj->gi, c.obj->ci);
    else
        snprintf(buf, sizeof buf, "%s", u ? u : "");
    END(copy_str(uuid, length, buf));
}

static void pci_values(state_t *st, unsigned gpu, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *devid,
                       unsigned *subid, char legacy[16])
{
    unsigned fn = 0;
    unsigned long long v;
    *dom = *bus = *dev = *devid = *subid = 0;
    parse_bus_id(gf(st, gpu, "pci.bus_id"), dom, bus, dev, &fn);
    if (parse_ull(gf(st, gpu, "pci.device_id"), 16, &v))
        *devid = (unsigned)v;
    if (parse_ull(gf(st, gpu, "pci.sub_device_id"), 16, &v))
        *subid = (unsigned)v;
    snprintf(legacy, 16, "%04X:%02X:%02X.%X", *dom & 0xffff, *bus & 0xff, *dev & 0xff, fn & 0xf);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!pci)
        END(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof *pci);
    pci_values(&c.st, c.gpu, &pci->domain, &pci->bus, &pci->device, &pci->pciDeviceId, &pci->pciSubSystemId,
               pci->busIdLegacy);
    const char *b = F("pci.bus_id");
    snprintf(pci->busId, sizeof pci->busId, "%s", b ? b : "");
    END(NVML_SUCCESS);
}

static nvmlReturn_t pci_info_v2(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!pci)
        END(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof *pci);
    pci_values(&c.st, c.gpu, &pci->domain, &pci->bus, &pci->device, &pci->pciDeviceId, &pci->pciSubSystemId,
               pci->busId);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    return pci_info_v2(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    return pci_info_v2(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!pci)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (pci->version != nvmlPciInfoExt_v1)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    char legacy[16];
    pci_values(&c.st, c.gpu, &pci->domain, &pci->bus, &pci->device, &pci->pciDeviceId, &pci->pciSubSystemId,
               legacy);
    pci->baseClass = 0x3;                                  /* display controller */
    pci->subClass = is_geforce(&c.st, c.gpu) ? 0x0 : 0x2; /* VGA : 3D controller */
    const char *b = F("pci.bus_id");
    snprintf(pci->busId, sizeof pci->busId, "%s", b ? b : "");
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    static const name_value_t archs[] = {
        {"Kepler", 2}, {"Maxwell", 3}, {"Pascal", 4}, {"Volta", 5}, {"Turing", 6}, {"Ampere", 7},
        {"Ada Lovelace", 8}, {"Ada", 8}, {"Hopper", 9}, {"Blackwell", 10}, {"Rubin", 13},
    };
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!arch)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *arch = VALUE_BY_NAME(archs, F("architecture"), 0xffffffffu /* NVML_DEVICE_ARCH_UNKNOWN */);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!major || !minor)
        END(NVML_ERROR_INVALID_ARGUMENT);
    const char *cc = F("compute_cap");
    if (!cc || sscanf(cc, "%d.%d", major, minor) != 2)
        END(NVML_ERROR_NOT_SUPPORTED);
    END(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* Memory                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

/* proc.<pid> = name,used_mib[,gi_id,ci_id[,type]] */
typedef struct {
    unsigned pid, used_mib, gi, ci; /* gi/ci: NVML_VALUE_NOT_AVAILABLE_UINT when not in a MIG instance */
    int compute, graphics;
} proc_t;

static int proc_parse(const char *key_pid, const char *val, proc_t *p)
{
    unsigned long long pid, v;
    char buf[32];
    if (!parse_ull(key_pid, 10, &pid) || !pid_alive((long)pid))
        return 0;
    p->pid = (unsigned)pid;
    p->used_mib = csv_uint(val, 1);
    p->gi = csv_field(val, 2, buf, sizeof buf) && parse_ull(buf, 10, &v) ? (unsigned)v : NVML_VALUE_NOT_AVAILABLE_UINT;
    p->ci = csv_field(val, 3, buf, sizeof buf) && parse_ull(buf, 10, &v) ? (unsigned)v : NVML_VALUE_NOT_AVAILABLE_UINT;
    if (!csv_field(val, 4, buf, sizeof buf) || !buf[0])
        strcpy(buf, "C");
    p->compute = strchr(buf, 'C') != NULL;
    p->graphics = strchr(buf, 'G') != NULL;
    return 1;
}

/* Live processes of a GPU, in state order; returns the count (fills up to max). */
static unsigned procs_of(state_t *st, unsigned gpu, proc_t *out, unsigned max)
{
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "gpu.%u.proc.", gpu);
    unsigned count = 0;
    for (int i = 0; i < st->n; i++) {
        proc_t p;
        if (strncmp(st->kv[i].key, prefix, (size_t)n) == 0 && proc_parse(st->kv[i].key + n, st->kv[i].val, &p)) {
            if (out && count < max)
                out[count] = p;
            count++;
        }
    }
    return count;
}

#define MAX_PROCS 256

/* total / reserved / used (without reserved), bytes -- the numbers nvidia-smi prints (smi_table.used_mib). */
static void memory_values(ctx_t *c, unsigned long long *total, unsigned long long *reserved,
                          unsigned long long *used)
{
    const unsigned long long MiB = 1024ull * 1024ull;
    unsigned long long t = 0, r = 0, u = 0;
    proc_t procs[MAX_PROCS];
    unsigned np = procs_of(&c->st, c->gpu, procs, MAX_PROCS);
    if (np > MAX_PROCS)
        np = MAX_PROCS;
    if (c->obj->kind == OBJ_MIG) {
        /* a MIG device: its GPU instance's memory, shared by the GI's compute instances */
        gip_t gip;
        obj_gip(c, &gip);
        t = gip.memory_mib;
        u = gi_overhead_mib(gip.compute_slices);
        for (unsigned i = 0; i < np; i++)
            if (procs[i].gi == c->obj->gi)
                u += procs[i].used_mib;
    } else {
        gf_ull(&c->st, c->gpu, "memory.total_mib", &t);
        gf_ull(&c->st, c->gpu, "memory.reserved_mib", &r);
        gf_ull(&c->st, c->gpu, "memory.used_mib", &u);
        for (unsigned i = 0; i < np; i++)
            u += procs[i].used_mib;
        if (mig_enabled(&c->st, c->gpu))
            for (unsigned id = 0; id < MAX_GI; id++) {
                gi_t gi;
                gip_t gip;
                if (gi_get(&c->st, c->gpu, id, &gi) && gip_by_id(&c->st, c->gpu, gi.profile_id, &gip))
                    u += gi_overhead_mib(gip.compute_slices);
            }
    }
    if (r > t)
        r = t;
    if (u > t - r)
        u = t - r;
    *total = t * MiB;
    *reserved = r * MiB;
    *used = u * MiB;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!memory)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long t, r, u;
    memory_values(&c, &t, &r, &u);
    memory->total = t;
    memory->used = u + r; /* v1 counts the reserved memory as used */
    memory->free = t - u - r;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!memory)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long t, r, u;
    memory_values(&c, &t, &r, &u);
    memory->total = t;
    memory->reserved = r;
    memory->used = u;
    memory->free = t - u - r;
    END(NVML_SUCCESS);
}

typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;

EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    const unsigned long long MiB = 1024ull * 1024ull;
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!bar1Memory)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long bar1, mem = 0, reserved = 0, slices = 8, total, used;
    if (!gf_ull(&c.st, c.gpu, "bar1.total_mib", &bar1))
        END(NVML_ERROR_NOT_SUPPORTED);
    gf_ull(&c.st, c.gpu, "memory.total_mib", &mem);
    gf_ull(&c.st, c.gpu, "memory.reserved_mib", &reserved);
    if (!gf_ull(&c.st, c.gpu, "mig.slices.memory", &slices) || !slices)
        slices = 8;
    if (c.obj->kind == OBJ_MIG) {
        /* as nvidia-smi -q "Shared BAR1 Memory": (BAR1 - framebuffer) / memory slices * the GI's slices */
        gip_t gip;
        obj_gip(&c, &gip);
        total = (unsigned long long)((double)(bar1 > mem ? bar1 - mem : 0) / (double)slices * gip.memory_slices);
        used = 0;
    } else {
        total = bar1;
        used = mig_enabled(&c.st, c.gpu) ? mem - reserved : 1;
        if (used > total)
            used = total;
    }
    bar1Memory->bar1Total = total * MiB;
    bar1Memory->bar1Used = used * MiB;
    bar1Memory->bar1Free = (total - used) * MiB;
    END(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* Persistence, compute mode, display                                                               */
/* ------------------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode)
{
    BEGIN(device, K_GPU, 0);
    if (!mode)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (gf_is(&c.st, c.gpu, "persistence.supported", "0"))
        END(NVML_ERROR_NOT_SUPPORTED);
    *mode = gf_is(&c.st, c.gpu, "persistence", "1");
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t device, unsigned int mode)
{
    int root = is_root();
    BEGIN(device, K_GPU, root);
    if (gf_is(&c.st, c.gpu, "persistence.supported", "0"))
        END(NVML_ERROR_NOT_SUPPORTED);
    if (!root)
        END(NVML_ERROR_NO_PERMISSION);
    if (mode > 1)
        END(NVML_ERROR_INVALID_ARGUMENT);
    gf_set(&c.st, c.gpu, "persistence", mode ? "1" : "0");
    END(NVML_SUCCESS);
}

/* nvmlComputeMode_t; empty or unknown: Default */
static unsigned compute_mode_value(const char *s)
{
    static const name_value_t modes[] = {
        {"Default", 0}, {"Exclusive_Thread", 1}, {"Prohibited", 2}, {"Exclusive_Process", 3},
    };
    return VALUE_BY_NAME(modes, s, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode)
{
    BEGIN(device, K_GPU, 0);
    if (!mode)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *mode = compute_mode_value(F("compute_mode"));
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, unsigned int mode)
{
    static const char *names[] = {"Default", NULL, "Prohibited", "Exclusive_Process"};
    int root = is_root();
    BEGIN(device, K_GPU, root);
    if (!root)
        END(NVML_ERROR_NO_PERMISSION);
    if (mode >= 4 || !names[mode])
        END(NVML_ERROR_INVALID_ARGUMENT);
    gf_set(&c.st, c.gpu, "compute_mode", names[mode]);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, unsigned int *isActive)
{
    BEGIN(device, K_GPU, 0);
    if (!isActive)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *isActive = gf_is(&c.st, c.gpu, "display.active", "1");
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, unsigned int *display)
{
    /* Every real capture (590/595/610 drivers) prints "Requested functionality has been deprecated". */
    BEGIN(device, K_GPU, 0);
    (void)display;
    END(NVML_ERROR_DEPRECATED);
}

/* ------------------------------------------------------------------------------------------------ */
/* Power                                                                                            */
/* ------------------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t device, unsigned int *mode)
{
    return uint_field_present(device, "power.limit_mw", mode);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return uint_field(device, "power.limit_mw", limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *defaultLimit)
{
    return uint_field(device, "power.default_mw", defaultLimit);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return uint_field(device, "power.limit_mw", limit);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    return uint_field(device, "power.draw_mw", power);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit,
                                                                  unsigned int *maxLimit)
{
    BEGIN(device, K_GPU, 0);
    if (!minLimit || !maxLimit)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!gf_uint(&c.st, c.gpu, "power.min_mw", minLimit) || !gf_uint(&c.st, c.gpu, "power.max_mw", maxLimit))
        END(NVML_ERROR_NOT_SUPPORTED);
    END(NVML_SUCCESS);
}

static nvmlReturn_t set_power_limit(nvmlDevice_t device, unsigned int limit)
{
    int root = is_root();
    BEGIN(device, K_GPU, root);
    unsigned lo, hi;
    if (!gf_uint(&c.st, c.gpu, "power.min_mw", &lo) || !gf_uint(&c.st, c.gpu, "power.max_mw", &hi))
        END(NVML_ERROR_NOT_SUPPORTED);
    if (!root)
        END(NVML_ERROR_NO_PERMISSION);
    if (limit < lo || limit > hi)
        END(NVML_ERROR_INVALID_ARGUMENT);
    char buf[32];
    snprintf(buf, sizeof buf, "%u", limit);
    gf_set(&c.st, c.gpu, "power.limit_mw", buf);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t device, unsigned int limit)
{
    return set_power_limit(device, limit);
}

EXPORT nvmlReturn_t nvmlDeviceSetPowerManagementLimit_v2(nvmlDevice_t device, nvmlPowerValue_v2_t *powerValue)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!powerValue)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (powerValue->version != nvmlPowerValue_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if ((powerValue->powerScope & 0xff) != 0) /* only NVML_POWER_SCOPE_GPU: no module/memory power limits */
        return NVML_ERROR_NOT_SUPPORTED;
    return set_power_limit(device, powerValue->powerValueMw);
}

/* ------------------------------------------------------------------------------------------------ */
/* Thermal, fan, performance, utilization                                                           */
/* ------------------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    BEGIN(device, K_GPU, 0);
    if (!temp || sensorType != 0) /* NVML_TEMPERATURE_GPU is the only sensor */
        END(NVML_ERROR_INVALID_ARGUMENT);
    END(gf_uint(&c.st, c.gpu, "temp.gpu", temp) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED);
}

/* nvmlDeviceGetFieldValues: the call returns SUCCESS and each value carries its own return code (nvml.h).
 * Modelled: NVML_FI_DEV_MEMORY_TEMP (82) from temp.memory (HBM GPUs; GDDR GPUs print "N/A" for the memory
 * temperature, so NOT_SUPPORTED); the NVLink error totals NVML_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_
 * ERROR_COUNT_TOTAL (38, 45, 52, 59: every link's counter summed, as DCGM's *_TOTAL fields read them; NOT_SUPPORTED
 * without NVLink); NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230) from recovery_action (absent: 0, none). Every other
 * field id answers NOT_SUPPORTED. */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType; /* nvmlValueType_t: 1 = unsigned int */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

#define NVML_FI_DEV_MEMORY_TEMP 82
#define NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL 38
#define NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL 45
#define NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL 52
#define NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL 59
#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230

/* nvmlNvLinkErrorCounter_t order: REPLAY, RECOVERY, CRC_FLIT, CRC_DATA (ECC_DATA is not modelled) */
static const char *const NVLINK_ERROR_KEYS[] = {"nvlink.errors.replay", "nvlink.errors.recovery",
                                                "nvlink.errors.crc_flit", "nvlink.errors.crc_data"};

/* The counter of one link (link >= 0) or of every link summed (link < 0): nvlink.errors.KIND holds one count
 * per link, comma-separated (absent: all 0). */
static unsigned long long nvlink_errors(state_t *st, unsigned gpu, unsigned counter, int link)
{
    unsigned long long total = 0;
    int i = 0;
    const char *list = gf(st, gpu, NVLINK_ERROR_KEYS[counter]);
    for (const char *p = list; p && *p; i++) {
        char *e;
        unsigned long long v = strtoull(p, &e, 10);
        if (e == p)
            break;
        if (link < 0 || i == link)
            total += v;
        p = *e == ',' ? e + 1 : e;
    }
    return total;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
    BEGIN(device, K_GPU, 0);
    if (valuesCount < 0 || (valuesCount > 0 && !values))
        END(NVML_ERROR_INVALID_ARGUMENT);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        unsigned t;
        v->timestamp = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
        v->latencyUsec = 0;
        memset(&v->value, 0, sizeof v->value);
        unsigned links = 0;
        int nvlink_counter = v->fieldId == NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL     ? 0
                             : v->fieldId == NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL ? 1
                             : v->fieldId == NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL ? 2
                             : v->fieldId == NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL ? 3
                                                                                           : -1;
        gf_uint(&c.st, c.gpu, "nvlink.count", &links);
        if (v->fieldId == NVML_FI_DEV_MEMORY_TEMP && gf_uint(&c.st, c.gpu, "temp.memory", &t)) {
            v->valueType = 1;
            v->value.uiVal = t;
            v->nvmlReturn = NVML_SUCCESS;
        } else if (nvlink_counter >= 0 && links) {
            v->valueType = 3; /* NVML_VALUE_TYPE_UNSIGNED_LONG_LONG */
            v->value.ullVal = nvlink_errors(&c.st, c.gpu, (unsigned)nvlink_counter, -1);
            v->nvmlReturn = NVML_SUCCESS;
        } else if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            v->valueType = 1;
            if (!gf_uint(&c.st, c.gpu, "recovery_action", &t))
                t = 0; /* NVML_GPU_RECOVERY_ACTION_NONE */
            v->value.uiVal = t;
            v->nvmlReturn = NVML_SUCCESS;
        } else {
            v->valueType = 1;
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    BEGIN(device, K_GPU, 0);
    if (!temperature)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (temperature->version != nvmlTemperature_v1)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (temperature->sensorType != 0)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned t;
    if (!gf_uint(&c.st, c.gpu, "temp.gpu", &t))
        END(NVML_ERROR_NOT_SUPPORTED);
    temperature->temperature = (int)t;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, unsigned int thresholdType,
                                                      unsigned int *temp)
{
    const char *field = NULL;
    switch (thresholdType) {
    case 0: field = "temp.shutdown"; break;     /* NVML_TEMPERATURE_THRESHOLD_SHUTDOWN */
    case 1: field = "temp.slowdown"; break;     /* SLOWDOWN */
    case 3: field = "temp.max_operating"; break; /* GPU_MAX */
    case 5: field = "temp.target"; break;       /* ACOUSTIC_CURR: "GPU Target Temperature" */
    default: break;
    }
    BEGIN(device, K_GPU, 0);
    if (!temp || thresholdType >= 8)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!field)
        END(NVML_ERROR_NOT_SUPPORTED);
    END(gf_uint(&c.st, c.gpu, field, temp) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    return uint_field(device, "fan", speed);
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed)
{
    BEGIN(device, K_GPU, 0);
    if (!speed)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!gf_uint(&c.st, c.gpu, "fan", speed))
        END(NVML_ERROR_NOT_SUPPORTED);
    END(fan == 0 ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT);
}

EXPORT nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *numFans)
{
    return uint_field_present(device, "fan", numFans);
}

static nvmlReturn_t pstate(nvmlDevice_t device, unsigned int *p)
{
    BEGIN(device, K_GPU, 0);
    if (!p)
        END(NVML_ERROR_INVALID_ARGUMENT);
    const char *s = F("pstate");
    unsigned v;
    if (!s || sscanf(s, "P%u", &v) != 1 || v > 15)
        *p = 32; /* NVML_PSTATE_UNKNOWN */
    else
        *p = v;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *pState)
{
    return pstate(device, pState);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, unsigned int *pState) { return pstate(device, pState); }

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    BEGIN(device, K_GPU, 0);
    if (!utilization)
        END(NVML_ERROR_INVALID_ARGUMENT);
    /* "On MIG-enabled GPUs, querying the utilization ... is not currently supported." */
    if (mig_enabled(&c.st, c.gpu))
        END(NVML_ERROR_NOT_SUPPORTED);
    if (!gf_uint(&c.st, c.gpu, "util.gpu", &utilization->gpu) ||
        !gf_uint(&c.st, c.gpu, "util.memory", &utilization->memory))
        END(NVML_ERROR_NOT_SUPPORTED);
    END(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* Clocks                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

static const char *clock_name(unsigned type)
{
    static const char *names[] = {"graphics", "sm", "mem", "video"};
    return type < 4 ? names[type] : NULL;
}

static nvmlReturn_t clock_field(nvmlDevice_t device, unsigned type, int max, unsigned int *clock)
{
    BEGIN(device, K_GPU, 0);
    if (!clock || !clock_name(type))
        END(NVML_ERROR_INVALID_ARGUMENT);
    char field[64];
    snprintf(field, sizeof field, max ? "clocks.max.%s" : "clocks.%s", clock_name(type));
    END(gf_uint(&c.st, c.gpu, field, clock) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    return clock_field(device, type, 0, clock);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    return clock_field(device, type, 1, clock);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t device, unsigned int type,
                                                       unsigned int *clockMHz)
{
    {
        /* GeForce prints "Max Customer Boost Clocks: N/A" */
        BEGIN(device, K_GPU, 0);
        int geforce = is_geforce(&c.st, c.gpu);
        end(&c, NVML_SUCCESS);
        if (geforce)
            return NVML_ERROR_NOT_SUPPORTED;
    }
    return clock_field(device, type, 1, clockMHz);
}

static nvmlReturn_t deprecated_clock(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    BEGIN(device, K_GPU, 0);
    if (!clock || !clock_name(type))
        END(NVML_ERROR_INVALID_ARGUMENT);
    END(NVML_ERROR_DEPRECATED); /* "Applications Clocks: Requested functionality has been deprecated" */
}

EXPORT nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    return deprecated_clock(device, type, clock);
}

EXPORT nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, unsigned int type,
                                                          unsigned int *clock)
{
    return deprecated_clock(device, type, clock);
}

EXPORT nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, unsigned int clockType, unsigned int clockId,
                                       unsigned int *clockMHz)
{
    switch (clockId) {
    case 0: return clock_field(device, clockType, 0, clockMHz);                        /* CURRENT */
    case 1: case 2: return deprecated_clock(device, clockType, clockMHz);              /* APP target/default */
    case 3: return nvmlDeviceGetMaxCustomerBoostClock(device, clockType, clockMHz);    /* CUSTOMER_BOOST_MAX */
    default: {
        BEGIN(device, K_GPU, 0);
        END(NVML_ERROR_INVALID_ARGUMENT);
    }
    }
}

#define CLOCKS_EVENT_REASONS_ALL 0x1FFull

static nvmlReturn_t event_reasons(nvmlDevice_t device, unsigned long long *reasons)
{
    BEGIN(device, K_GPU, 0);
    if (!reasons)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long v = 0;
    const char *s = F("clocks.event_reasons");
    if (s && *s && !parse_ull(s, 16, &v))
        END(NVML_ERROR_UNKNOWN);
    *reasons = v;
    END(NVML_SUCCESS);
}

static nvmlReturn_t supported_event_reasons(nvmlDevice_t device, unsigned long long *reasons)
{
    BEGIN(device, K_GPU, 0);
    if (!reasons)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = CLOCKS_EVENT_REASONS_ALL;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return event_reasons(device, reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return event_reasons(device, reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return supported_event_reasons(device, reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return supported_event_reasons(device, reasons);
}

static nvmlReturn_t set_locked_clocks(nvmlDevice_t device, unsigned lo, unsigned hi, int reset)
{
    int root = is_root();
    BEGIN(device, K_GPU, root);
    if (!root)
        END(NVML_ERROR_NO_PERMISSION);
    if (!reset && lo > hi)
        END(NVML_ERROR_INVALID_ARGUMENT);
    char a[32], b[32];
    snprintf(a, sizeof a, "%u", reset ? 0u : lo);
    snprintf(b, sizeof b, "%u", reset ? 0u : hi);
    gf_set(&c.st, c.gpu, "clocks.locked.min", a);
    gf_set(&c.st, c.gpu, "clocks.locked.max", b);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceSetGpuLockedClocks(nvmlDevice_t device, unsigned int minGpuClockMHz,
                                                 unsigned int maxGpuClockMHz)
{
    return set_locked_clocks(device, minGpuClockMHz, maxGpuClockMHz, 0);
}

EXPORT nvmlReturn_t nvmlDeviceResetGpuLockedClocks(nvmlDevice_t device) { return set_locked_clocks(device, 0, 0, 1); }

/* ------------------------------------------------------------------------------------------------ */
/* ECC, retired pages, row remapping                                                                */
/* ------------------------------------------------------------------------------------------------ */

#define ECC_SUPPORTED(c) gf_is(&(c).st, (c).gpu, "ecc.supported", "1")

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    return mode_pair(device, "ecc", current, pending);
}

EXPORT nvmlReturn_t nvmlDeviceGetDefaultEccMode(nvmlDevice_t device, unsigned int *defaultMode)
{
    BEGIN(device, K_GPU, 0);
    if (!defaultMode)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!ECC_SUPPORTED(c))
        END(NVML_ERROR_NOT_SUPPORTED);
    *defaultMode = 1;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceSetEccMode(nvmlDevice_t device, unsigned int ecc)
{
    int root = is_root();
    BEGIN(device, K_GPU, root);
    if (!ECC_SUPPORTED(c))
        END(NVML_ERROR_NOT_SUPPORTED);
    if (!root)
        END(NVML_ERROR_NO_PERMISSION);
    if (ecc > 1)
        END(NVML_ERROR_INVALID_ARGUMENT);
    gf_set(&c.st, c.gpu, "ecc.pending", ecc ? "1" : "0"); /* takes effect at the next reboot */
    END(NVML_SUCCESS);
}

static nvmlReturn_t ecc_count(ctx_t *c, unsigned errorType, unsigned counterType, unsigned long long *out)
{
    if (!out || errorType > 1 || counterType > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!ECC_SUPPORTED(*c))
        return NVML_ERROR_NOT_SUPPORTED;
    char field[64];
    snprintf(field, sizeof field, "ecc.%s.%s", counterType ? "aggregate" : "volatile",
             errorType ? "uncorrected" : "corrected");
    unsigned long long v = 0;
    gf_ull(&c->st, c->gpu, field, &v);
    *out = v;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType,
                                                unsigned int counterType, unsigned long long *eccCounts)
{
    BEGIN(device, K_GPU, 0);
    END(ecc_count(&c, errorType, counterType, eccCounts));
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, unsigned int errorType,
                                                    unsigned int counterType, unsigned int locationType,
                                                    unsigned long long *count)
{
    BEGIN(device, K_GPU, 0);
    if (locationType >= 8) /* NVML_MEMORY_LOCATION_COUNT */
        END(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t r = ecc_count(&c, errorType, counterType, count);
    if (r == NVML_SUCCESS && locationType != 2) /* all simulated errors are in device memory (DRAM) */
        *count = 0;
    END(r);
}

/* Page retirement: pre-Ampere ECC GPUs only (Ampere+ use row remapping; nvidia-smi shows N/A). */
static int page_retirement_supported(ctx_t *c)
{
    const char *a = gf(&c->st, c->gpu, "architecture");
    static const char *old[] = {"Kepler", "Maxwell", "Pascal", "Volta", "Turing"};
    if (!ECC_SUPPORTED(*c) || !a)
        return 0;
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        if (strcasecmp(a, old[i]) == 0)
            return 1;
    return 0;
}

static nvmlReturn_t retired_pages(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount)
{
    BEGIN(device, K_GPU, 0);
    if (!pageCount || cause > 1)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!page_retirement_supported(&c))
        END(NVML_ERROR_NOT_SUPPORTED);
    *pageCount = 0;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                                              unsigned long long *addresses)
{
    (void)addresses;
    return retired_pages(device, cause, pageCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                                                 unsigned long long *addresses, unsigned long long *timestamps)
{
    (void)addresses;
    (void)timestamps;
    return retired_pages(device, cause, pageCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending)
{
    BEGIN(device, K_GPU, 0);
    if (!isPending)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!page_retirement_supported(&c))
        END(NVML_ERROR_NOT_SUPPORTED);
    *isPending = 0;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                              unsigned int *isPending, unsigned int *failureOccurred)
{
    BEGIN(device, K_GPU, 0);
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!gf_is(&c.st, c.gpu, "remap.supported", "1"))
        END(NVML_ERROR_NOT_SUPPORTED);
    *corrRows = *uncRows = *isPending = *failureOccurred = 0;
    gf_uint(&c.st, c.gpu, "remap.correctable", corrRows);
    gf_uint(&c.st, c.gpu, "remap.uncorrectable", uncRows);
    gf_uint(&c.st, c.gpu, "remap.pending", isPending);
    gf_uint(&c.st, c.gpu, "remap.failure", failureOccurred);
    END(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* PCIe, NVLink                                                                                     */
/* ------------------------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen)
{
    return uint_field(device, "pcie.gen_current", currLinkGen);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen)
{
    /* the link's max: the GPU's, capped by the host port's when known (pcie.gen_hostmax) */
    BEGIN(device, K_GPU, 0);
    unsigned host;
    if (!maxLinkGen)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!gf_uint(&c.st, c.gpu, "pcie.gen_max", maxLinkGen))
        END(NVML_ERROR_NOT_SUPPORTED);
    if (gf_uint(&c.st, c.gpu, "pcie.gen_hostmax", &host) && host < *maxLinkGen)
        *maxLinkGen = host;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGenDevice)
{
    return uint_field(device, "pcie.gen_max", maxLinkGenDevice);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
    return uint_field(device, "pcie.width_current", currLinkWidth);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    return uint_field(device, "pcie.width_max", maxLinkWidth);
}

static nvmlReturn_t nvlink_check(ctx_t *c, unsigned link)
{
    unsigned count = 0;
    gf_uint(&c->st, c->gpu, "nvlink.count", &count);
    if (!count)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= count || link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *isActive)
{
    BEGIN(device, K_GPU, 0);
    if (!isActive)
        END(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t r = nvlink_check(&c, link);
    if (r)
        END(r);
    int down = 0;
    const char *list = F("nvlink.down");
    for (const char *p = list; p && *p;) {
        char *e;
        unsigned long v = strtoul(p, &e, 10);
        if (e == p)
            break;
        if (v == link)
            down = 1;
        p = *e == ',' ? e + 1 : e;
    }
    *isActive = !down;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, unsigned int counter,
                                                    unsigned long long *counterValue)
{
    BEGIN(device, K_GPU, 0);
    if (!counterValue)
        END(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t r = nvlink_check(&c, link);
    if (r)
        END(r);
    if (counter > 4)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (counter == 4) /* NVML_NVLINK_ERROR_DL_ECC_DATA: not modelled */
        END(NVML_ERROR_NOT_SUPPORTED);
    *counterValue = nvlink_errors(&c.st, c.gpu, counter, (int)link);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    BEGIN(device, K_GPU, 0);
    if (!version)
        END(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t r = nvlink_check(&c, link);
    if (r)
        END(r);
    /* nvmlNvlinkVersion_t: 2_0=2 (Volta), 3_0=4 (Ampere), 4_0=6 (Hopper), 5_0=7 (Blackwell) */
    static const name_value_t versions[] = {{"Volta", 2}, {"Ampere", 4}, {"Hopper", 6}, {"Blackwell", 7}};
    *version = VALUE_BY_NAME(versions, F("architecture"), 0);
    END(*version ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED);
}

/* ------------------------------------------------------------------------------------------------ */
/* NVLink fabric (NVSwitch boards: fabric.state, set by the simulated nv-fabricmanager)             */
/* ------------------------------------------------------------------------------------------------ */

#define nvmlGpuFabricInfo_v2 0x02000024u
#define nvmlGpuFabricInfo_v3 0x03000028u

typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state, pad[3];
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state, pad[3];
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfoV_t;

/* NVML_GPU_FABRIC_STATE_*: 1 not started, 2 in progress, 3 completed; 0 = no fabric (NOT_SUPPORTED) */
static unsigned fabric_state(state_t *st, nvmlReturn_t *status)
{
    const char *f = st_get(st, "fabric.state");
    unsigned v = 0;
    if (f && strcmp(f, "not_started") == 0)
        v = 1;
    else if (f && strcmp(f, "in_progress") == 0)
        v = 2;
    else if (f && strcmp(f, "completed") == 0)
        v = 3;
    *status = v == 3 ? NVML_SUCCESS : NVML_ERROR_NOT_READY; /* the status is only meaningful once completed */
    return v;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo)
{
    BEGIN(device, K_GPU, 0);
    if (!gpuFabricInfo)
        END(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t status;
    unsigned state = fabric_state(&c.st, &status);
    if (!state)
        END(NVML_ERROR_NOT_SUPPORTED);
    memset(gpuFabricInfo, 0, sizeof *gpuFabricInfo);
    gpuFabricInfo->status = status;
    gpuFabricInfo->state = (unsigned char)state;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo)
{
    BEGIN(device, K_GPU, 0);
    if (!gpuFabricInfo)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    nvmlReturn_t status;
    unsigned state = fabric_state(&c.st, &status);
    if (!state)
        END(NVML_ERROR_NOT_SUPPORTED);
    memset(gpuFabricInfo, 0, version == nvmlGpuFabricInfo_v3 ? 40 : 36);
    gpuFabricInfo->version = version;
    gpuFabricInfo->status = status;
    gpuFabricInfo->state = (unsigned char)state;
    END(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* Processes                                                                                        */
/* ------------------------------------------------------------------------------------------------ */

/* ver 1: nvmlProcessInfo_v1_t, else nvmlProcessInfo_t. kind: 'C' compute, 'G' graphics, 'M' MPS (none). */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, int ver, char kind)
{
    const unsigned long long MiB = 1024ull * 1024ull;
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!infoCount)
        END(NVML_ERROR_INVALID_ARGUMENT);
    proc_t procs[MAX_PROCS];
    unsigned total = procs_of(&c.st, c.gpu, procs, MAX_PROCS), n = 0, cap = *infoCount;
    if (total > MAX_PROCS)
        total = MAX_PROCS;
    for (unsigned i = 0; i < total; i++) {
        proc_t *p = &procs[i];
        if (kind == 'M' || (kind == 'C' && !p->compute) || (kind == 'G' && !p->graphics))
            continue;
        /* a MIG device handle lists the processes of its own GPU/compute instance */
        if (c.obj->kind == OBJ_MIG &&
            (p->gi != c.obj->gi || (p->ci != NVML_VALUE_NOT_AVAILABLE_UINT && p->ci != c.obj->ci)))
            continue;
        if (infos && n < cap) {
            if (ver == 1) {
                nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + n;
                o->pid = p->pid;
                o->usedGpuMemory = p->used_mib * MiB;
            } else {
                nvmlProcessInfo_t *o = (nvmlProcessInfo_t *)infos + n;
                o->pid = p->pid;
                o->usedGpuMemory = p->used_mib * MiB;
                o->gpuInstanceId = p->gi;
                o->computeInstanceId = p->ci;
            }
        }
        n++;
    }
    *infoCount = n;
    if (n > 0 && (!infos || n > cap))
        END(NVML_ERROR_INSUFFICIENT_SIZE);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, 3, 'C');
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, 2, 'C');
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, infoCount, infos, 1, 'C');
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, 3, 'G');
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, 2, 'G');
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                          nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, infoCount, infos, 1, 'G');
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                               nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, 3, 'M');
}

/* ------------------------------------------------------------------------------------------------ */
/* MIG                                                                                              */
/* ------------------------------------------------------------------------------------------------ */

#define MIG_SUPPORTED(c) gf_is(&(c).st, (c).gpu, "mig.supported", "1")
#define MIG_ON(c) (MIG_SUPPORTED(c) && mig_enabled(&(c).st, (c).gpu))

/* GPU instance profile `profile_id` of a GPU in MIG mode: NOT_SUPPORTED when MIG is not on, INVALID_ARGUMENT
 * when the GPU has no such profile. */
static nvmlReturn_t mig_gip(ctx_t *c, unsigned profile_id, gip_t *g)
{
    if (!MIG_ON(*c))
        return NVML_ERROR_NOT_SUPPORTED;
    return gip_by_id(&c->st, c->gpu, profile_id, g) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    return mode_pair(device, "mig", currentMode, pendingMode);
}

/* MIG mode change (same rules as the simulated nvidia-smi -mig):
 *  - disabling while GPU instances exist: NVML_ERROR_IN_USE;
 *  - another live process holds the GPU (client.* / proc.*, not the caller): on Ampere the mode is stored as
 *    pending (applies at reset/reboot) and activationStatus = NVML_ERROR_IN_USE; on Hopper and later the
 *    call fails with NVML_ERROR_IN_USE and nothing changes;
 *  - otherwise current = pending = mode at once (activationStatus = NVML_SUCCESS). */
EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode, nvmlReturn_t *activationStatus)
{
    int root = is_root();
    BEGIN(device, K_GPU, root);
    if (!activationStatus || mode > 1)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!root)
        END(NVML_ERROR_NO_PERMISSION);
    if (!MIG_SUPPORTED(c))
        END(NVML_ERROR_NOT_SUPPORTED);
    const char *m = mode ? "1" : "0";
    if (gf_is(&c.st, c.gpu, "mig.current", m) && gf_is(&c.st, c.gpu, "mig.pending", m)) {
        *activationStatus = NVML_SUCCESS;
        END(NVML_SUCCESS);
    }
    if (!mode) {
        char prefix[64];
        int n = snprintf(prefix, sizeof prefix, "gpu.%u.mig.gi.", c.gpu);
        for (int i = 0; i < c.st.n; i++)
            if (strncmp(c.st.kv[i].key, prefix, (size_t)n) == 0)
                END(NVML_ERROR_IN_USE);
    }
    if (live_holders(&c.st, c.gpu, (long)getpid()) > 0) {
        const char *arch = F("architecture");
        if (!arch || strcasecmp(arch, "Ampere") != 0)
            END(NVML_ERROR_IN_USE);
        gf_set(&c.st, c.gpu, "mig.pending", m);
        *activationStatus = NVML_ERROR_IN_USE;
        END(NVML_SUCCESS);
    }
    gf_set(&c.st, c.gpu, "mig.current", m);
    gf_set(&c.st, c.gpu, "mig.pending", m);
    *activationStatus = NVML_SUCCESS;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    BEGIN(device, K_GPU, 0);
    if (!count)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!MIG_SUPPORTED(c)) {
        *count = 0;
        END(NVML_SUCCESS);
    }
    if (!gf_uint(&c.st, c.gpu, "mig.slices.compute", count))
        *count = 7;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice)
{
    BEGIN(device, K_GPU, 0);
    if (!migDevice)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!MIG_SUPPORTED(c))
        END(NVML_ERROR_NOT_SUPPORTED);
    if (!mig_enabled(&c.st, c.gpu))
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned char present[MAX_GI][MAX_CI];
    ci_map(&c.st, c.gpu, present);
    unsigned k = 0;
    for (unsigned gi = 0; gi < MAX_GI; gi++) {
        gi_t g;
        if (!gi_get(&c.st, c.gpu, gi, &g))
            continue;
        for (unsigned ci = 0; ci < MAX_CI; ci++) {
            if (!present[gi][ci])
                continue;
            if (k++ == index) {
                *migDevice = &g_mig[c.gpu][gi][ci];
                END(NVML_SUCCESS);
            }
        }
    }
    END(NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    const nvml_obj_t *o = obj_of(device, K_GPU | K_MIG);
    if (!o || !isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = o->kind == OBJ_MIG;
    return NVML_SUCCESS;
}

/* The GPU instance id (compute = 0) or compute instance id (compute = 1) of a MIG device. */
static nvmlReturn_t mig_instance_id(nvmlDevice_t device, int compute, unsigned int *id)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!id)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (c.obj->kind != OBJ_MIG)
        END(NVML_ERROR_NOT_SUPPORTED);
    *id = compute ? c.obj->ci : c.obj->gi;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return mig_instance_id(device, 0, id);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return mig_instance_id(device, 1, id);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    BEGIN(migDevice, K_GPU | K_MIG, 0);
    if (!device || c.obj->kind != OBJ_MIG)
        END(NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_gpu[c.gpu];
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    BEGIN(device, K_GPU | K_MIG, 0);
    if (!attributes)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (c.obj->kind != OBJ_MIG)
        END(NVML_ERROR_NOT_SUPPORTED); /* the SM count of a whole GPU is not in the state */
    gip_t gip;
    obj_gip(&c, &gip);
    unsigned slices = ci_slices(&c.st, c.gpu, c.obj->gi, c.obj->ci, &gip);
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = ci_sm(&c.st, c.gpu, &gip, slices);
    attributes->sharedCopyEngineCount = gip.ce;
    attributes->sharedDecoderCount = gip.dec;
    attributes->sharedEncoderCount = gip.enc;
    attributes->sharedJpegCount = gip.jpeg;
    attributes->sharedOfaCount = gip.ofa;
    attributes->gpuInstanceSliceCount = gip.compute_slices;
    attributes->computeInstanceSliceCount = slices;
    attributes->memorySizeMB = gip.memory_mib;
    END(NVML_SUCCESS);
}

static void fill_gip_v1(nvmlGpuInstanceProfileInfo_t *info, const gip_t *g)
{
    info->id = g->profile_id;
    info->isP2pSupported = g->p2p;
    info->sliceCount = g->compute_slices;
    info->instanceCount = g->max_instances;
    info->multiprocessorCount = g->sm;
    info->copyEngineCount = g->ce;
    info->decoderCount = g->dec;
    info->encoderCount = g->enc;
    info->jpegCount = g->jpeg;
    info->ofaCount = g->ofa;
    info->memorySizeMB = g->memory_mib;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                        nvmlGpuInstanceProfileInfo_t *info)
{
    BEGIN(device, K_GPU, 0);
    if (!info)
        END(NVML_ERROR_INVALID_ARGUMENT);
    gip_t g;
    if (!MIG_SUPPORTED(c) || !gip_by_enum(&c.st, c.gpu, profile, &g))
        END(NVML_ERROR_NOT_SUPPORTED);
    fill_gip_v1(info, &g);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                         nvmlGpuInstanceProfileInfo_v2_t *info)
{
    BEGIN(device, K_GPU, 0);
    if (!info)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    gip_t g;
    if (!MIG_SUPPORTED(c) || !gip_by_enum(&c.st, c.gpu, profile, &g))
        END(NVML_ERROR_NOT_SUPPORTED);
    nvmlGpuInstanceProfileInfo_t v1;
    fill_gip_v1(&v1, &g);
    info->id = v1.id;
    info->isP2pSupported = v1.isP2pSupported;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->copyEngineCount = v1.copyEngineCount;
    info->decoderCount = v1.decoderCount;
    info->encoderCount = v1.encoderCount;
    info->jpegCount = v1.jpegCount;
    info->ofaCount = v1.ofaCount;
    info->memorySizeMB = v1.memorySizeMB;
    snprintf(info->name, sizeof info->name, "MIG %s", g.name);
    END(NVML_SUCCESS);
}

/* Parse "start:size;start:size" placements. Returns the count (up to max written). */
static unsigned parse_placements(const char *s, nvmlGpuInstancePlacement_t *out, unsigned max)
{
    unsigned n = 0;
    while (s && *s) {
        unsigned start, size;
        if (sscanf(s, "%u:%u", &start, &size) == 2) {
            if (out && n < max)
                out[n] = (nvmlGpuInstancePlacement_t){start, size};
            n++;
        }
        s = strchr(s, ';');
        if (s)
            s++;
    }
    return n;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                                  nvmlGpuInstancePlacement_t *placements,
                                                                  unsigned int *count)
{
    BEGIN(device, K_GPU, 0);
    if (!count)
        END(NVML_ERROR_INVALID_ARGUMENT);
    gip_t g;
    nvmlReturn_t r = mig_gip(&c, profileId, &g);
    if (r)
        END(r);
    unsigned n = parse_placements(g.placements, NULL, 0);
    if (placements) {
        if (*count < n) {
            *count = n;
            END(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        parse_placements(g.placements, placements, n);
    }
    *count = n;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device, unsigned int profileId,
                                                              unsigned int *count)
{
    BEGIN(device, K_GPU, 0);
    if (!count)
        END(NVML_ERROR_INVALID_ARGUMENT);
    gip_t g;
    nvmlReturn_t r = mig_gip(&c, profileId, &g);
    if (r)
        END(r);
    /* memory slices taken by existing GIs; compute slices left; then greedy over the placements */
    unsigned used_mask = 0, used_compute = 0, same = 0, total_compute = 7;
    gf_uint(&c.st, c.gpu, "mig.slices.compute", &total_compute);
    for (unsigned id = 0; id < MAX_GI; id++) {
        gi_t gi;
        gip_t p;
        if (!gi_get(&c.st, c.gpu, id, &gi))
            continue;
        for (unsigned s = gi.start; s < gi.start + gi.size && s < 32; s++)
            used_mask |= 1u << s;
        if (gip_by_id(&c.st, c.gpu, gi.profile_id, &p))
            used_compute += p.compute_slices;
        if (gi.profile_id == profileId)
            same++;
    }
    nvmlGpuInstancePlacement_t pl[32];
    unsigned n = parse_placements(g.placements, pl, 32), fit = 0;
    if (n > 32)
        n = 32;
    for (unsigned i = 0; i < n; i++) {
        unsigned mask = 0;
        for (unsigned s = pl[i].start; s < pl[i].start + pl[i].size && s < 32; s++)
            mask |= 1u << s;
        if (!(mask & used_mask)) {
            used_mask |= mask;
            fit++;
        }
    }
    unsigned by_compute = g.compute_slices && total_compute > used_compute
                              ? (total_compute - used_compute) / g.compute_slices
                              : 0;
    unsigned by_count = g.max_instances > same ? g.max_instances - same : 0;
    *count = fit < by_compute ? fit : by_compute;
    if (by_count < *count)
        *count = by_count;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                              nvmlGpuInstance_t *gpuInstances, unsigned int *count)
{
    BEGIN(device, K_GPU, 0);
    if (!count)
        END(NVML_ERROR_INVALID_ARGUMENT);
    gip_t g;
    nvmlReturn_t r = mig_gip(&c, profileId, &g);
    if (r)
        END(r);
    unsigned n = 0;
    for (unsigned id = 0; id < MAX_GI; id++) {
        gi_t gi;
        if (gi_get(&c.st, c.gpu, id, &gi) && gi.profile_id == profileId) {
            if (gpuInstances)
                gpuInstances[n] = &g_gi[c.gpu][id];
            n++;
        }
    }
    *count = n;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                 nvmlGpuInstance_t *gpuInstance)
{
    BEGIN(device, K_GPU, 0);
    if (!gpuInstance)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (!MIG_ON(c))
        END(NVML_ERROR_NOT_SUPPORTED);
    gi_t gi;
    if (id >= MAX_GI || !gi_get(&c.st, c.gpu, id, &gi))
        END(NVML_ERROR_NOT_FOUND);
    *gpuInstance = &g_gi[c.gpu][id];
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info)
{
    BEGIN(gpuInstance, K_GI, 0);
    if (!info)
        END(NVML_ERROR_INVALID_ARGUMENT);
    gi_t gi;
    gi_get(&c.st, c.gpu, c.obj->gi, &gi);
    info->device = &g_gpu[c.gpu];
    info->id = c.obj->gi;
    info->profileId = gi.profile_id;
    info->placement.start = gi.start;
    info->placement.size = gi.size;
    END(NVML_SUCCESS);
}

/* CI profile enum -> info for the GI; returns 0 when the profile does not exist for this GI. */
static int ci_profile(ctx_t *c, unsigned profile, nvmlComputeInstanceProfileInfo_t *info, char *name, size_t nlen)
{
    gip_t g;
    if (!obj_gip(c, &g))
        return 0;
    unsigned slices = ci_profile_slices(profile);
    if (!ci_profile_allowed(slices, g.compute_slices))
        return 0;
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = g.compute_slices / slices;
    info->multiprocessorCount = ci_sm(&c->st, c->gpu, &g, slices);
    info->sharedCopyEngineCount = g.ce;
    info->sharedDecoderCount = g.dec;
    info->sharedEncoderCount = g.enc;
    info->sharedJpegCount = g.jpeg;
    info->sharedOfaCount = g.ofa;
    if (name) {
        char cn[64];
        ci_name(cn, sizeof cn, slices, &g);
        snprintf(name, nlen, "MIG %s", cn);
    }
    return 1;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t gpuInstance, unsigned int profile,
                                                                 unsigned int engProfile,
                                                                 nvmlComputeInstanceProfileInfo_t *info)
{
    BEGIN(gpuInstance, K_GI, 0);
    if (!info || engProfile != 0)
        END(NVML_ERROR_INVALID_ARGUMENT);
    END(ci_profile(&c, profile, info, NULL, 0) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t gpuInstance,
                                                                  unsigned int profile, unsigned int engProfile,
                                                                  nvmlComputeInstanceProfileInfo_v2_t *info)
{
    BEGIN(gpuInstance, K_GI, 0);
    if (!info || engProfile != 0)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != nvmlComputeInstanceProfileInfo_v2)
        END(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    nvmlComputeInstanceProfileInfo_t v1;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    if (!ci_profile(&c, profile, &v1, name, sizeof name))
        END(NVML_ERROR_NOT_SUPPORTED);
    info->id = v1.id;
    info->sliceCount = v1.sliceCount;
    info->instanceCount = v1.instanceCount;
    info->multiprocessorCount = v1.multiprocessorCount;
    info->sharedCopyEngineCount = v1.sharedCopyEngineCount;
    info->sharedDecoderCount = v1.sharedDecoderCount;
    info->sharedEncoderCount = v1.sharedEncoderCount;
    info->sharedJpegCount = v1.sharedJpegCount;
    info->sharedOfaCount = v1.sharedOfaCount;
    memcpy(info->name, name, sizeof info->name);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t gpuInstance,
                                                                       unsigned int profileId, unsigned int *count)
{
    BEGIN(gpuInstance, K_GI, 0);
    if (!count)
        END(NVML_ERROR_INVALID_ARGUMENT);
    nvmlComputeInstanceProfileInfo_t info;
    if (!ci_profile(&c, profileId, &info, NULL, 0))
        END(NVML_ERROR_NOT_SUPPORTED);
    unsigned used = 0, gi_slices = info.instanceCount * info.sliceCount;
    for (unsigned ci = 0; ci < MAX_CI; ci++)
        if (ci_get(&c.st, c.gpu, c.obj->gi, ci))
            used += ci_slices(&c.st, c.gpu, c.obj->gi, ci, NULL);
    *count = used >= gi_slices ? 0 : (gi_slices - used) / info.sliceCount;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance, unsigned int profileId,
                                                       nvmlComputeInstance_t *computeInstances, unsigned int *count)
{
    BEGIN(gpuInstance, K_GI, 0);
    if (!count)
        END(NVML_ERROR_INVALID_ARGUMENT);
    nvmlComputeInstanceProfileInfo_t info;
    if (!ci_profile(&c, profileId, &info, NULL, 0))
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned n = 0;
    for (unsigned ci = 0; ci < MAX_CI; ci++) {
        const char *v = ci_get(&c.st, c.gpu, c.obj->gi, ci);
        if (v && csv_uint(v, 0) == profileId) {
            if (computeInstances)
                computeInstances[n] = &g_ci[c.gpu][c.obj->gi][ci];
            n++;
        }
    }
    *count = n;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance, unsigned int id,
                                                          nvmlComputeInstance_t *computeInstance)
{
    BEGIN(gpuInstance, K_GI, 0);
    if (!computeInstance)
        END(NVML_ERROR_INVALID_ARGUMENT);
    if (id >= MAX_CI || !ci_get(&c.st, c.gpu, c.obj->gi, id))
        END(NVML_ERROR_NOT_FOUND);
    *computeInstance = &g_ci[c.gpu][c.obj->gi][id];
    END(NVML_SUCCESS);
}

static void ci_info(ctx_t *c, nvmlComputeInstanceInfo_t *info)
{
    const char *v = ci_get(&c->st, c->gpu, c->obj->gi, c->obj->ci);
    info->device = &g_gpu[c->gpu];
    info->gpuInstance = &g_gi[c->gpu][c->obj->gi];
    info->id = c->obj->ci;
    info->profileId = csv_uint(v, 0);
    info->placement.start = ci_start(&c->st, c->gpu, c->obj->gi, c->obj->ci);
    gip_t gip;
    obj_gip(c, &gip);
    info->placement.size = ci_slices(&c->st, c->gpu, c->obj->gi, c->obj->ci, &gip);
    (void)v;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                  nvmlComputeInstanceInfo_t *info)
{
    BEGIN(computeInstance, K_CI, 0);
    if (!info)
        END(NVML_ERROR_INVALID_ARGUMENT);
    ci_info(&c, info);
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                               nvmlComputeInstanceInfo_v1_t *info)
{
    BEGIN(computeInstance, K_CI, 0);
    if (!info)
        END(NVML_ERROR_INVALID_ARGUMENT);
    nvmlComputeInstanceInfo_t full;
    ci_info(&c, &full);
    info->device = full.device;
    info->gpuInstance = full.gpuInstance;
    info->id = full.id;
    info->profileId = full.profileId;
    END(NVML_SUCCESS);
}

/* ------------------------------------------------------------------------------------------------ */
/* Events (nvmlEventSet*, nvmlDeviceRegisterEvents): Xid critical errors                             */
/* ------------------------------------------------------------------------------------------------ */
/* The "hardware" raises an Xid by appending its code to `gpu.<i>.xid.log` (comma separated, oldest first;
 * `gpufleet sim fault HOST xid`). A set delivers, per registered GPU, the codes appended after its
 * registration, one per nvmlEventSetWait call, as the driver's event queue does. A GPU whose
 * `events.supported` is `0` (a platform without events, e.g. WSL) answers NOT_SUPPORTED. */

#define NVML_EVENT_SBE 0x1ull
#define NVML_EVENT_DBE 0x2ull
#define NVML_EVENT_PSTATE 0x4ull
#define NVML_EVENT_XID 0x8ull
#define NVML_EVENT_CLOCK 0x10ull
#define EVENT_SET_MAGIC 0x45565453u /* "EVTS" */
#define EVENT_POLL_NS 50000000L

typedef struct {
    unsigned int magic;
    unsigned long long types[MAX_GPUS];
    unsigned int seen[MAX_GPUS]; /* codes of gpu.<i>.xid.log already delivered (or older than the registration) */
} event_set_t;
typedef event_set_t *nvmlEventSet_t;

/* nvmlEventData_t (nvml.h / pynvml c_nvmlEventData_t) */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

static unsigned long long supported_events(state_t *st, unsigned gpu)
{
    if (gf_is(st, gpu, "events.supported", "0"))
        return 0;
    unsigned long long types = NVML_EVENT_PSTATE | NVML_EVENT_XID | NVML_EVENT_CLOCK;
    if (gf_is(st, gpu, "ecc.supported", "1") && gf_is(st, gpu, "ecc.current", "1"))
        types |= NVML_EVENT_SBE | NVML_EVENT_DBE;
    return types;
}

/* Number of codes in gpu.<i>.xid.log; *code = the n-th (0-based) when n < count. */
static unsigned xid_log(state_t *st, unsigned gpu, unsigned n, unsigned long long *code)
{
    const char *log = gf(st, gpu, "xid.log");
    unsigned count = 0;
    if (!log || !*log)
        return 0;
    for (const char *p = log; p;) {
        if (count == n && code)
            *code = strtoull(p, NULL, 10);
        count++;
        p = strchr(p, ',');
        if (p)
            p++;
    }
    return count;
}

static event_set_t *event_set_of(nvmlEventSet_t set)
{
    return set && set->magic == EVENT_SET_MAGIC ? set : NULL;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    event_set_t *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_MEMORY;
    s->magic = EVENT_SET_MAGIC;
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    event_set_t *s = event_set_of(set);
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!s)
        return NVML_ERROR_INVALID_ARGUMENT;
    s->magic = 0;
    free(s);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    BEGIN(device, K_GPU, 0);
    if (!eventTypes)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long types = supported_events(&c.st, c.gpu);
    if (!types)
        END(NVML_ERROR_NOT_SUPPORTED);
    *eventTypes = types;
    END(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    BEGIN(device, K_GPU, 0);
    event_set_t *s = event_set_of(set);
    if (!s)
        END(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long supported = supported_events(&c.st, c.gpu);
    if (!supported || (eventTypes & ~supported))
        END(NVML_ERROR_NOT_SUPPORTED);
    lock();
    s->types[c.gpu] |= eventTypes;
    s->seen[c.gpu] = xid_log(&c.st, c.gpu, 0, NULL);
    unlock();
    END(NVML_SUCCESS);
}

/* One pass over the registered GPUs: the next undelivered Xid, 1 when one was found. */
static int next_xid(event_set_t *s, nvmlEventData_t *data)
{
    state_t st;
    int found = 0;
    if (st_open(&st, 0) < 0)
        return 0;
    unsigned n = gpu_count(&st);
    lock();
    for (unsigned gpu = 0; gpu < n && gpu < MAX_GPUS && !found; gpu++) {
        if (!(s->types[gpu] & NVML_EVENT_XID))
            continue;
        unsigned long long code = 0;
        unsigned count = xid_log(&st, gpu, s->seen[gpu], &code);
        if (count < s->seen[gpu]) /* the log was cleared (GPU reset / repaired): start over */
            s->seen[gpu] = count;
        if (count > s->seen[gpu]) {
            s->seen[gpu]++;
            memset(data, 0, sizeof *data);
            data->device = &g_gpu[gpu];
            data->eventType = NVML_EVENT_XID;
            data->eventData = code;
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu; /* not attributed to a MIG instance */
            found = 1;
        }
    }
    unlock();
    st_close(&st);
    return found;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    event_set_t *s = event_set_of(set);
    if (!s || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec start, now, pause = {0, EVENT_POLL_NS};
    struct stat seen_stat = {0}, st;
    int first = 1;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        /* the state file is read again only when it changed (a waiting exporter costs a stat per poll) */
        int changed = stat(state_path(), &st) == 0 &&
                      (first || st.st_mtim.tv_sec != seen_stat.st_mtim.tv_sec ||
                       st.st_mtim.tv_nsec != seen_stat.st_mtim.tv_nsec || st.st_size != seen_stat.st_size);
        if (changed) {
            seen_stat = st;
            first = 0;
            if (next_xid(s, data))
                return NVML_SUCCESS;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long elapsed_ms = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (elapsed_ms >= (long long)timeoutms)
            return NVML_ERROR_TIMEOUT;
        nanosleep(&pause, NULL);
    }
}
