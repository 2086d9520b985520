/*
 * A fake libnvidia-ml.so.1 for tests: the entry points the exporter's NVML layer calls,
 * with the real NVML struct layouts, so the real pynvml binding (nvidia-ml-py) runs
 * against it on a machine without a GPU.
 *
 * Build: gcc -shared -fPIC -O2 -Wall -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_nvml.c -lpthread
 * Load:  LD_LIBRARY_PATH=<dir> before the process starts (the loader reads it once).
 *
 * Configuration (environment, read at nvmlInitWithFlags):
 *   FAKE_NVML_GPU_COUNT=8          GPUs (max 64)
 *   FAKE_NVML_LINK_COUNT=18        NVLinks per GPU (max 36); 0 = a PCIe card without NVLink
 *   FAKE_NVML_DOWN_LINKS=g:l,...   links that are INACTIVE (speed 0, no remote end)
 *   FAKE_NVML_UNSUPPORTED=f[:g[:l]],...  field ids answered NOT_SUPPORTED (for every GPU,
 *                                  one GPU, or one GPU's link)
 *   FAKE_NVML_LOST_GPU=g:n         GPU g answers GPU_IS_LOST to every call after its n-th
 *                                  nvmlDeviceGetFieldValues call
 *   FAKE_NVML_REMOTE=switch|gpu    what the links connect to (default: 4 NVSwitches)
 *   FAKE_NVML_BUSY_GPUS=g,...      GPUs that run one compute process
 *   FAKE_NVML_CALL_LATENCY_US=0    sleep per call, to model a driver round trip
 *   FAKE_NVML_CALL_LOG=path        rewrite "<function> <count>" lines there after each call
 *
 * Values, on the k-th nvmlDeviceGetFieldValues call for GPU g (k = 1, 2, ...), link l:
 *   THROUGHPUT_DATA_TX = (100*g + l + 1) * 1024 * k KiB, THROUGHPUT_DATA_RX = 2x that
 *   ERROR_DL_CRC (crc flit) = 10*g + l, CRC_DATA_ERROR_COUNT_L<l> = 10*g + l + 1 (links 0-11),
 *   ERROR_DL_REPLAY = l, ERROR_DL_RECOVERY = g, GET_SPEED = 26562 MBps (0 when down),
 *   GET_STATE = 1 active / 0 inactive, NVLINK_LINK_COUNT = the link count.
 * Built with -DFAKE_NVML_NO_PROCESSES_V3 it lacks nvmlDeviceGetComputeRunningProcesses_v3.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_UNKNOWN 999

#define NVML_VALUE_TYPE_UNSIGNED_INT 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3

#define FI_CRC_DATA_L0 39   /* ..44 for links 0-5 */
#define FI_CRC_DATA_L6 102  /* ..107 for links 6-11 */
#define FI_LINK_COUNT 91
#define FI_DATA_TX 138
#define FI_DATA_RX 139
#define FI_DL_REPLAY 161
#define FI_DL_RECOVERY 162
#define FI_DL_CRC 163
#define FI_GET_SPEED 164
#define FI_GET_STATE 165

#define NVLINK_DEVICE_TYPE_GPU 0
#define NVLINK_DEVICE_TYPE_SWITCH 2

#define MAX_GPUS 64
#define MAX_LINKS 36
#define MAX_RULES 256

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
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    int index;
    unsigned long long field_calls;
    int down[MAX_LINKS];
    int busy;
} fake_gpu_t;
typedef fake_gpu_t *nvmlDevice_t;

typedef struct {
    int field;
    int gpu;   /* -1 = any */
    int link;  /* -1 = any */
} unsupported_rule_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int gpu_count = 8;
static int link_count = 18;
static int lost_gpu = -1;
static unsigned long long lost_after;
static int remote_is_gpu;
static long latency_us;
static const char *call_log;
static fake_gpu_t gpus[MAX_GPUS];
static unsupported_rule_t rules[MAX_RULES];
static int rule_count;

/* --- call counting ---------------------------------------------------------------- */
#define MAX_NAMES 32
static const char *count_names[MAX_NAMES];
static unsigned long long count_values[MAX_NAMES];
static int count_used;

static void write_call_log(void) {
    if (!call_log) return;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", call_log);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (int i = 0; i < count_used; i++) fprintf(f, "%s %llu\n", count_names[i], count_values[i]);
    fclose(f);
    rename(tmp, call_log);
}

static void count_call(const char *name) {
    pthread_mutex_lock(&lock);
    int i;
    for (i = 0; i < count_used; i++)
        if (strcmp(count_names[i], name) == 0) break;
    if (i == count_used && count_used < MAX_NAMES) count_names[count_used++] = name;
    if (i < MAX_NAMES) count_values[i]++;
    write_call_log();
    pthread_mutex_unlock(&lock);
    if (latency_us > 0) usleep((useconds_t)latency_us);
}

/* Calls made so far to one function (name) or to all of them (NULL); for benchmarks. */
unsigned long long fakeNvmlCallCount(const char *name) {
    unsigned long long total = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < count_used; i++)
        if (!name || strcmp(count_names[i], name) == 0) total += count_values[i];
    pthread_mutex_unlock(&lock);
    return total;
}

/* --- configuration ---------------------------------------------------------------- */
static int env_int(const char *name, int fallback, int lo, int hi) {
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    int n = atoi(v);
    return n < lo ? lo : (n > hi ? hi : n);
}

static void parse_config(void) {
    memset(gpus, 0, sizeof gpus);
    gpu_count = env_int("FAKE_NVML_GPU_COUNT", 8, 0, MAX_GPUS);
    link_count = env_int("FAKE_NVML_LINK_COUNT", 18, 0, MAX_LINKS);
    latency_us = env_int("FAKE_NVML_CALL_LATENCY_US", 0, 0, 1000000);
    call_log = getenv("FAKE_NVML_CALL_LOG");
    const char *remote = getenv("FAKE_NVML_REMOTE");
    remote_is_gpu = remote && strcmp(remote, "gpu") == 0;
    for (int i = 0; i < MAX_GPUS; i++) gpus[i].index = i;

    char buf[4096];
    const char *v;
    if ((v = getenv("FAKE_NVML_DOWN_LINKS"))) {
        snprintf(buf, sizeof buf, "%s", v);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            int g, l;
            if (sscanf(tok, "%d:%d", &g, &l) == 2 && g >= 0 && g < MAX_GPUS && l >= 0 && l < MAX_LINKS)
                gpus[g].down[l] = 1;
        }
    }
    rule_count = 0;
    if ((v = getenv("FAKE_NVML_UNSUPPORTED"))) {
        snprintf(buf, sizeof buf, "%s", v);
        for (char *tok = strtok(buf, ","); tok && rule_count < MAX_RULES; tok = strtok(NULL, ",")) {
            unsupported_rule_t r = {-1, -1, -1};
            if (sscanf(tok, "%d:%d:%d", &r.field, &r.gpu, &r.link) >= 1) rules[rule_count++] = r;
        }
    }
    lost_gpu = -1;
    if ((v = getenv("FAKE_NVML_LOST_GPU"))) {
        int g, n;
        if (sscanf(v, "%d:%d", &g, &n) == 2) {
            lost_gpu = g;
            lost_after = (unsigned long long)n;
        }
    }
    if ((v = getenv("FAKE_NVML_BUSY_GPUS"))) {
        snprintf(buf, sizeof buf, "%s", v);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            int g = atoi(tok);
            if (g >= 0 && g < MAX_GPUS) gpus[g].busy = 1;
        }
    }
}

static int unsupported(int field, int gpu, int link) {
    for (int i = 0; i < rule_count; i++)
        if (rules[i].field == field && (rules[i].gpu < 0 || rules[i].gpu == gpu) &&
            (rules[i].link < 0 || rules[i].link == link))
            return 1;
    return 0;
}

/* --- lifecycle -------------------------------------------------------------------- */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    count_call("nvmlInitWithFlags");
    pthread_mutex_lock(&lock);
    if (initialized++ == 0) parse_config();
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    count_call("nvmlShutdown");
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = initialized ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialized) initialized--;
    pthread_mutex_unlock(&lock);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

/* Common checks for a device call: initialised, a valid handle, not lost. */
static nvmlReturn_t check_device(nvmlDevice_t device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || device < gpus || device >= gpus + gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->index == lost_gpu && device->field_calls >= lost_after) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

/* --- devices ---------------------------------------------------------------------- */
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    count_call("nvmlDeviceGetCount_v2");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    count_call("nvmlDeviceGetHandleByIndex_v2");
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned int)gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *text, char *out, unsigned int length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    count_call("nvmlDeviceGetName");
    nvmlReturn_t ret = check_device(device);
    return ret ? ret : copy_string("NVIDIA H200", name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    count_call("nvmlDeviceGetUUID");
    nvmlReturn_t ret = check_device(device);
    if (ret) return ret;
    char text[96];
    snprintf(text, sizeof text, "GPU-fa4e0000-0000-4000-8000-%012d", device->index);
    return copy_string(text, uuid, length);
}

/* The /dev/nvidia<minor> number: reversed against the NVML index, so a caller that confuses the two
 * (NVIDIA's DRA driver names GPUs gpu-<minor>) is caught. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    count_call("nvmlDeviceGetMinorNumber");
    nvmlReturn_t ret = check_device(device);
    if (ret) return ret;
    if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
    *minor = (unsigned int)(gpu_count - 1 - device->index);
    return NVML_SUCCESS;
}

/* HGX-style bus numbers for the GPUs; NVSwitches sit on buses 0x05-0x08. */
static const unsigned int gpu_buses[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

static void fill_pci(nvmlPciInfo_t *pci, unsigned int bus) {
    memset(pci, 0, sizeof *pci);
    pci->bus = bus;
    pci->pciDeviceId = 0x233510de;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", bus);
}

static unsigned int gpu_bus(int index) { return index < 8 ? gpu_buses[index] : 0xe0u + (unsigned int)index; }

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    count_call("nvmlDeviceGetPciInfo_v3");
    nvmlReturn_t ret = check_device(device);
    if (ret) return ret;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(pci, gpu_bus(device->index));
    return NVML_SUCCESS;
}

/* --- NVLink ----------------------------------------------------------------------- */
static nvmlReturn_t check_link(nvmlDevice_t device, unsigned int link) {
    nvmlReturn_t ret = check_device(device);
    if (ret) return ret;
    if (link >= (unsigned int)link_count) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *active) {
    count_call("nvmlDeviceGetNvLinkState");
    nvmlReturn_t ret = check_link(device, link);
    if (ret) return ret;
    if (!active) return NVML_ERROR_INVALID_ARGUMENT;
    *active = device->down[link] ? 0 : 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    count_call("nvmlDeviceGetNvLinkRemotePciInfo_v2");
    nvmlReturn_t ret = check_link(device, link);
    if (ret) return ret;
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->down[link]) return NVML_ERROR_NOT_SUPPORTED;
    if (remote_is_gpu)
        fill_pci(pci, gpu_bus((device->index + 1) % (gpu_count ? gpu_count : 1)));
    else
        fill_pci(pci, 0x05u + link % 4u);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, int *type) {
    count_call("nvmlDeviceGetNvLinkRemoteDeviceType");
    nvmlReturn_t ret = check_link(device, link);
    if (ret) return ret;
    if (!type) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->down[link]) return NVML_ERROR_NOT_SUPPORTED;
    *type = remote_is_gpu ? NVLINK_DEVICE_TYPE_GPU : NVLINK_DEVICE_TYPE_SWITCH;
    return NVML_SUCCESS;
}

static int crc_data_link(unsigned int field) {
    if (field >= FI_CRC_DATA_L0 && field < FI_CRC_DATA_L0 + 6) return (int)(field - FI_CRC_DATA_L0);
    if (field >= FI_CRC_DATA_L6 && field < FI_CRC_DATA_L6 + 6) return 6 + (int)(field - FI_CRC_DATA_L6);
    return -1;
}

static void fill_value(fake_gpu_t *gpu, nvmlFieldValue_t *v, long long now_us) {
    unsigned long long g = (unsigned long long)gpu->index, k = gpu->field_calls;
    int data_link = crc_data_link(v->fieldId);
    int link = data_link >= 0 ? data_link : (int)v->scopeId;
    v->timestamp = now_us;
    v->latencyUsec = 3;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->value.ullVal = 0;
    if (unsupported((int)v->fieldId, gpu->index, v->fieldId == FI_LINK_COUNT ? -1 : link)) {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        return;
    }
    if (v->fieldId == FI_LINK_COUNT) {
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = (unsigned int)link_count;
        v->nvmlReturn = NVML_SUCCESS;
        return;
    }
    if (link < 0 || link >= link_count) {
        v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        return;
    }
    unsigned long long l = (unsigned long long)link;
    v->nvmlReturn = NVML_SUCCESS;
    if (data_link >= 0) {
        v->value.ullVal = 10 * g + l + 1;
        return;
    }
    switch (v->fieldId) {
    case FI_DATA_TX: v->value.ullVal = (100 * g + l + 1) * 1024 * k; break;
    case FI_DATA_RX: v->value.ullVal = 2 * (100 * g + l + 1) * 1024 * k; break;
    case FI_DL_CRC: v->value.ullVal = 10 * g + l; break;
    case FI_DL_REPLAY: v->value.ullVal = l; break;
    case FI_DL_RECOVERY: v->value.ullVal = g; break;
    case FI_GET_SPEED:
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = gpu->down[link] ? 0 : 26562;
        break;
    case FI_GET_STATE:
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.uiVal = gpu->down[link] ? 0 : 1;
        break;
    default: v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    count_call("nvmlDeviceGetFieldValues");
    nvmlReturn_t ret = check_device(device);
    if (ret) return ret;
    if (count < 0 || (count > 0 && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    device->field_calls++;
    pthread_mutex_unlock(&lock);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    long long now_us = (long long)tv.tv_sec * 1000000LL + tv.tv_usec;
    for (int i = 0; i < count; i++) fill_value(device, &values[i], now_us);
    return NVML_SUCCESS;
}

/* --- processes -------------------------------------------------------------------- */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
    nvmlReturn_t ret = check_device(device);
    if (ret) return ret;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int needed = device->busy ? 1u : 0u;
    if (*count < needed) {
        *count = needed;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = needed;
    if (needed) {
        if (!infos) return NVML_ERROR_INVALID_ARGUMENT;
        infos[0].pid = 4200u + (unsigned int)device->index;
        infos[0].usedGpuMemory = 1ULL << 30;
        infos[0].gpuInstanceId = 0xFFFFFFFFu;
        infos[0].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_NO_PROCESSES_V3
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
    count_call("nvmlDeviceGetComputeRunningProcesses_v3");
    return running_processes(device, count, infos);
}
#endif

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos) {
    count_call("nvmlDeviceGetComputeRunningProcesses_v2");
    return running_processes(device, count, infos);
}
